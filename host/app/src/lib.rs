//! The app layer: every product operation (append messages and decide on a refresh, import a
//! transcript, context, status, reset, jobs and their workers, tokens, events), once, for every
//! front end. It knows nothing of clap, exit codes, terminals or HTTP: the CLI and the server
//! are thin shells that turn its results and [`AppError`] kinds into their own output.
//!
//! All data access goes through a [`Scoped`] handle for one tenant, which sees the store only
//! through a [`TenantStore`]: a foreign session or job id is simply not found.
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
pub mod jobs;
pub mod limits;
pub mod memories;
pub mod naming;
mod run;
pub mod setup;
pub mod sources;
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
pub use tokens::{Grant, TokenInfo, Tokens};
pub use views::{
    Appended, ContextParts, ContextView, CoverageView, EpisodeView, ExpansionView, Imported,
    JobView, LeaseView, LedgerView, MessageIn, MessageView, MessagesView, RemovedView,
    SearchHitView, SearchView, SessionView, SourceMarkView, StableView, SummaryView, state_name,
};
pub use worker::Workers;

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
use crate::tenant::{TenantStore, TenantTables};

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
            while let Some(session) = db.next_unindexed().await? {
                let mut after = 0;
                loop {
                    let page = db.episodes_after(&session, after, INDEX_BATCH).await?;
                    let last = page.len() < INDEX_BATCH as usize;
                    let texts: Vec<(Option<String>, String)> = page
                        .iter()
                        .map(|e| (e.speaker.clone(), e.content.clone()))
                        .collect();
                    let terms = engine.index_terms(&texts).await?;
                    let docs: Vec<(u64, String)> = page.iter().map(|e| e.id).zip(terms).collect();
                    db.index_episodes(&session, &docs, last).await?;
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
                guarded = guarded.counting(
                    self.inner.db.clone() as Arc<dyn crate::store::RecallStore>,
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
                let store: Arc<dyn Store> =
                    Arc::new(TenantStore::new(self.inner.db.clone(), t.clone()));
                let log = c.log.clone();
                let engine = Abridge::builder()
                    .runtime(c.runtime.clone())
                    .memories(
                        self.inner.db.clone() as Arc<dyn crate::store::RecallStore>,
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
            tables: TenantTables::new(self.inner.db.clone(), t.clone()),
            state: self.state(t),
            read_only: false,
        }
    }

    /// The local tenant's handle (the CLI's).
    pub fn local(&self) -> Scoped {
        self.tenant(&Tenant::local())
    }
}

/// What [`Scoped::append_inline`] did.
#[derive(Debug)]
pub struct InlineAppend {
    /// Episodes stored (the rest were already there).
    pub stored: u32,
    /// Summary rows the refresh wrote or extended (0 when none was due).
    pub passes: u32,
    /// Summary rows written or extended.
    pub written: Vec<crate::types::SummaryRow>,
    /// Why a due refresh failed.
    pub failure: Option<AppError>,
}

/// The smallest context budget (tokens): what holds one message.
pub const MIN_CONTEXT_BUDGET: u32 = 16;

/// What a context read asks for ([`Scoped::context`]), with every front end's defaults
/// written here once: `ContextAsk { query, ..ContextAsk::new(budget) }`.
#[derive(Clone, Copy, Debug)]
pub struct ContextAsk<'a> {
    /// Tokens the context may take (at least [`MIN_CONTEXT_BUDGET`]).
    pub budget: u32,
    /// Recent message pairs kept verbatim.
    pub pairs: u32,
    /// A refresh is due when more than this many messages lie beyond the summary
    /// (`u32::MAX`: only when the session's mode says so).
    pub refresh_after: u32,
    /// Wait up to this long for a due refresh first (`None`: never wait).
    pub wait: Option<Duration>,
    /// What the next call is about (usually the user's newest message): the earlier turns
    /// that best match it are included verbatim.
    pub query: Option<&'a str>,
}

impl ContextAsk<'_> {
    /// The budget when none is given.
    pub const DEFAULT_BUDGET: u32 = 2000;
    /// The recent pairs kept verbatim when none are given.
    pub const DEFAULT_PAIRS: u32 = 4;
    /// The messages beyond the summary a context waits for before a refresh is due.
    pub const DEFAULT_REFRESH_AFTER: u32 = 8;

    /// A context of `budget` tokens with the other defaults.
    pub fn new(budget: u32) -> Self {
        ContextAsk {
            budget,
            pairs: Self::DEFAULT_PAIRS,
            refresh_after: Self::DEFAULT_REFRESH_AFTER,
            wait: None,
            query: None,
        }
    }

    /// Whether the ask can be answered (a front end may check it before it opens anything).
    pub fn check(&self) -> AppResult<()> {
        if self.budget < MIN_CONTEXT_BUDGET {
            return Err(AppError::invalid(format!(
                "budget {} is too small to hold a message; give at least {MIN_CONTEXT_BUDGET} tokens",
                self.budget
            )));
        }
        Ok(())
    }
}

