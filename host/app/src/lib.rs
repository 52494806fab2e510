//! The app layer: every product operation (append messages and decide on a refresh, import a
//! transcript, context, status, reset, jobs and their workers, tokens, events), once, for every
//! front end. It knows nothing of clap, exit codes, terminals or HTTP: the CLI and the server
//! are thin shells that turn its results and [`AppError`] kinds into their own output.
//!
//! All data access goes through a [`Scoped`] handle for one tenant, which sees the store only
//! through the store bound to it (`AppStore::for_tenant`): a foreign session or job id is
//! simply not found.
#![deny(missing_docs)]

use abridge_backend as backend;
use abridge_engine::{clock, control, runtime, text, types};
use abridge_store as store;
use abridge_store::{crypto, tenant};

pub mod backfill;
pub mod db;
pub mod error;
pub mod events;
pub mod hook;
mod import;
mod job_views;
pub mod jobs;
pub mod limits;
pub mod memories;
mod messages;
pub mod naming;
mod pure;
mod run;
mod sessions;
pub mod setup;
pub mod sources;
mod token_views;
pub mod tokens;
pub mod transcript;
mod views;
pub mod walk;
pub mod watch;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

pub use error::{AppError, AppResult, ErrorKind};
pub use events::{Event, EventBus, What};
pub use import::{
    Bring, ConversationImport, Import, ImportError, ImportRequest, SourceFile, one_session,
};
pub use limits::{Ceiling, Limits, ModelMetrics};
pub use messages::{ContextAsk, InlineAppend, MIN_CONTEXT_BUDGET, Reason};
pub use pure::Pure;
pub use tokens::{Grant, TokenInfo, Tokens};
pub use views::{
    Appended, ContextParts, ContextView, CoverageView, EpisodeView, ExpansionView, FactEndView,
    FactValueView, FactView, Imported, JobView, LeaseView, LedgerView, MessageIn, MessageView,
    MessagesView, RemovedView, SearchHitView, SearchView, SessionView, SourceMarkView, StableView,
    SummaryView, state_name,
};
pub use worker::Workers;

/// The engine's types a front end names (configuration, errors, reports, the clock, progress,
/// the compiled guest). A front end has no engine dependency of its own: it cannot build an
/// engine or reach a store except through this layer.
pub mod engine {
    pub use abridge_engine::runtime::{
        EMBEDDED_COMPONENT, EMBEDDED_SHA256, WIT_FILES, embedded_sha256, export_names,
    };
    pub use abridge_engine::{CallError, Clock, Progress, Runtime, SystemClock, text, types};
}

pub use abridge_store::crypto::Secret;
pub use abridge_store::tenant::Tenant;

/// The work this process has done below the app, counted: guest instances (every call into
/// the component) and store calls (transactions and statements), for `/metrics` and the
/// benches.
pub fn work_done() -> (u64, u64) {
    (
        abridge_engine::runtime::instances(),
        abridge_store::store_calls(),
    )
}

use crate::backend::LlmBackend;
use crate::clock::Clock;
use crate::jobs::{Job, Jobs};
use crate::runtime::{Abridge, Runtime};
use crate::sources::SessionMode;
use crate::store::{AppStore, Store};

/// Messages indexed per transaction when older sessions are brought into the full-text index.
pub const INDEX_BATCH: u32 = 500;

/// Most hits one search page holds (the guest's page limit).
pub const SEARCH_MAX_LIMIT: u32 = 100;

/// Deepest a search pages (its offset): a query whose answer lies further is too broad.
pub const SEARCH_MAX_OFFSET: u32 = 1000;

/// Longest focus instruction a session may carry (characters): it goes into every fold prompt.
pub const MAX_FOCUS_CHARS: usize = 500;
use crate::types::{Config, ContextRequest, FreshState, FreshnessReport, Level, NewEpisode};

/// A log sink for engine messages.
pub type LogFn = Arc<dyn Fn(Level, &str) + Send + Sync>;

/// A configuration with a session's own mode and focus laid over it, made only by
/// [`Scoped::for_session`] (or [`Scoped::session_config`]): the only kind a verdict or a job
/// takes, so no front end can start a fold without the session's settings.
#[derive(Clone, Debug)]
pub struct SessionConfig(Config);