impl Default for ContextAsk<'_> {
    fn default() -> Self {
        ContextAsk::new(Self::DEFAULT_BUDGET)
    }
}

/// Why the due rule ([`Scoped::due`]) is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Messages arrived (posted, ingested, watched or uploaded): the mode's trigger, and the
    /// fold point it names.
    Append,
    /// A user asked for a summary (`summarize`, `backfill`, a refresh, an upgrade): every
    /// episode beyond the chain, and offline rows the model rewrites.
    Asked,
}

/// One tenant's view of the app. Every operation is scoped to the tenant.
#[derive(Clone)]
pub struct Scoped {
    app: App,
    tenant: Tenant,
    /// The tenant's view of the app's tables: every session-keyed call goes through it.
    tables: TenantTables,
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

    /// The app this handle belongs to.
    pub fn app(&self) -> &App {
        &self.app
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

    /// The engine configuration for a session: the global one with the session's own mode
    /// and focus.
    pub async fn session_config(&self, session: &str) -> AppResult<SessionConfig> {
        self.for_session(session, &self.app.inner.cfg.config).await
    }

    /// `base` (a front end's configuration: its backend, model, budgets) with the session's own
    /// mode and focus: the only configuration a verdict or a job takes, so which session
    /// settings a fold honours is not a front end's choice (`abridge refresh` folds with the
    /// session's focus as `POST …/refresh` does).
    pub async fn for_session(&self, session: &str, base: &Config) -> AppResult<SessionConfig> {
        let own = self.tables.session_mode(session).await?;
        let mut cfg = crate::sources::with_mode(base, own.as_ref());
        if let Some(focus) = self.tables.session_focus(session).await? {
            cfg.focus = focus;
        }
        Ok(SessionConfig(cfg))
    }

    /// Set (`Some`) or clear (`None`) a session's focus instructions (added to every fold
    /// prompt); the session's focus now, if any.
    pub async fn set_focus(&self, session: &str, focus: Option<&str>) -> AppResult<Option<String>> {
        self.known(session).await?;
        let focus = focus.map(str::trim).filter(|f| !f.is_empty());
        if let Some(f) = focus
            && f.chars().count() > MAX_FOCUS_CHARS
        {
            return Err(AppError::invalid(format!(
                "the focus is {} characters; keep it under {MAX_FOCUS_CHARS} (it goes into every fold prompt)",
                f.chars().count()
            )));
        }
        self.tables.set_session_focus(session, focus).await?;
        Ok(self.tables.session_focus(session).await?)
    }

    /// The session's focus instructions, if any.
    pub async fn focus(&self, session: &str) -> AppResult<Option<String>> {
        self.known(session).await?;
        Ok(self.tables.session_focus(session).await?)
    }

    /// Pin (`true`) or unpin an episode: a pinned episode is in every context verbatim
    /// (within the budget), whatever its age. Returns the session's pins.
    pub async fn pin(&self, session: &str, episode: u64, pinned: bool) -> AppResult<Vec<u64>> {
        let stats = self.known(session).await?;
        if pinned && (episode == 0 || episode > stats.last_episode) {
            return Err(AppError::not_found(format!(
                "session '{session}' has episodes 1-{}; there is no episode {episode} to pin",
                stats.last_episode
            )));
        }
        self.tables.set_pin(session, episode, pinned).await?;
        Ok(self.tables.pins(session).await?)
    }

    /// The session's pinned episodes.
    pub async fn pins(&self, session: &str) -> AppResult<Vec<u64>> {
        self.known(session).await?;
        Ok(self.tables.pins(session).await?)
    }

    /// Every summary row of a session, compacted ones included.
    pub async fn summary_history(&self, session: &str) -> AppResult<Vec<SummaryView>> {
        self.known(session).await?;
        Ok(self
            .engine()
            .history(session)
            .await?
            .iter()
            .map(SummaryView::from)
            .collect())
    }

    /// Provenance: summary row `row` and exactly the episodes it covers (a page of `limit`
    /// after `after`), or with `identifier` the episode that ledger entry came from. An
    /// unknown row is [`ErrorKind::NotFound`].
    pub async fn expand(
        &self,
        session: &str,
        row: u64,
        identifier: Option<&str>,
        after: u64,
        limit: u32,
    ) -> AppResult<views::ExpansionView> {
        self.known(session).await?;
        match self
            .engine()
            .expand(session, row, identifier, after, limit)
            .await
        {
            Ok(x) => Ok(views::ExpansionView::from(&x)),
            Err(crate::runtime::CallError::Engine(crate::types::Error::InvalidInput(m))) => {
                Err(AppError::not_found(m))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn publish(&self, what: What, session: Option<&str>, job: Option<u64>) {
        self.app
            .inner
            .events
            .publish(&self.tenant, &what, self.app.now_ms(), session, job);
    }

    /// The last episode the session's summary chain covers (0 without a summary).
    async fn covered(&self, session: &str) -> AppResult<u64> {
        Ok(self
            .store()
            .latest_summary(session)
            .await?
            .map_or(0, |r| r.last_episode))
    }

    /// The one due rule: the episode a refresh of `session` under `cfg` must bring it to, or
    /// `None` when nothing is due, for `reason`. Every decision to queue or run a refresh
    /// asks here; the verdicts are the guest's.
    pub async fn due(
        &self,
        session: &str,
        cfg: &SessionConfig,
        reason: Reason,
    ) -> AppResult<Option<u64>> {
        Ok(self.verdict(session, cfg, reason).await?.0)
    }

    /// [`Scoped::due`]'s answer, and the session's episode count the verdict saw.
    async fn verdict(
        &self,
        session: &str,
        cfg: &SessionConfig,
        reason: Reason,
    ) -> AppResult<(Option<u64>, u64)> {
        let f = match reason {
            Reason::Append => self.engine().freshness(session, cfg).await?,
            Reason::Asked => {
                let stats = self.store().stats(session).await?;
                let last = stats.last_episode;
                if last > self.covered(session).await? {
                    return Ok((Some(last), stats.episodes));
                }
                // Everything is covered: rows the offline summarizer wrote that `cfg`'s model
                // rewrites (the guest's count) are the work.
                let f = self.engine().freshness(session, cfg).await?;
                return Ok(((f.fallback_rows > 0).then_some(last), stats.episodes));
            }
        };
        Ok((
            (f.state == FreshState::Due).then_some(f.fold_upto),
            f.episodes,
        ))
    }

    /// A session's figures; an unknown session is [`ErrorKind::NotFound`].
    async fn known(&self, session: &str) -> AppResult<crate::types::SessionStats> {
        check_session(session)?;
        let stats = self.store().stats(session).await?;
        if stats.episodes == 0 {
            return Err(AppError::not_found(format!("no session '{session}'")));
        }
        Ok(stats)
    }

    /// Remember that `session` held `last_episode` episodes after importing the first `bytes`
    /// bytes of the file `source`, so a summary can say how far into its file it reaches.
    pub async fn mark_source(
        &self,
        session: &str,
        source: &str,
        last_episode: u64,
        bytes: u64,
    ) -> AppResult<()> {
        Ok(self
            .tables
            .record_mark(session, source, last_episode, bytes)
            .await?)
    }

    /// How far into its file a summary ending at `last_episode` reaches (when the session
    /// came from one).
    pub async fn source_mark(
        &self,
        session: &str,
        last_episode: u64,
    ) -> AppResult<Option<crate::sources::Mark>> {
        Ok(self.tables.mark_covering(session, last_episode).await?)
    }

    /// Whether a live worker (here or in another process) is running a job of `session`.
    pub async fn session_busy(&self, session: &str) -> AppResult<bool> {
        Ok(self
            .app
            .inner
            .jobs
            .session_busy(&self.tables, session)
            .await?)
    }

    /// A session's standing.
    pub async fn session(&self, session: &str) -> AppResult<SessionView> {
        let stats = self.known(session).await?;
        self.view(session, stats).await
    }

    /// The view of a session whose figures were just read.
    async fn view(
        &self,
        session: &str,
        stats: crate::types::SessionStats,
    ) -> AppResult<SessionView> {
        let own = self.tables.session_mode(session).await?;
        let cfg = crate::sources::with_mode(&self.app.inner.cfg.config, own.as_ref());
        let f = self.engine().freshness(session, &cfg).await?;
        let active = self.active_job(session).await?;
        let history = stats.total_tokens;
        let chain: u64 = self
            .store()
            .summaries(session)
            .await?
            .iter()
            .map(|r| u64::from(r.tokens))
            .sum();
        let mut v = SessionView::new(
            session,
            &f,
            (cfg.mode, own.is_some()),
            active.map(|j| j.id),
            (history, chain),
        );
        (v.title, v.project) = self.label(session).await?;
        Ok(v)
    }

    /// Sessions, most recently changed first, `limit` from `offset`; and the total. With
    /// `search`, only sessions whose id, title or project folder contains it (ignoring case).
    /// Only this tenant's part of the store is read: a page from its index; a search from its
    /// trigram index (the sessions holding the query's rarest trigrams), each candidate checked
    /// against its id and opened names.
    pub async fn sessions(
        &self,
        offset: usize,
        limit: usize,
        search: Option<&str>,
    ) -> AppResult<(Vec<SessionView>, usize)> {
        let limit32 = u32::try_from(limit).unwrap_or(u32::MAX);
        let (page, total) = match search.map(str::trim).filter(|q| !q.is_empty()) {
            None => {
                let page = self.tables.sessions_page(offset as u64, limit32).await?;
                let total = self.tables.sessions_count().await?;
                (page, usize::try_from(total).unwrap_or(usize::MAX))
            }
            Some(q) => {
                let q = q.to_lowercase();
                // The candidates come from the store's trigram index; each is checked here.
                let hits: Vec<String> = self
                    .tables
                    .sessions_labelled(&q)
                    .await?
                    .into_iter()
                    .filter(|(s, json)| {
                        let (title, project) = naming::parse_label(json.as_deref());
                        [Some(s.as_str()), title.as_deref(), project.as_deref()]
                            .into_iter()
                            .flatten()
                            .any(|x| x.to_lowercase().contains(&q))
                    })
                    .map(|(s, _)| s)
                    .collect();
                let total = hits.len();
                (hits.into_iter().skip(offset).take(limit).collect(), total)
            }
        };
        let mut out = Vec::with_capacity(page.len());
        for s in &page {
            let stats = self.store().stats(s).await?;
            out.push(self.view(s, stats).await?);
        }
        Ok((out, total))
    }

    /// A page of the session's messages (`limit` after episode `after`), each with the active
    /// summary row that covers it.
    pub async fn messages(&self, session: &str, after: u64, limit: u32) -> AppResult<MessagesView> {
        let stats = self.known(session).await?;
        let rows = self.store().summaries(session).await?;
        let page = self
            .store()
            .episodes_after(session, after, limit.clamp(1, 1000))
            .await?;
        let next_after = page
            .last()
            .map(|e| e.id)
            .filter(|&last| last < stats.last_episode);
        let ids: Vec<u64> = page.iter().map(|e| e.id).collect();
        let mut items = self.store().items(session, &ids).await?;
        let messages = page
            .into_iter()
            .map(|e| {
                // The chain is in episode order: the candidate is the last row starting at or
                // before the message.
                let covered_by = rows[..rows.partition_point(|r| r.first_episode <= e.id)]
                    .last()
                    .filter(|r| e.id <= r.last_episode)
                    .map(|r| r.id);
                let item = items.remove(&e.id).map(views::item_value);
                MessageView {
                    item,
                    ..MessageView::of(e, covered_by)
                }
            })
            .collect();
        Ok(MessagesView {
            session: session.to_string(),
            messages,
            total: stats.episodes,
            next_after,
        })
    }

    /// What each row covers of the transcript: its last exchange's time, the bytes and the
    /// number of its messages (from the running byte totals the store keeps per episode).
    pub async fn with_coverage(
        &self,
        session: &str,
        mut rows: Vec<SummaryView>,
    ) -> AppResult<Vec<SummaryView>> {
        // Two reads per row: the running byte totals at its ends (and its last episode's
        // time), whatever the length of the session.
        let top = self.store().stats(session).await?.last_episode;
        for r in &mut rows {
            let (first, last) = (
                r.first_episode.clamp(1, top.max(1)),
                r.last_episode.min(top),
            );
            let source = self
                .source_mark(session, r.last_episode)
                .await?
                .map(|m| SourceMarkView {
                    path: m.path,
                    bytes: m.bytes,
                });
            let ends = if last >= first && top > 0 {
                let end = self.store().bytes_through(session, last).await?;
                let start = match first {
                    1 => Some((0, None)),
                    _ => self.store().bytes_through(session, first - 1).await?,
                };
                start.zip(end)
            } else {
                None
            };
            r.coverage = Some(if let Some(((before, _), (through, at))) = ends {
                CoverageView {
                    last_exchange_ms: at,
                    transcript_bytes: through.saturating_sub(before),
                    messages: last - first + 1,
                    source,
                }
            } else {
                CoverageView {
                    last_exchange_ms: None,
                    transcript_bytes: 0,
                    messages: 0,
                    source,
                }
            });
        }
        Ok(rows)
    }

    /// Every session id of this tenant, most recently changed first (from its own part of
    /// the store).
    pub async fn session_ids(&self) -> AppResult<Vec<String>> {
        Ok(self.tables.sessions_page(0, u32::MAX).await?)
    }

    /// The guest's freshness verdict for `session` under `cfg` (no model call).
    pub async fn freshness(&self, session: &str, cfg: &Config) -> AppResult<FreshnessReport> {
        Ok(self.engine().freshness(session, cfg).await?)
    }

    /// What summarizing `session` now under `cfg` would do and cost (no model call, nothing
    /// written): a dry run's answer.
    pub async fn plan(&self, session: &str, cfg: &Config) -> AppResult<types::PlanReport> {
        Ok(self.engine().plan(session, cfg).await?)
    }

    /// The session's newest summary row, if any: what a command prints as the summary, read
    /// alone (a long session's chain holds thousands of rows).
    pub async fn latest_summary(&self, session: &str) -> AppResult<Option<SummaryView>> {
        self.known(session).await?;
        Ok(self
            .store()
            .latest_summary(session)
            .await?
            .as_ref()
            .map(SummaryView::from))
    }

    /// A session's summary chain, oldest first.
    pub async fn summaries(&self, session: &str) -> AppResult<Vec<SummaryView>> {
        self.known(session).await?;
        Ok(self
            .store()
            .summaries(session)
            .await?
            .iter()
            .map(SummaryView::from)
            .collect())
    }

    /// Refuse a request of more messages than one request takes (the service's limit; the
    /// parser holds the same bound for what it is given).
    pub fn check_message_count(&self, n: usize) -> AppResult<()> {
        let most = self.app.inner.cfg.limits.messages_per_request;
        if most > 0 && n as u64 > most {
            return Err(AppError::new(
                ErrorKind::TooLarge,
                format!("the body holds {n} messages, more than one request takes ({most})"),
            )
            .hint(format!("post them in requests of at most {most} messages")));
        }
        Ok(())
    }

    /// Append messages as a client posts them (the messages API's records), in one guest
    /// call: each is checked as `abridge ingest` checks a line (one that is wrong fails the
    /// request, nothing stored), a message with an `id` already stored is skipped (re-posting
    /// is idempotent), and the session's verdict comes back with the write. Never calls the
    /// model: when a refresh is due it is queued as a job.
    pub async fn post(&self, session: &str, messages: Vec<MessageIn>) -> AppResult<Appended> {
        check_session(session)?;
        self.check_message_count(messages.len())?;
        let cfg = self.session_config(session).await?;
        // An active job of the session already covers the work: no verdict then.
        let active = self.active_job(session).await?;
        let json = |v: Option<serde_json::Value>| v.map(|v| v.to_string());
        let mut keys = Vec::with_capacity(messages.len());
        let records: Vec<types::PostedMessage> = messages
            .into_iter()
            .map(|m| {
                keys.push(import::unkeyed(&self.app.unique_id()));
                types::PostedMessage {
                    role: m.role,
                    content: m.content,
                    timestamp: json(m.timestamp),
                    id: json(m.id),
                    name: m.name,
                    item: json(m.item),
                }
            })
            .collect();
        let posted = self
            .engine()
            .post(session, &records, &keys, active.is_none().then_some(&*cfg))
            .await?;
        let received = posted.keys.len() as u32;
        let ids = posted.keys.iter().map(|k| import::client_id(k)).collect();
        let (job, episodes) = match (active, posted.verdict) {
            (None, Some(f)) => (self.queue_due(session, &f, &cfg).await?, f.episodes),
            (active, _) => (active, self.store().stats(session).await?.episodes),
        };
        Ok(Appended {
            session: session.to_string(),
            ids,
            received,
            stored: posted.stored,
            duplicates: received - posted.stored,
            episodes,
            job: job.map(|j| self.job_view(&j)),
        })
    }

    /// Append episodes and, when a refresh is due, run it here and now: one user's process
    /// (the command line's ingest), where the caller waits. The refresh is the session's job,
    /// run here through the job service like every refresh (a job of the session that a live
    /// worker already runs covers the work). A refresh that fails is reported in the result,
    /// not as an error: the episodes are stored and the previous summary is kept. (The
    /// service's [`Scoped::append`] queues the job instead; whether one is due is the guest's
    /// verdict either way.)
    pub async fn append_inline(
        &self,
        session: &str,
        episodes: &[NewEpisode],
        cfg: &SessionConfig,
    ) -> AppResult<InlineAppend> {
        check_session(session)?;
        let stored = self.engine().append(session, episodes).await?;
        let mut out = InlineAppend {
            stored,
            passes: 0,
            written: Vec::new(),
            failure: None,
        };
        if self
            .app
            .inner
            .jobs
            .session_busy(&self.tables, session)
            .await?
        {
            return Ok(out);
        }
        let Some(target) = self.due(session, cfg, Reason::Append).await? else {
            return Ok(out);
        };
        let before = self.store().summaries(session).await?;
        match self.run_or_join(session, target, cfg).await {
            Ok(_) => {
                // What the job wrote: the rows that are new or reach further than before.
                out.written = self
                    .store()
                    .summaries(session)
                    .await?
                    .into_iter()
                    .filter(|r| {
                        !before.iter().any(|b| {
                            b.id == r.id && b.last_episode == r.last_episode && b.level == r.level
                        })
                    })
                    .collect();
                out.passes = out.written.len() as u32;
            }
            Err(e) if e.kind == ErrorKind::InvalidInput => return Err(e),
            Err(e) => out.failure = Some(e),
        }
        Ok(out)
    }

    /// Append episodes and queue a refresh when one is due.
    pub async fn append(
        &self,
        session: &str,
        episodes: Vec<NewEpisode>,
        ids: Vec<String>,
    ) -> AppResult<Appended> {
        check_session(session)?;
        let received = episodes.len() as u32;
        let stored = self.engine().append(session, &episodes).await?;
        let cfg = self.session_config(session).await?;
        let (job, episodes) = self.queue_if_due(session, &cfg).await?;
        Ok(Appended {
            session: session.to_string(),
            ids,
            received,
            stored,
            duplicates: received - stored,
            episodes,
            job: job.map(|j| self.job_view(&j)),
        })
    }

    /// Queue a refresh of `session` when its freshness says one is due. An active job of the
    /// session already covers the work. Returns the job (queued now, or already active) and
    /// the session's episode count.
    async fn queue_if_due(
        &self,
        session: &str,
        cfg: &SessionConfig,
    ) -> AppResult<(Option<Job>, u64)> {
        // An active job already covers the work: skip the verdict (a guest call) then.
        if let Some(j) = self.active_job(session).await? {
            return Ok((Some(j), self.store().stats(session).await?.episodes));
        }
        let f = self.engine().freshness(session, cfg).await?;
        Ok((self.queue_due(session, &f, cfg).await?, f.episodes))
    }

    /// Queue the refresh a guest's verdict names when it is due, unless the caller may only
    /// read (a read-only caller never causes model spend).
    async fn queue_due(
        &self,
        session: &str,
        f: &FreshnessReport,
        cfg: &SessionConfig,
    ) -> AppResult<Option<Job>> {
        if f.state == FreshState::Due && !self.read_only {
            Ok(Some(self.enqueue(session, f.fold_upto, cfg).await?))
        } else {
            Ok(None)
        }
    }

    /// The session's queued or running job, if any (it covers what the session holds).
    async fn active_job(&self, session: &str) -> AppResult<Option<Job>> {
        Ok(self
            .app
            .inner
            .jobs
            .active_for(&self.tables, session)
            .await?)
    }

    async fn enqueue(&self, session: &str, target: u64, cfg: &SessionConfig) -> AppResult<Job> {
        let jobs = &self.app.inner.jobs;
        let (queued, mine) = jobs.queued_of(&self.tables, session).await?;
        // Repeated refreshes of one session coalesce: its queued job, once it runs, is the
        // refresh (what is due after it queues the next).
        if let Some(j) = mine {
            return Ok(j);
        }
        let limit = self.app.inner.cfg.limits.queued_per_tenant;
        if limit > 0 && queued >= limit {
            return Err(AppError::new(
                ErrorKind::RateLimited {
                    retry_after_secs: 30,
                },
                format!(
                    "this tenant already has {queued} refreshes queued (the limit is {limit}); the messages are stored and the refresh is asked for again by the next write or context read"
                ),
            )
            .hint("wait for the queue to drain (GET /v1/jobs), then retry; send large imports in smaller parts"));
        }
        let (job, created) = self
            .app
            .inner
            .jobs
            .enqueue(&self.tables, session, target, cfg)
            .await?;
        if created {
            self.publish(What::queued(target), Some(session), Some(job.id));
            self.app.inner.wake.notify_one();
        }
        Ok(job)
    }

    /// Queue a refresh now, whatever the session's mode or backoff. `None` when every episode
    /// is already covered.
    pub async fn refresh(&self, session: &str) -> AppResult<Option<JobView>> {
        self.known(session).await?;
        let cfg = self.session_config(session).await?;
        let Some(target) = self.due(session, &cfg, Reason::Asked).await? else {
            return Ok(None);
        };
        let job = self.enqueue(session, target, &cfg).await?;
        Ok(Some(self.job_view(&job)))
    }

    /// The context for the next model call, from what is summarized now. Never waits for the
    /// model unless `ask.wait` is given: a refresh that is due is queued and reported. With
    /// `wait`, a due refresh is queued and waited for (up to that long) first.
    ///
    /// With a `query` (usually the user's newest message), the earlier turns that best match it
    /// are included verbatim beside the summary, within their share of the budget.
    pub async fn context(&self, session: &str, ask: ContextAsk<'_>) -> AppResult<ContextView> {
        ask.check()?;
        let ContextAsk {
            budget,
            pairs,
            refresh_after,
            wait,
            query,
        } = ask;
        let stats = self.known(session).await?;
        let cfg = self.session_config(session).await?;
        // An active job of the session already covers the work: no verdict then.
        let mut job = self.active_job(session).await?;
        let pins = self.tables.pins(session).await?;
        let mut req = ContextRequest {
            budget,
            pairs,
            // The hot path never summarizes inline: refreshes run as jobs.
            refresh_after: u32::MAX,
            pins,
            query: query.map(str::to_string),
            // The guest's verdict comes with the window, from the same call.
            verdict_after: job.is_none().then_some(refresh_after),
        };
        let mut w = self.engine().context(session, req.clone(), &cfg).await?;
        let episodes = w.verdict.as_ref().map_or(stats.episodes, |f| f.episodes);
        if let Some(f) = &w.verdict {
            job = self.queue_due(session, f, &cfg).await?;
        }
        let mut waited = false;
        if let (Some(limit), Some(j)) = (wait, &job) {
            // Asked to wait for the refresh: the context is read again once it is done.
            waited = true;
            if let Some(done) = self.wait_job(j.id, limit).await? {
                job = Some(done);
            }
            req.verdict_after = None;
            w = self.engine().context(session, req, &cfg).await?;
        }
        let pending = job.as_ref().is_some_and(|j| j.state.is_active());
        // Left out and no refresh on the way (more than the caller allows, or what the engine
        // says is due): it waits for idle mode's quiet window or a failing model's backoff.
        let due = !pending && (w.refresh_due || w.behind);
        let job = job.map(|j| self.job_view(&j));
        let mut view = ContextView::new(session, &w, job, (pending, due), waited, episodes);
        // The items clients stored with the messages shown, handed back as given.
        let mut items = self.store().items(session, &w.shown).await?;
        for m in &mut view.messages {
            if let Some(text) = m.episode.and_then(|id| items.remove(&id)) {
                m.item = Some(views::item_value(text));
            }
        }
        Ok(view)
    }

    /// Full-text search of the tenant's messages (of one session, with `session`): the
    /// `limit` best (at most 100) after the first `offset`, ranked by BM25. A query's
    /// punctuation and operators are words or nothing; a query of no searchable word finds
    /// nothing.
    pub async fn search(
        &self,
        query: &str,
        session: Option<&str>,
        offset: u32,
        limit: u32,
    ) -> AppResult<SearchView> {
        if let Some(s) = session {
            self.known(s).await?;
        }
        if offset > SEARCH_MAX_OFFSET {
            return Err(AppError::invalid(format!(
                "offset {offset} is beyond the deepest page ({SEARCH_MAX_OFFSET}); add words to the query to narrow it"
            )));
        }
        if !(1..=SEARCH_MAX_LIMIT).contains(&limit) {
            return Err(AppError::invalid(format!(
                "limit {limit} is out of range; give 1 to {SEARCH_MAX_LIMIT}"
            )));
        }
        let page = self.engine().search(session, query, offset, limit).await?;
        Ok(SearchView {
            query: query.to_string(),
            session: session.map(str::to_string),
            hits: page.hits.iter().map(SearchHitView::new).collect(),
            next_offset: page.more.then_some(offset + limit),
            complete: !self.app.indexing(),
        })
    }

    /// Wait until job `id` ends or `limit` passes; the job as it then stands.
    pub async fn wait_job(&self, id: u64, limit: Duration) -> AppResult<Option<Job>> {
        let mut live = self
            .app
            .inner
            .events
            .subscribe(&self.tenant, None)
            .await
            .live;
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let j = self.app.inner.jobs.get(id).await?;
            match &j {
                Some(j) if j.state.is_active() => {}
                _ => return Ok(j),
            }
            let step = tokio::time::sleep_until(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(250)),
            );
            tokio::select! {
                _ = live.recv() => {}
                _ = step => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return self.app.inner.jobs.get(id).await.map_err(Into::into);
            }
        }
    }

    /// Set (or with `None` clear) a session's own refresh mode; returns the mode in force.
    pub async fn set_mode(
        &self,
        session: &str,
        mode: Option<SessionMode>,
    ) -> AppResult<SessionView> {
        let stats = self.known(session).await?;
        self.tables.set_session_mode(session, mode.as_ref()).await?;
        self.view(session, stats).await
    }

    /// Delete a session and everything kept for it (episodes, summaries, failure marker, jobs,
    /// mode, the files it was imported from); returns how many episodes it had.
    pub async fn reset(&self, session: &str) -> AppResult<u64> {
        let stats = self.known(session).await?;
        self.reset_quietly(session).await?;
        self.publish(What::SessionReset {}, Some(session), None);
        Ok(stats.episodes)
    }

    async fn reset_quietly(&self, session: &str) -> AppResult<()> {
        // Its events first: those still queued are written, then dropped with the rest.
        self.app
            .inner
            .events
            .forget_session(&self.tenant, session, None)
            .await;
        self.engine().reset(session).await?;
        Ok(())
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

    /// Remove the session's newest message (an undo: an agent framework's `pop`). In one
    /// store transaction the message goes with every summary row that covered it, and the rows
    /// an earlier compaction had folded into those come back; the chain rule holds after. A
    /// refresh then folds again what the deleted rows covered besides the message, when the
    /// session's mode would have kept it folded. Removing a session's only message removes the
    /// session. Its id is free again: the next message takes it.
    pub async fn pop(&self, session: &str) -> AppResult<RemovedView> {
        self.known(session).await?;
        self.writing("remove messages")?;
        let before = self.covered(session).await?;
        // Summary events still queued are written before the store deletes them.
        self.app
            .inner
            .events
            .forget_session(&self.tenant, session, Some("summary.written"))
            .await;
        let popped = self
            .store()
            .pop_episode(session)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no session '{session}'")))?;
        let e = popped.episode;
        let left = self.store().stats(session).await?.episodes;
        let job = if left == 0 {
            self.reset_quietly(session).await?;
            None
        } else if !popped.dropped.is_empty() {
            // What the dropped rows covered, without the message.
            let target = before.min(e.id - 1);
            let cfg = self.session_config(session).await?;
            if target > self.covered(session).await? {
                Some(self.job_view(&self.enqueue(session, target, &cfg).await?))
            } else {
                None
            }
        } else {
            None
        };
        self.publish(
            What::MessageRemoved {
                message: e.id,
                dropped: popped.dropped.clone(),
            },
            Some(session),
            None,
        );
        Ok(RemovedView {
            session: session.to_string(),
            message: MessageView {
                item: popped.item.clone().map(views::item_value),
                ..MessageView::of(e, None)
            },
            dropped_rows: popped.dropped,
            reopened_rows: popped.reopened,
            episodes: left,
            job,
        })
    }

    /// The tenant's API tokens, live and revoked, oldest first (never the tokens themselves).
    pub async fn tokens(&self) -> AppResult<Vec<tokens::TokenView>> {
        Ok(self
            .tables
            .tokens()
            .await?
            .into_iter()
            .map(tokens::TokenView::from)
            .collect())
    }

    /// Create an API token for this tenant (a read-only caller cannot); the answer is the only
    /// place the token is ever shown.
    pub async fn create_token(
        &self,
        read_only: bool,
        label: Option<&str>,
    ) -> AppResult<tokens::CreatedToken> {
        self.writing("create tokens")?;
        if let Some(l) = label {
            tokens::check_label(l)?;
        }
        let now = self.app.now_ms();
        let (token, id) = self
            .app
            .tokens()
            .create(&self.tenant, read_only, label, now)
            .await?;
        let prefix = tokens::prefix_of(&token);
        Ok(tokens::CreatedToken {
            token,
            id,
            prefix,
            read_only,
            label: label.map(str::to_string),
            created_ms: now,
        })
    }

    /// Revoke this tenant's live token `id`; another tenant's token, or one already revoked,
    /// is not found.
    pub async fn revoke_token(&self, id: u64) -> AppResult<tokens::TokenView> {
        self.writing("revoke tokens")?;
        self.tables
            .revoke_token(id, self.app.now_ms())
            .await?
            .map(tokens::TokenView::from)
            .ok_or_else(|| {
                AppError::not_found(format!("no live token {id}"))
                    .hint("GET /v1/tokens lists this tenant's tokens")
            })
    }

    /// The tenant's newest jobs (ids below `before`), newest first.
    pub async fn list_jobs(&self, before: Option<u64>, limit: u32) -> AppResult<Vec<JobView>> {
        Ok(self
            .app
            .inner
            .jobs
            .list_for(&self.tables, before, limit)
            .await?
            .iter()
            .map(|j| self.job_view(j))
            .collect())
    }

    /// The tenant's jobs a worker could take now, oldest first: queued ones, and running
    /// ones whose worker is gone (after a crash or kill).
    pub async fn runnable_jobs(&self) -> AppResult<Vec<JobView>> {
        Ok(self
            .app
            .inner
            .jobs
            .runnable(None)
            .await?
            .iter()
            .filter(|j| j.tenant == self.tenant)
            .map(|j| self.job_view(j))
            .collect())
    }

    /// One of the tenant's jobs (another tenant's is not found).
    pub async fn job(&self, id: u64) -> AppResult<JobView> {
        self.own_job(id).await.map(|j| self.job_view(&j))
    }

    async fn own_job(&self, id: u64) -> AppResult<Job> {
        self.app
            .inner
            .jobs
            .get(id)
            .await?
            .filter(|j| j.tenant == self.tenant)
            .ok_or_else(|| AppError::not_found(format!("no job {id}")))
    }

    /// Cancel a job: a queued one at once, a running one within a second.
    pub async fn cancel_job(&self, id: u64) -> AppResult<JobView> {
        let job = self.own_job(id).await?;
        if !job.state.is_active() {
            return Err(AppError::new(
                ErrorKind::Conflict,
                format!("job {id} already {}", job.state.as_str()),
            ));
        }
        let now = self
            .app
            .inner
            .jobs
            .cancel(id)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no job {id}")))?;
        if now.state == crate::jobs::JobState::Cancelled {
            self.publish(What::cancelled(), Some(now.session.as_str()), Some(id));
        }
        Ok(self.job_view(&now))
    }

    /// A job as callers see it (the session id without the tenant).
    pub fn job_view(&self, j: &Job) -> JobView {
        JobView::from(j)
    }
}