impl std::ops::Deref for SessionConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.0
    }
}

/// Everything an [`App`] is opened with (resolved by the front end: flags, environment, file).
#[derive(Clone)]
pub struct AppConfig {
    /// The SQLite database file.
    pub db: PathBuf,
    /// Engine settings, with `engine` and `rendering` final for the chosen backend.
    pub config: Config,
    /// The model backend (the extractive engine uses [`crate::NoModel`]).
    pub llm: Arc<dyn LlmBackend>,
    /// The backend's name for output (`ollama`, `openai`, `extractive`).
    pub backend_name: String,
    /// Model requests one engine call keeps in flight in a batch.
    pub batch_concurrency: usize,
    /// How long a job's lease lasts without a heartbeat.
    pub job_lease: Duration,
    /// The clock (the only source of time).
    pub clock: Arc<dyn Clock>,
    /// The compiled engine component.
    pub runtime: Arc<Runtime>,
    /// Where engine log lines go.
    pub log: LogFn,
    /// Per-tenant guards.
    pub limits: Limits,
    /// Events kept per tenant for reconnecting subscribers.
    pub events_kept: usize,
    /// Memory and cluster settings.
    pub memory: crate::types::MemoryConfig,
    /// The embedding backend for memories (`None`: the offline lexical embedder only).
    pub embedder: Option<Arc<dyn crate::backend::embedding::Embedder>>,
    /// The master key sealing memory and summary text at rest (`None`: stored plaintext,
    /// marked as such).
    pub master_key: Option<crate::crypto::Secret>,
    /// Seal stored vectors too (with a master key): search then opens each vector it ranks.
    pub seal_vectors: bool,
}

struct TenantState {
    engine: Arc<Abridge>,
    bucket: Mutex<Option<limits::Bucket>>,
    /// Cluster summaries running for the tenant.
    clusters: Arc<Semaphore>,
}

struct Inner {
    cfg: AppConfig,
    db: Arc<dyn AppStore>,
    jobs: Jobs,
    tokens: Tokens,
    events: EventBus,
    model: Arc<ModelMetrics>,
    model_global: Arc<Semaphore>,
    /// Model request slots shared with the other instances on the store, when it is shared.
    slots: Option<Arc<limits::SharedSlots>>,
    tenants: Mutex<BTreeMap<Tenant, Arc<TenantState>>>,
    /// Wakes the workers when a job is queued.
    wake: Notify,
    /// Set when the service stops taking work.
    draining: AtomicBool,
    /// Whether recall's saved indexes are loaded (false while [`App::start_warming`] runs).
    warm: tokio::sync::watch::Sender<bool>,
    /// Whether messages stored before the full-text index are still being indexed.
    indexing: AtomicBool,
    /// Numbers messages posted without a client id.
    seq: AtomicU64,
    /// Random, per opening: ids made here differ from those of another process.
    instance: String,
    /// When the periodic sweeper last swept each tenant (app clock, ms).
    swept: Mutex<BTreeMap<String, u64>>,
}

impl Drop for Inner {
    /// The last handle is gone (a command ends): what was published is written first.
    fn drop(&mut self) {
        self.events.flush_blocking(Duration::from_secs(5));
    }
}

/// The application: open once, share (it is cheap to clone).
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

impl App {
    /// Open the database (creating or migrating it) and get ready.
    pub fn open(cfg: AppConfig) -> AppResult<App> {
        // A SQLite file, or a postgres:// URL: a database several instances share.
        let db = crate::store::open_store(&cfg.db, cfg.master_key.as_ref(), cfg.seal_vectors)?;
        Self::open_with(cfg, db)
    }

    /// The app over a database in memory that keeps nothing: a dry run imports and plans there,
    /// by the same rules as a real run.
    pub fn open_in_memory(cfg: AppConfig) -> AppResult<App> {
        Self::open_with(cfg, crate::db::in_memory()?)
    }

    /// Get ready over a store of the caller's choosing (`cfg.db` is then only a name):
    /// a SQLite store in memory for tests and embedders that keep nothing, or any other
    /// [`AppStore`].
    pub fn open_with(cfg: AppConfig, db: Arc<dyn AppStore>) -> AppResult<App> {
        let jobs = Jobs::new(db.clone(), cfg.job_lease)
            .with_clock(cfg.clock.clone())
            .with_retention(cfg.limits.job_retention, cfg.limits.job_retention_count);
        let slots = db.slots_shared().then(|| {
            Arc::new(limits::SharedSlots {
                store: db.clone(),
                owner: jobs.owner().to_string(),
                clock: cfg.clock.clone(),
                lease_ms: 30_000,
            })
        });
        // This instance's slots are renewed while it lives; a dead one's run out.
        if let (Some(s), Ok(h)) = (&slots, tokio::runtime::Handle::try_current()) {
            let s = Arc::downgrade(s);
            h.spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let Some(s) = s.upgrade() else { return };
                    let _ = s
                        .store
                        .slot_renew(&s.owner, s.clock.now_ms() + s.lease_ms)
                        .await;
                }
            });
        }
        Ok(App {
            inner: Arc::new(Inner {
                jobs,
                tokens: Tokens::new(db.clone()),
                events: EventBus::new(cfg.events_kept, db.clone(), cfg.log.clone()),
                model: Arc::new(ModelMetrics::default()),
                model_global: Arc::new(Semaphore::new(cfg.limits.model_total.max(1))),
                slots,
                tenants: Mutex::new(BTreeMap::new()),
                wake: Notify::new(),
                draining: AtomicBool::new(false),
                warm: tokio::sync::watch::Sender::new(true),
                indexing: AtomicBool::new(false),
                seq: AtomicU64::new(0),
                swept: Mutex::new(BTreeMap::new()),
                instance: {
                    let mut raw = [0u8; 6];
                    getrandom::fill(&mut raw).map_err(|e| {
                        AppError::new(ErrorKind::Internal, format!("no random numbers: {e}"))
                    })?;
                    raw.iter().map(|b| format!("{b:02x}")).collect()
                },
                db,
                cfg,
            }),
        })
    }

    /// Everything the app keeps (the engine's store and the app's tables), untenanted.
    pub(crate) fn store(&self) -> Arc<dyn AppStore> {
        self.inner.db.clone()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &AppConfig {
        &self.inner.cfg
    }

    /// The job table (unscoped: for workers).
    pub(crate) fn jobs(&self) -> &Jobs {
        &self.inner.jobs
    }

    /// How many jobs the table holds in each state (every tenant's: for readiness checks and
    /// metrics).
    pub async fn job_counts(&self) -> AppResult<Vec<(String, u64)>> {
        Ok(self.inner.jobs.counts().await?)
    }

    /// API tokens.
    pub fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }

    /// The event bus.
    pub fn events(&self) -> &EventBus {
        &self.inner.events
    }

    /// Model call figures.
    pub fn model_metrics(&self) -> &ModelMetrics {
        &self.inner.model
    }

    /// Now, from the clock.
    pub fn now_ms(&self) -> u64 {
        self.inner.cfg.clock.now_ms()
    }

    /// An id no other message gets: the time, this opening's random part and a count.
    pub fn unique_id(&self) -> String {
        let n = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        format!("m{}-{}-{n}", self.now_ms(), self.inner.instance)
    }

    /// Stop taking new jobs (workers finish or release what they hold).
    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
        self.inner.wake.notify_waiters();
    }

    /// Whether [`App::drain`] was called.
    pub fn draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Load the recall indexes the last run saved, in the background, so the first recall
    /// after a restart costs what the others do (a service calls this as it starts; until
    /// it is done, [`App::warming`] is true).
    pub fn start_warming(&self) {
        self.inner.warm.send_replace(false);
        let app = self.clone();
        tokio::spawn(async move {
            match app.inner.db.warm().await {
                Ok(n) => tracing::info!(indexes = n, "recall indexes loaded"),
                Err(e) => {
                    tracing::warn!(error = %e, "loading the saved recall indexes failed; each is built again at its tenant's first recall")
                }
            }
            app.inner.warm.send_replace(true);
        });
    }

    /// Index, in batches of [`INDEX_BATCH`], the messages of sessions stored before the
    /// full-text index existed (a database that migration 34 / 13 brought up to date); each
    /// batch is one transaction, its terms from the guest. `progress(done, total)` follows
    /// each batch. Returns the messages indexed (0 at once when none wait). Sessions stored
    /// since are indexed as their messages arrive.
    pub async fn index_pending(
        &self,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> AppResult<u64> {
        let db = &self.inner.db;
        let (_, total) = db.unindexed().await?;
        if total == 0 {
            return Ok(0);
        }
        self.inner.indexing.store(true, Ordering::SeqCst);
        let engine = self.state(&Tenant::local()).engine.clone();
        let result = async {
            let mut done = 0u64;
            while let Some((tenant, session)) = db.next_unindexed().await? {
                // Each session through its tenant's view (whose data key opens its text).
                let view = db.for_tenant(&tenant);
                let mut after = 0;
                loop {
                    let page = view.episodes_after(&session, after, INDEX_BATCH).await?;
                    let last = page.len() < INDEX_BATCH as usize;
                    let texts: Vec<(Option<String>, String)> = page
                        .iter()
                        .map(|e| (e.speaker.clone(), e.content.clone()))
                        .collect();
                    let terms = engine.index_terms(&texts).await?;
                    let docs: Vec<(u64, String)> = page.iter().map(|e| e.id).zip(terms).collect();
                    view.index_episodes(&session, &docs, last).await?;
                    after = page.last().map_or(after, |e| e.id);
                    done += page.len() as u64;
                    progress(done.min(total), total);
                    if last {
                        break;
                    }
                }
            }
            Ok::<u64, AppError>(done)
        }
        .await;
        self.inner.indexing.store(false, Ordering::SeqCst);
        result
    }

    /// [`App::index_pending`] in the background, logging its progress (a service calls this
    /// as it starts; searches meanwhile say they are not complete).
    pub fn start_indexing(&self) {
        let app = self.clone();
        tokio::spawn(async move {
            let step = AtomicU64::new(0);
            let log = |done: u64, total: u64| {
                // About every tenth of the way.
                let tenth = done * 10 / total.max(1);
                if step.swap(tenth, Ordering::Relaxed) != tenth {
                    tracing::info!(done, total, "indexing stored messages for full-text search");
                }
            };
            match app.index_pending(&log).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(messages = n, "stored messages indexed for full-text search")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "indexing stored messages for full-text search failed; the next start tries again")
                }
            }
        });
    }

    /// Whether messages stored before the full-text index are still being indexed.
    pub fn indexing(&self) -> bool {
        self.inner.indexing.load(Ordering::SeqCst)
    }

    /// Whether the recall indexes started by [`App::start_warming`] are still loading.
    pub fn warming(&self) -> bool {
        !*self.inner.warm.borrow()
    }

    /// Resolves once the recall indexes are loaded (at once when none are loading).
    pub async fn warmed(&self) {
        let _ = self.inner.warm.subscribe().wait_for(|w| *w).await;
    }

    fn state(&self, t: &Tenant) -> Arc<TenantState> {
        let mut map = self.inner.tenants.lock().expect("tenant map lock");
        map.entry(t.clone())
            .or_insert_with(|| {
                let c = &self.inner.cfg;
                let mut guarded = limits::Guarded::new(
                    c.llm.clone(),
                    Arc::new(Semaphore::new(c.limits.model_per_tenant.max(1))),
                    self.inner.model_global.clone(),
                    self.inner.model.clone(),
                );
                let bound = self.inner.db.for_tenant(t);
                guarded = guarded.counting(
                    bound.clone() as Arc<dyn crate::store::RecallStore>,
                    t.name(),
                    c.clock.clone(),
                );
                if let Some(slots) = &self.inner.slots {
                    guarded = guarded.shared(
                        slots.clone(),
                        t.name(),
                        c.limits.model_per_tenant.max(1),
                        c.limits.model_total.max(1),
                    );
                }
                let llm: Arc<dyn LlmBackend> = Arc::new(guarded);
                let store: Arc<dyn Store> = bound.clone();
                let log = c.log.clone();
                let engine = Abridge::builder()
                    .runtime(c.runtime.clone())
                    .memories(
                        bound as Arc<dyn crate::store::RecallStore>,
                        t.name(),
                        c.embedder.clone(),
                    )
                    .store(store)
                    .llm(llm)
                    .clock(c.clock.clone())
                    .batch_concurrency(c.batch_concurrency)
                    .log(move |l, m| log(l, m))
                    .build()
                    .expect("a runtime and a store are given, so building cannot fail");
                Arc::new(TenantState {
                    engine: Arc::new(engine),
                    bucket: Mutex::new(
                        (c.limits.requests_per_sec > 0)
                            .then(|| limits::Bucket::new(c.limits.requests_per_sec)),
                    ),
                    clusters: Arc::new(Semaphore::new(
                        c.limits
                            .cluster_jobs_per_tenant
                            .clamp(1, Semaphore::MAX_PERMITS),
                    )),
                })
            })
            .clone()
    }

    /// One tenant's handle.
    pub fn tenant(&self, t: &Tenant) -> Scoped {
        Scoped {
            app: self.clone(),
            tenant: t.clone(),
            tables: self.inner.db.for_tenant(t),
            state: self.state(t),
            read_only: false,
        }
    }

    /// The local tenant's handle (the CLI's).
    pub fn local(&self) -> Scoped {
        self.tenant(&Tenant::local())
    }
}

/// One tenant's view of the app. Every operation is scoped to the tenant.
#[derive(Clone)]
pub struct Scoped {
    app: App,
    tenant: Tenant,
    /// The store bound to the tenant: every call of the handle goes through it.
    tables: Arc<dyn AppStore>,
    state: Arc<TenantState>,
    /// A read-only caller's handle: reads never queue model work.
    read_only: bool,
}

/// Check a session id sent by a caller.
fn check_session(session: &str) -> AppResult<()> {
    crate::text::check_session_id(session).map_err(AppError::invalid)
}

impl Scoped {
    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// This handle for a caller who may only read (a read-only token): a read that finds a
    /// refresh due says so but never queues it, so such a caller never causes model spend.
    pub fn reading_only(mut self) -> Scoped {
        self.read_only = true;
        self
    }

    /// The app this handle belongs to (inside the app layer only: a tenant's handle never
    /// hands a front end the whole app).
    pub(crate) fn app(&self) -> &App {
        &self.app
    }

    /// This tenant's events: those retained after `after`, then the live ones.
    pub async fn subscribe(&self, after: Option<u64>) -> events::Subscription {
        self.app.events().subscribe(&self.tenant, after).await
    }

    /// Wait until every event published so far is written and sent to subscribers.
    pub async fn flush_events(&self) {
        self.app.events().flush().await
    }

    /// Bring the messages stored before the full-text index existed into it (see
    /// [`App::index_pending`]; the index is the database's, so this serves every tenant), so
    /// that a search finds them.
    pub async fn index_pending(
        &self,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> AppResult<u64> {
        self.app.index_pending(progress).await
    }

    /// Whether text is sealed at rest (a master key is set).
    pub fn sealed(&self) -> bool {
        self.app.config().master_key.is_some()
    }

    /// The configuration a session without its own settings runs with.
    pub fn default_config(&self) -> &Config {
        &self.app.config().config
    }

    /// The tenant's engine (its store is the tenant's view).
    pub(crate) fn engine(&self) -> &Arc<Abridge> {
        &self.state.engine
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.state.engine.store()
    }

    /// Count one request against the tenant's rate; `Err` says when to retry.
    pub fn admit(&self) -> AppResult<()> {
        let mut b = self.state.bucket.lock().expect("bucket lock");
        match b.as_mut().map(|b| b.take()) {
            Some(Err(secs)) => Err(AppError::new(
                ErrorKind::RateLimited {
                    retry_after_secs: secs,
                },
                format!(
                    "tenant '{}' is over its limit of {} requests per second",
                    self.tenant, self.app.inner.cfg.limits.requests_per_sec
                ),
            )),
            _ => Ok(()),
        }
    }

    fn publish(&self, what: What, session: Option<&str>, job: Option<u64>) {
        self.app
            .inner
            .events
            .publish(&self.tenant, &what, self.app.now_ms(), session, job);
    }

    /// Refuse `what` to a read-only caller (the server's middleware refuses its writes before
    /// they get here; other front ends meet this).
    fn writing(&self, what: &str) -> AppResult<()> {
        if self.read_only {
            return Err(AppError::new(
                ErrorKind::Forbidden,
                format!("a read-only token cannot {what}"),
            )
            .hint("use a token created without --read-only"));
        }
        Ok(())
    }
}
