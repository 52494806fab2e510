//! The store traits written once, for every [`Backend`]: SQLite (a file or memory) and
//! PostgreSQL give only their transactions ([`crate::sql`]); what a method reads and writes,
//! and how it seals, is here. SQL is in PostgreSQL's spelling of parameters (`$1`), which
//! SQLite's transaction reads as its own.

use std::sync::Arc;

use async_trait::async_trait;

use crate::control::Progress;
use crate::jobs::{Beat, Claim, Job, JobState};
use crate::keyring::{Stored, place};
use crate::rules;
use crate::rules::Dialect;
use crate::sources::{Mark, SessionMode, Source, WatchedFile};
use crate::sql::{Backend, Row, Tx, Txn, Val};
use crate::tables::{
    EventRow, EventStore, JobStore, Liveness, SessionText, SourceStore, TenantCap, TokenRow,
    TokenStore,
};
use crate::tenant::Tenant;
use crate::types::Error;
use crate::types::Mode;

/// A SQL store: a backend's transactions ([`Backend`]), with every store trait written once
/// over them. [`crate::SqliteStore`] and [`crate::PgStore`] are this over their backends.
///
/// A store opened is the database's whole view: it names the local tenant's sessions (and
/// refuses a key of another tenant's space), and its job, token and unindexed-session lists
/// are every tenant's (what the workers, the index and an administrator need: each row comes
/// with its tenant, read from its `tenant` column). [`AppStore::for_tenant`](crate::AppStore)
/// gives the same database bound to one [`Tenant`]: every call then names sessions (and
/// partial answers) by the tenant's own ids, which the handle keys into the tenant's space on
/// the way in and back on the way out; its lists and counts hold the tenant's rows only; and
/// a memory call naming another tenant is refused. Another tenant's rows cannot be named
/// through it, and the app hands front ends nothing else.
pub struct Sql<B> {
    db: Arc<B>,
    tenant: Option<Tenant>,
}

/// A session (or a partial answer) as the store keeps it: its stored key and the tenant it
/// belongs to, whose data key seals its rows and whose `tenant` column it is. Made only by
/// [`Sql::name`] from the view's own tenant: no tenant is read back out of a key.
pub(crate) struct SessionKey {
    key: String,
    tenant: Tenant,
}

impl SessionKey {
    /// The stored key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The id as its tenant names it (for messages).
    pub(crate) fn id(&self) -> &str {
        self.tenant.session_of(&self.key).unwrap_or(&self.key)
    }

    /// The tenant's name (whose data key seals the session's rows).
    pub(crate) fn tenant(&self) -> &str {
        self.tenant.name()
    }

    /// The `tenant` column of the session's rows ('' for the local tenant).
    pub(crate) fn column(&self) -> &str {
        Self::column_of(&self.tenant)
    }

    /// The `tenant` column of a tenant's sessions ('' for the local tenant).
    pub(crate) fn column_of(tenant: &Tenant) -> &str {
        if tenant.is_local() { "" } else { tenant.name() }
    }
}

impl From<&SessionKey> for Val {
    fn from(s: &SessionKey) -> Val {
        Val::Text(s.key.clone())
    }
}

impl<B> Sql<B> {
    /// The whole view of `db`.
    pub(crate) fn new(db: B) -> Self {
        Sql {
            db: Arc::new(db),
            tenant: None,
        }
    }

    /// The database, to configure before it is shared (opening, sealing).
    pub(crate) fn db_mut(&mut self) -> &mut B {
        Arc::get_mut(&mut self.db).expect("a store is configured before it is shared")
    }

    /// A session (or a partial answer) as this view names it, as the store keeps it: keyed
    /// into the tenant's space in a bound view; in the whole view, the local tenant's (an id
    /// keyed into another tenant's space is refused: only that tenant's view names it).
    pub(crate) fn name(&self, session: &str) -> Result<SessionKey, Error> {
        match &self.tenant {
            Some(t) => Ok(SessionKey {
                key: t.key(session),
                tenant: t.clone(),
            }),
            None if crate::tenant::is_keyed(session) => Err(Error::InvalidInput(format!(
                "'{}' names another tenant's session, which the whole store does not: open that tenant's view (AppStore::for_tenant)",
                crate::text::printable(session)
            ))),
            None => Ok(SessionKey {
                key: session.to_string(),
                tenant: Tenant::local(),
            }),
        }
    }

    /// A stored key back as this view names it (`None`: another tenant's).
    pub(crate) fn id_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        match &self.tenant {
            Some(t) => t.session_of(key),
            None => Some(key),
        }
    }

    /// The tenant this view is bound to, if any.
    pub(crate) fn bound(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// The `tenant` column of the view's tenant: '' for the local tenant, and for the whole
    /// view (whose session lists are the local tenant's).
    pub(crate) fn column(&self) -> &str {
        self.tenant.as_ref().map_or("", SessionKey::column_of)
    }

    /// The tenant whose sessions this view names: its own, or the local tenant for the
    /// whole view.
    pub(crate) fn owner(&self) -> Tenant {
        self.tenant.clone().unwrap_or_else(Tenant::local)
    }

    /// A memory call's tenant, checked: a bound view serves its own tenant only (a caller
    /// that names another is refused before any row is read).
    pub(crate) fn own<'a>(&self, tenant: &'a str) -> Result<&'a str, Error> {
        match &self.tenant {
            Some(t) if t.name() != tenant => Err(Error::Storage(format!(
                "a store bound to tenant '{t}' was asked for tenant '{}'s rows; open that tenant's view instead",
                crate::text::printable(tenant)
            ))),
            _ => Ok(tenant),
        }
    }

    /// Stored keys back to the view's ids (another tenant's never pass a bound view).
    fn ids(&self, keys: Vec<String>) -> Vec<String> {
        match &self.tenant {
            None => keys,
            Some(t) => keys
                .iter()
                .filter_map(|k| t.session_of(k).map(str::to_string))
                .collect(),
        }
    }
}

// Written once, for the one implementation: the SQL stores (in-memory test stores implement
// the traits they need and are not an `AppStore`).
impl<B: Backend + 'static> crate::AppStore for Sql<B> {
    fn for_tenant(&self, tenant: &Tenant) -> Arc<dyn crate::AppStore> {
        Arc::new(Sql {
            db: self.db.clone(),
            tenant: Some(tenant.clone()),
        })
    }

    fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }
}

// The bound is the crate's own databases: these are `SqliteStore`'s and `PgStore`'s methods.
#[allow(private_bounds)]
impl<B: Backend> Sql<B> {
    /// Seal memory, summary and message text at rest under per-tenant data keys wrapped by
    /// `master` (see [`crate::crypto`]). Rows written without a key stay readable (they are
    /// marked plaintext).
    pub fn with_master_key(mut self, master: crate::crypto::Secret) -> Self {
        self.db_mut().seals_mut().keys = Some(crate::keyring::Keyring::new(master));
        self
    }

    /// Seal stored vectors as well (memories', cluster summaries' and cluster sums'), under
    /// the same per-tenant data keys: search then opens every vector it ranks (PostgreSQL's
    /// pgvector index is not used). Needs a master key; without one it does nothing.
    pub fn with_sealed_vectors(mut self) -> Self {
        self.db_mut().seals_mut().vectors = true;
        self
    }
}

impl<B> std::ops::Deref for Sql<B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.db
    }
}

/// A sealed text as a column value: SQLite keeps a plain text as TEXT (its columns that hold
/// user text are TEXT-declared), PostgreSQL's are BYTEA.
pub(crate) fn sealed_val(d: Dialect, (bytes, version): (Vec<u8>, u32)) -> Val {
    match (d, version) {
        (Dialect::Sqlite, 0) => match String::from_utf8(bytes) {
            Ok(t) => Val::Text(t),
            Err(e) => Val::Bytes(e.into_bytes()),
        },
        _ => Val::Bytes(bytes),
    }
}

/// A read: the body's statements (an async block's: its value, a `?` or a `return` is its
/// `Result`) on a connection of the store, outside a write transaction.
macro_rules! reading {
    ($store:expr, |$t:ident| $body:expr) => {{
        #[allow(unused_mut)]
        let mut $t = $store.begin(false).await?;
        #[allow(clippy::needless_return)]
        let r: Result<_, Error> = async { $body }.await;
        drop($t);
        r
    }};
}

/// A write: the body's statements (an async block's: its value, a `?` or a `return` is its
/// `Result`) in one transaction, committed when it is `Ok` and rolled back (its locks
/// released before the next request) when it is not.
macro_rules! writing {
    ($store:expr, |$t:ident| $body:expr) => {{
        let mut $t = $store.begin(true).await?;
        #[allow(clippy::needless_return)]
        let r: Result<_, Error> = async { $body }.await;
        if r.is_ok() {
            $t.commit().await?;
        } else {
            $t.rollback().await;
        }
        r
    }};
}

pub(crate) mod recall;
mod store;

const TOKEN_COLS: &str = "id, tenant, prefix, read_only, label, created_ms, revoked_ms";

fn token_from(r: &Row) -> Result<TokenRow, Error> {
    Ok(TokenRow {
        id: r.u64(0)?,
        tenant: r.text(1)?,
        prefix: r.text(2)?,
        read_only: r.int(3)? != 0,
        label: r.opt_text(4)?,
        created_ms: r.u64(5)?,
        revoked_ms: r.opt_int(6)?.map(|v| v as u64),
    })
}

#[async_trait]
impl<B: Backend> TokenStore for Sql<B> {
    async fn insert_token(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
        read_only: bool,
        label: Option<&str>,
        now_ms: u64,
    ) -> Result<u64, Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| {
            t
            .row(
                "INSERT INTO tokens (tenant, hash, prefix, read_only, label, created_ms) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                &[tenant.into(), hash.into(), prefix.into(), read_only.into(), label.into(), now_ms.into()],
            )
            .await?
            .ok_or_else(|| Error::Storage("the token row vanished".into()))?
            .u64(0)
        })
    }

    async fn tokens(&self) -> Result<Vec<TokenRow>, Error> {
        let (filter, args): (&str, Vec<Val>) = match self.bound() {
            Some(b) => ("WHERE tenant = $1", vec![b.name().into()]),
            None => ("", Vec::new()),
        };
        reading!(self, |t| t
            .rows(
                &format!("SELECT {TOKEN_COLS} FROM tokens {filter} ORDER BY id"),
                &args
            )
            .await?
            .iter()
            .map(token_from)
            .collect())
    }

    async fn revoke_token(&self, id: u64, now_ms: u64) -> Result<bool, Error> {
        let (filter, mut args): (&str, Vec<Val>) = match self.bound() {
            Some(b) => (" AND tenant = $3", vec![b.name().into()]),
            None => ("", Vec::new()),
        };
        args.splice(0..0, [id.into(), now_ms.into()]);
        writing!(self, |t| t
            .exec(
                &format!(
                    "UPDATE tokens SET revoked_ms = $2 WHERE id = $1 AND revoked_ms IS NULL{filter}"
                ),
                &args,
            )
            .await
            .map(|n| n > 0))
    }

    async fn any_live_token(&self) -> Result<bool, Error> {
        reading!(self, |t| match t
            .row(
                "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_ms IS NULL)",
                &[]
            )
            .await?
        {
            Some(r) => Ok(r.int(0)? != 0),
            None => Ok(false),
        })
    }

    async fn live_token(&self, hash: &str) -> Result<Option<TokenRow>, Error> {
        reading!(self, |t| t
            .row(
                &format!("SELECT {TOKEN_COLS} FROM tokens WHERE hash = $1 AND revoked_ms IS NULL"),
                &[hash.into()],
            )
            .await?
            .as_ref()
            .map(token_from)
            .transpose())
    }
}

/// The channel event writers notify (the payload is the tenant).
pub(crate) const EVENTS_CHANNEL: &str = "abridge_events";

const EVENT_COLS: &str = "tenant, id, kind, at_ms, session_key, job, data, sealed";

/// Event rows of `sql` with their data opened.
async fn events(t: &mut impl Tx, sql: &str, args: &[Val]) -> Result<Vec<EventRow>, Error> {
    let mut out = Vec::new();
    for r in t.rows(sql, args).await? {
        let mut e = EventRow {
            tenant: r.text(0)?,
            id: r.u64(1)?,
            kind: r.text(2)?,
            at_ms: r.u64(3)?,
            session_key: r.opt_text(4)?,
            job: r.opt_int(5)?.map(|j| j as u64),
            data: String::new(),
        };
        let stored = Stored {
            bytes: r.bytes(6)?,
            sealed: r.int(7)? as u32,
        };
        e.data = t
            .reveal(&e.tenant, place::EVENT, &e.id.to_string(), stored)
            .await?;
        out.push(e);
    }
    Ok(out)
}

#[async_trait]
impl<B: Backend> EventStore for Sql<B> {
    async fn append_events(
        &self,
        tenant: &str,
        floor: u64,
        rows: &[EventRow],
        keep: usize,
    ) -> Result<u64, Error> {
        writing!(self, |t| {
            // Writers of one tenant take turns until they commit, so its ids are dense and
            // become visible in order (what readers on other instances rely on).
            t.take_turn(&format!("events:{tenant}")).await?;
            let newest = match t
                .row(
                    "SELECT COALESCE(MAX(id), 0) FROM events WHERE tenant = $1",
                    &[tenant.into()],
                )
                .await?
            {
                Some(r) => r.int(0)?.max(0) as u64,
                None => 0,
            };
            let first = newest.max(floor) + 1;
            let d = t.dialect();
            for (i, e) in rows.iter().enumerate() {
                let id = first + i as u64;
                let data = t
                    .seal(tenant, place::EVENT, &id.to_string(), &e.data)
                    .await?;
                let sealed = data.1;
                t.exec(
                    "INSERT INTO events (tenant, id, kind, at_ms, session_key, job, data, sealed) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    &[
                        tenant.into(),
                        id.into(),
                        e.kind.as_str().into(),
                        e.at_ms.into(),
                        e.session_key.as_deref().into(),
                        e.job.into(),
                        sealed_val(d, data),
                        sealed.into(),
                    ],
                )
                .await?;
            }
            let last = first + rows.len() as u64;
            t.exec(
                "DELETE FROM events WHERE tenant = $1 AND id < $2",
                &[tenant.into(), last.saturating_sub(keep as u64).into()],
            )
            .await?;
            // Delivered to listeners at commit.
            t.notify(EVENTS_CHANNEL, tenant).await?;
            Ok(first)
        })
    }

    async fn recent_events(&self, keep: usize) -> Result<Vec<EventRow>, Error> {
        reading!(self, |t| {
            events(
            &mut t,
            "SELECT e.tenant, e.id, e.kind, e.at_ms, e.session_key, e.job, e.data, e.sealed FROM events e
             WHERE e.id > (SELECT MAX(id) FROM events WHERE tenant = e.tenant) - $1
             ORDER BY e.tenant, e.id",
            &[(keep.min(i64::MAX as usize) as i64).into()],
        )
        .await
        })
    }

    async fn events_after(
        &self,
        tenant: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, Error> {
        reading!(self, |t| events(
            &mut t,
            &format!(
                "SELECT {EVENT_COLS} FROM events WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3"
            ),
            &[
                tenant.into(),
                (after.min(i64::MAX as u64) as i64).into(),
                (limit.min(i64::MAX as usize) as i64).into(),
            ],
        )
        .await)
    }

    async fn event_heads(&self) -> Result<Vec<(String, u64)>, Error> {
        reading!(self, |t| t
            .rows(
                "SELECT tenant, MAX(id) FROM events GROUP BY tenant ORDER BY tenant",
                &[]
            )
            .await?
            .iter()
            .map(|r| Ok((r.text(0)?, r.u64(1)?)))
            .collect())
    }

    fn events_shared(&self) -> bool {
        self.shared()
    }

    async fn event_signal(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.listen(EVENTS_CHANNEL)
    }
}

const JOB_COLS: &str = "id, session, target, state, config, cancel_requested, level, done, total, calls_planned, answers, attempts, error, lease_owner, lease_until_ms, created_ms, started_ms, updated_ms, finished_ms, tenant";

/// A job from a row of [`JOB_COLS`]: its tenant from the row's `tenant` column, its session
/// as that tenant names it.
fn job_from(r: &Row) -> Result<Job, Error> {
    let opt = |i: usize| -> Result<Option<u64>, Error> { Ok(r.opt_int(i)?.map(|v| v as u64)) };
    let tenant = Tenant::new(crate::tenant::name_of_column(&r.text(19)?))
        .map_err(|e| Error::Storage(format!("job {}: {e}", r.int(0).unwrap_or(0))))?;
    let key = r.text(1)?;
    let session = tenant.session_of(&key).unwrap_or(&key).to_string();
    Ok(Job {
        id: r.u64(0)?,
        tenant,
        session,
        target: r.u64(2)?,
        state: JobState::parse(&r.text(3)?),
        config: crate::types::config_from_json(
            &serde_json::from_str(&r.text(4)?).unwrap_or_default(),
        ),
        cancel_requested: r.int(5)? != 0,
        level: r.int(6)? as u32,
        done: r.int(7)? as u32,
        total: r.int(8)? as u32,
        calls_planned: r.int(9)? as u32,
        answers: r.u64(10)?,
        attempts: r.int(11)? as u32,
        error: r.opt_text(12)?,
        lease_owner: r.opt_text(13)?,
        lease_until_ms: opt(14)?,
        created_ms: r.u64(15)?,
        started_ms: opt(16)?,
        updated_ms: r.u64(17)?,
        finished_ms: opt(18)?,
    })
}

/// The jobs `filter` (a `WHERE` fragment and its arguments) selects.
async fn jobs_where(t: &mut impl Tx, filter: &str, args: &[Val]) -> Result<Vec<Job>, Error> {
    t.rows(&format!("SELECT {JOB_COLS} FROM jobs WHERE {filter}"), args)
        .await?
        .iter()
        .map(job_from)
        .collect()
}

/// An integer argument from a `u64` beyond SQL's range: the largest SQL holds.
fn big(v: u64) -> Val {
    Val::Int(v.min(i64::MAX as u64) as i64)
}

#[async_trait]
impl<B: Backend> JobStore for Sql<B> {
    async fn job_enqueue(
        &self,
        session: &str,
        target: u64,
        config: &str,
        now_ms: u64,
    ) -> Result<(Job, bool), Error> {
        let session = &self.name(session)?;
        let key = format!("{}@{target}", session.key());
        writing!(self, |t| {
            // Enqueuers of one key take turns: the active job is read and made in one step,
            // however many instances share the store.
            t.take_turn(&format!("job-key:{key}")).await?;
            let active = jobs_where(
                &mut t,
                "key = $1 AND state IN ('queued','running')",
                &[key.as_str().into()],
            )
            .await?;
            if let Some(job) = active.into_iter().next() {
                return Ok((job, false));
            }
            // A new id, past the newest: two enqueuers of other keys may pick the same one, and
            // the second tries again.
            for _ in 0..8 {
                let newest = match t.row("SELECT MAX(id) FROM jobs", &[]).await? {
                    Some(r) => r.opt_int(0)?.map(|n| n as u64),
                    None => None,
                };
                let id = crate::rules::new_job_id(now_ms, newest);
                let made = t
                    .row(
                        &format!(
                            "INSERT INTO jobs (id, session, target, key, state, config, created_ms, updated_ms, tenant) VALUES ($6, $1, $2, $3, 'queued', $4, $5, $5, $7)
                             ON CONFLICT DO NOTHING RETURNING {JOB_COLS}"
                        ),
                        &[
                            session.into(),
                            target.into(),
                            key.as_str().into(),
                            config.into(),
                            now_ms.into(),
                            id.into(),
                            session.column().into(),
                        ],
                    )
                    .await?;
                if let Some(r) = made {
                    return Ok((job_from(&r)?, true));
                }
            }
            Err(Error::Conflict(format!(
                "job {key} found no free id; try again"
            )))
        })
    }

    async fn job_get(&self, id: u64) -> Result<Option<Job>, Error> {
        reading!(self, |t| Ok(jobs_where(&mut t, "id = $1", &[id.into()])
            .await?
            .into_iter()
            .next()))
    }

    async fn job_claim(
        &self,
        id: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
        live: Liveness<'_>,
        cap: Option<TenantCap<'_>>,
    ) -> Result<Claim, Error> {
        let mut t = self.begin(true).await?;
        let d = t.dialect();
        // Another instance claiming the same row holds its lock: skip, it is busy.
        let lock = match d {
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let locked = t
            .row(
                &format!("SELECT {JOB_COLS} FROM jobs WHERE id = $1{lock}"),
                &[id.into()],
            )
            .await?;
        let Some(row) = locked else {
            t.rollback().await;
            let job = self
                .job_get(id)
                .await?
                .ok_or_else(|| Error::Storage(format!("no job {id}")))?;
            return Ok(if job.state.is_active() {
                Claim::Busy(job)
            } else {
                Claim::Finished(job)
            });
        };
        let job = job_from(&row)?;
        if let Some(no) = crate::rules::claim_first(&job, live) {
            t.rollback().await;
            return Ok(no.answer(job));
        }
        // One running job per session, and the tenant's cap, across instances: the session's
        // and then the tenant's turn (always in that order) make check and claim one step.
        let key = job.key();
        t.take_turn(&format!("job-session:{key}")).await?;
        let others = jobs_where(
            &mut t,
            "session = $1 AND id != $2 AND state = 'running'",
            &[key.as_str().into(), id.into()],
        )
        .await?;
        let mut running = 0;
        if let Some(cap) = cap {
            t.take_turn(&format!("job-tenant:{}", cap.tenant.name()))
                .await?;
            // From the index of running jobs: every tenant's queue stays out of it.
            running = jobs_where(
                &mut t,
                "state = 'running' AND id != $1 AND lease_until_ms > $2",
                &[id.into(), now_ms.into()],
            )
            .await?
            .iter()
            .filter(|j| crate::rules::counts_against_cap(j, id, now_ms, cap))
            .count();
        }
        if let Some(no) = crate::rules::claim_rest(&others, live, running, cap) {
            t.rollback().await;
            return Ok(no.answer(job));
        }
        let r = t
            .row(
                &format!("UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = $2, lease_until_ms = $3, started_ms = COALESCE(started_ms, $4), updated_ms = $4, error = NULL WHERE id = $1 RETURNING {JOB_COLS}"),
                &[id.into(), owner.into(), until_ms.into(), now_ms.into()],
            )
            .await?
            .ok_or_else(|| Error::Storage("job vanished".into()))?;
        let job = job_from(&r)?;
        t.commit().await?;
        Ok(Claim::Taken(job))
    }

    async fn job_heartbeat(
        &self,
        id: u64,
        owner: &str,
        until_ms: u64,
        p: Progress,
        answers: u64,
        now_ms: u64,
    ) -> Result<Beat, Error> {
        writing!(self, |t| {
            let r = t
                .row(
                    "UPDATE jobs SET lease_until_ms = $3, level = $4, done = $5, total = $6, answers = $7, updated_ms = $8 WHERE id = $1 AND lease_owner = $2 AND state = 'running' RETURNING cancel_requested",
                    &[
                        id.into(),
                        owner.into(),
                        until_ms.into(),
                        p.level.into(),
                        p.done.into(),
                        p.total.into(),
                        answers.into(),
                        now_ms.into(),
                    ],
                )
                .await?;
            Ok(match r {
                None => Beat::Lost,
                Some(r) if r.int(0)? != 0 => Beat::Cancel,
                Some(_) => Beat::Go,
            })
        })
    }

    async fn job_set_planned(&self, id: u64, calls: u32) -> Result<(), Error> {
        writing!(self, |t| t
            .exec(
                "UPDATE jobs SET calls_planned = $2 WHERE id = $1",
                &[id.into(), calls.into()],
            )
            .await
            .map(drop))
    }

    async fn job_finish(
        &self,
        id: u64,
        state: JobState,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), Error> {
        writing!(self, |t| {
            t
            .exec(
                "UPDATE jobs SET state = $2, error = $3, lease_owner = NULL, lease_until_ms = NULL, updated_ms = $4, finished_ms = $4 WHERE id = $1",
                &[id.into(), state.as_str().into(), error.into(), now_ms.into()],
            )
            .await
            .map(drop)
        })
    }

    async fn job_cancel(&self, id: u64, now_ms: u64) -> Result<(), Error> {
        writing!(self, |t| {
            t.exec(
                "UPDATE jobs SET state = 'cancelled', error = 'cancelled before it ran', updated_ms = $2, finished_ms = $2 WHERE id = $1 AND state = 'queued'",
                &[id.into(), now_ms.into()],
            )
            .await?;
            t.exec(
                "UPDATE jobs SET cancel_requested = 1, updated_ms = $2 WHERE id = $1 AND state = 'running'",
                &[id.into(), now_ms.into()],
            )
            .await
            .map(drop)
        })
    }

    async fn job_release(&self, id: u64, owner: &str, now_ms: u64) -> Result<bool, Error> {
        writing!(self, |t| {
            t
            .exec(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_until_ms = NULL, updated_ms = $3 WHERE id = $1 AND lease_owner = $2 AND state = 'running'",
                &[id.into(), owner.into(), now_ms.into()],
            )
            .await
            .map(|n| n > 0)
        })
    }

    async fn jobs_active(&self) -> Result<Vec<Job>, Error> {
        reading!(self, |t| jobs_where(
            &mut t,
            "state IN ('queued','running') ORDER BY id",
            &[]
        )
        .await)
    }

    async fn jobs_runnable(&self, per_tenant: u32) -> Result<Vec<Job>, Error> {
        reading!(self, |t| {
            // The tenants with active jobs, one index seek each (a skip scan); each one's
            // oldest queued jobs from the same index; and every running job (a lease may
            // have run out). One statement.
            let filter = match t.dialect() {
                Dialect::Sqlite => {
                    "id IN (
                    WITH RECURSIVE t(name) AS (
                        SELECT (SELECT tenant FROM jobs INDEXED BY jobs_runnable
                                WHERE state IN ('queued','running') ORDER BY tenant LIMIT 1)
                        UNION ALL
                        SELECT (SELECT tenant FROM jobs INDEXED BY jobs_runnable
                                WHERE state IN ('queued','running') AND tenant > t.name
                                ORDER BY tenant LIMIT 1)
                        FROM t WHERE t.name IS NOT NULL
                    )
                    SELECT q.id FROM t, jobs q
                    WHERE t.name IS NOT NULL AND q.id IN (
                        SELECT id FROM jobs INDEXED BY jobs_runnable
                        WHERE tenant = t.name AND state IN ('queued','running')
                            AND state = 'queued'
                        ORDER BY id LIMIT $1)
                    UNION ALL
                    SELECT id FROM jobs INDEXED BY jobs_running WHERE state = 'running'
                ) ORDER BY id"
                }
                Dialect::Postgres => {
                    "id IN (
                    WITH RECURSIVE t(name) AS (
                        SELECT (SELECT tenant FROM jobs WHERE state IN ('queued','running')
                                ORDER BY tenant LIMIT 1)
                        UNION ALL
                        SELECT (SELECT tenant FROM jobs WHERE state IN ('queued','running')
                                AND tenant > t.name ORDER BY tenant LIMIT 1)
                        FROM t WHERE t.name IS NOT NULL
                    )
                    SELECT q.id FROM t CROSS JOIN LATERAL (
                        SELECT id FROM jobs
                        WHERE tenant = t.name AND state IN ('queued','running') AND state = 'queued'
                        ORDER BY id LIMIT $1
                    ) q
                    WHERE t.name IS NOT NULL
                    UNION ALL
                    SELECT id FROM jobs WHERE state = 'running'
                ) ORDER BY id"
                }
            };
            jobs_where(&mut t, filter, &[per_tenant.max(1).into()]).await
        })
    }

    async fn job_active_for(&self, session: &str) -> Result<Option<Job>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| Ok(jobs_where(
            &mut t,
            "session = $1 AND state IN ('queued','running') ORDER BY id DESC LIMIT 1",
            &[session.into()],
        )
        .await?
        .into_iter()
        .next()))
    }

    async fn job_lease_owners(&self, session: &str, now_ms: u64) -> Result<Vec<String>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| {
            t
            .rows(
                "SELECT lease_owner FROM jobs WHERE session = $1 AND state = 'running' AND lease_until_ms > $2 AND lease_owner IS NOT NULL",
                &[session.into(), now_ms.into()],
            )
            .await?
            .iter()
            .map(|r| r.text(0))
            .collect()
        })
    }

    async fn jobs_list(&self, before: Option<u64>, limit: u32) -> Result<Vec<Job>, Error> {
        let mut args = vec![before.map_or(Val::Int(i64::MAX), big), limit.into()];
        let filter = match self.bound() {
            None => "1 = 1",
            Some(t) => {
                args.push(SessionKey::column_of(t).into());
                "tenant = $3"
            }
        };
        reading!(self, |t| {
            jobs_where(
                &mut t,
                &format!("id < $1 AND {filter} ORDER BY id DESC LIMIT $2"),
                &args,
            )
            .await
        })
    }

    async fn job_counts(&self) -> Result<Vec<(String, u64)>, Error> {
        reading!(self, |t| t
            .rows(
                "SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state",
                &[]
            )
            .await?
            .iter()
            .map(|r| Ok((r.text(0)?, r.u64(1)?)))
            .collect())
    }

    async fn jobs_queued(&self) -> Result<u64, Error> {
        let (filter, args): (&str, Vec<Val>) = match self.bound() {
            None => ("1 = 1", Vec::new()),
            Some(t) => ("tenant = $1", vec![SessionKey::column_of(t).into()]),
        };
        reading!(self, |t| {
            // SQLite reads the tenant's part of the active set from the index on it.
            let index = match (t.dialect(), self.bound()) {
                (Dialect::Sqlite, Some(_)) => " INDEXED BY jobs_runnable",
                _ => "",
            };
            match t
                .row(
                    &format!("SELECT COUNT(*) FROM jobs{index} WHERE state IN ('queued','running') AND state = 'queued' AND {filter}"),
                    &args,
                )
                .await?
            {
                Some(r) => r.u64(0),
                None => Ok(0),
            }
        })
    }

    async fn jobs_prune(
        &self,
        finished_before_ms: u64,
        keep_per_tenant: u32,
    ) -> Result<u64, Error> {
        writing!(self, |t| {
            let mut gone: Vec<i64> = Vec::new();
            for r in t
                .rows(
                    "DELETE FROM jobs WHERE state IN ('succeeded','failed','cancelled') AND finished_ms < $1 RETURNING id",
                    &[big(finished_before_ms)],
                )
                .await?
            {
                gone.push(r.int(0)?);
            }
            // Each tenant's newest `keep_per_tenant` finished jobs stay.
            let sql = "DELETE FROM jobs WHERE id IN (
                   SELECT id FROM (
                     SELECT id, ROW_NUMBER() OVER (PARTITION BY tenant ORDER BY id DESC) AS n
                     FROM jobs WHERE state IN ('succeeded','failed','cancelled')) ranked
                   WHERE n > $1)
                 RETURNING id";
            for r in t.rows(sql, &[keep_per_tenant.into()]).await? {
                gone.push(r.int(0)?);
            }
            for id in &gone {
                t.exec("DELETE FROM events WHERE job = $1", &[Val::Int(*id)])
                    .await?;
            }
            Ok(gone.len() as u64)
        })
    }
}

/// SQLite's hint to read `index` (its planner picks a worse one for these reads); PostgreSQL
/// plans them well itself.
fn indexed_by(d: Dialect, index: &str) -> String {
    match d {
        Dialect::Sqlite => format!(" INDEXED BY {index}"),
        Dialect::Postgres => String::new(),
    }
}

/// Sessions added to the search index per write.
const INDEX_BATCH: u32 = 500;

/// Trigram rows written per statement.
const GRAMS_PER_INSERT: usize = 400;

/// A per-session text, opened.
async fn session_text(
    t: &mut impl Tx,
    what: SessionText,
    session: &SessionKey,
) -> Result<Option<String>, Error> {
    let Some(r) = t
        .row(
            &format!(
                "SELECT {}, sealed FROM {} WHERE session = $1",
                what.column, what.table
            ),
            &[session.into()],
        )
        .await?
    else {
        return Ok(None);
    };
    let stored = Stored {
        bytes: r.bytes(0)?,
        sealed: r.int(1)? as u32,
    };
    t.reveal(session.tenant(), what.place, session.key(), stored)
        .await
        .map(Some)
}

/// A session of `tenant` (its stored key) and its opened name, from a row of `SELECT id,
/// label, sealed` (the name NULL when it has none).
async fn label_row(
    t: &mut impl Tx,
    tenant: &Tenant,
    r: &Row,
) -> Result<(String, Option<String>), Error> {
    let id = r.text(0)?;
    let label = match r.opt_int(2)? {
        None => None,
        Some(sealed) => {
            let stored = Stored {
                bytes: r.bytes(1)?,
                sealed: sealed as u32,
            };
            Some(
                t.reveal(tenant.name(), SessionText::LABEL.place, &id, stored)
                    .await?,
            )
        }
    };
    Ok((id, label))
}

/// Add the tenant's sessions not yet in the search index (new, or renamed since), with the
/// trigrams of their ids and opened names, [`INDEX_BATCH`] to a write (writers wait for one
/// batch, never for a whole backlog). The steady state costs one lookup in a partial index of
/// the pending ones. The rows are locked (PostgreSQL: in id order; SQLite's write holds the
/// file) while they are read and indexed, so a rename (written first, then the index reset)
/// is never lost and two searches never index one session at once.
async fn index_sessions<B: Backend>(b: &B, owner: &Tenant, key: &[u8]) -> Result<(), Error> {
    let tenant = SessionKey::column_of(owner);
    loop {
        let pending = reading!(b, |t| {
            let hint = indexed_by(t.dialect(), "sessions_ungrammed");
            t.row(
                &format!("SELECT 1 FROM sessions{hint} WHERE tenant = $1 AND grams = 0 LIMIT 1"),
                &[tenant.into()],
            )
            .await
        })?;
        if pending.is_none() {
            return Ok(());
        }
        let done = writing!(b, |t| {
            let d = t.dialect();
            let (hint, lock) = match d {
                Dialect::Sqlite => (indexed_by(d, "sessions_ungrammed"), ""),
                Dialect::Postgres => (String::new(), " FOR UPDATE OF s"),
            };
            let rows = t
                .rows(
                    &format!("SELECT s.id, l.label, l.sealed FROM sessions s{hint} LEFT JOIN session_labels l ON l.session = s.id WHERE s.tenant = $1 AND s.grams = 0 ORDER BY s.id LIMIT $2{lock}"),
                    &[tenant.into(), INDEX_BATCH.into()],
                )
                .await?;
            if rows.is_empty() {
                // Another search added them meanwhile (a locked row is read again once its
                // lock is released, and skipped when it no longer matches).
                return Ok(true);
            }
            for r in &rows {
                let (id, label) = label_row(&mut t, owner, r).await?;
                let texts =
                    rules::searchable(owner.session_of(&id).unwrap_or(&id), label.as_deref());
                let grams: Vec<i64> = rules::gram_hashes(key, texts.iter().map(String::as_str))
                    .into_iter()
                    .collect();
                for chunk in grams.chunks(GRAMS_PER_INSERT) {
                    let mut sql =
                        String::from("INSERT INTO session_grams (tenant, gram, session) VALUES ");
                    let mut args: Vec<Val> = vec![tenant.into(), id.as_str().into()];
                    for (k, g) in chunk.iter().enumerate() {
                        if k > 0 {
                            sql.push_str(", ");
                        }
                        args.push(Val::Int(*g));
                        sql.push_str(&format!("($1, ${}, $2)", args.len()));
                    }
                    sql.push_str(" ON CONFLICT DO NOTHING");
                    t.exec(&sql, &args).await?;
                }
                t.exec(
                    "UPDATE sessions SET grams = 1 WHERE id = $1",
                    &[id.as_str().into()],
                )
                .await?;
            }
            Ok(false)
        })?;
        if done {
            return Ok(());
        }
    }
}

/// Write (or, with `None`, delete) a per-session text, sealed.
async fn write_session_text<B: Backend>(
    b: &B,
    what: SessionText,
    session: &SessionKey,
    text: Option<&str>,
) -> Result<(), Error> {
    writing!(b, |t| {
        match text {
            None => {
                t.exec(
                    &format!("DELETE FROM {} WHERE session = $1", what.table),
                    &[session.into()],
                )
                .await?
            }
            Some(v) => {
                let sealed = t
                    .seal(session.tenant(), what.place, session.key(), v)
                    .await?;
                let version = sealed.1;
                let value = sealed_val(t.dialect(), sealed);
                t.exec(
                    &format!(
                        "INSERT INTO {table} (session, {col}, sealed) VALUES ($1, $2, $3)
                         ON CONFLICT (session) DO UPDATE SET {col} = excluded.{col}, sealed = excluded.sealed",
                        table = what.table,
                        col = what.column
                    ),
                    &[session.into(), value, version.into()],
                )
                .await?
            }
        };
        Ok(())
    })
}

/// Write a per-session text; a new name takes the session out of the search index until the
/// next search adds it again (after the write: a search that read the old name is undone
/// here).
async fn set_session_text<B: Backend>(
    b: &B,
    what: SessionText,
    session: &SessionKey,
    text: Option<&str>,
) -> Result<(), Error> {
    write_session_text(b, what, session, text).await?;
    if what.table == SessionText::LABEL.table {
        writing!(b, |t| {
            t.exec(
                "UPDATE sessions SET grams = 0 WHERE id = $1",
                &[session.into()],
            )
            .await?;
            t.exec(
                "DELETE FROM session_grams WHERE session = $1",
                &[session.into()],
            )
            .await?;
            Ok(())
        })?;
    }
    Ok(())
}

#[async_trait]
impl<B: Backend> SourceStore for Sql<B> {
    async fn source(&self, path: &str) -> Result<Option<Source>, Error> {
        reading!(self, |t| {
            match t
            .row(
                "SELECT path, size, mtime_ms, sha256, status, sessions, episodes, detail FROM sources WHERE path = $1",
                &[path.into()],
            )
            .await?
        {
            None => Ok(None),
            Some(r) => Ok(Some(Source {
                path: r.text(0)?,
                size: r.u64(1)?,
                mtime_ms: r.u64(2)?,
                sha256: r.text(3)?,
                status: r.text(4)?,
                sessions: serde_json::from_str(&r.text(5)?).unwrap_or_default(),
                episodes: r.u64(6)?,
                detail: r.opt_text(7)?,
            })),
        }
        })
    }

    async fn put_source(&self, s: &Source, now_ms: u64) -> Result<(), Error> {
        writing!(self, |t| {
            t
            .exec(
                "INSERT INTO sources (path, size, mtime_ms, sha256, status, sessions, episodes, detail, updated_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (path) DO UPDATE SET size = excluded.size, mtime_ms = excluded.mtime_ms, sha256 = excluded.sha256, status = excluded.status, sessions = excluded.sessions, episodes = excluded.episodes, detail = excluded.detail, updated_ms = excluded.updated_ms",
                &[
                    s.path.as_str().into(),
                    big(s.size),
                    big(s.mtime_ms),
                    s.sha256.as_str().into(),
                    s.status.as_str().into(),
                    serde_json::to_string(&s.sessions)
                        .expect("strings serialize")
                        .into(),
                    big(s.episodes),
                    s.detail.as_deref().into(),
                    now_ms.into(),
                ],
            )
            .await
            .map(drop)
        })
    }

    async fn watched_files(&self) -> Result<Vec<WatchedFile>, Error> {
        reading!(self, |t| t
            .rows(
                "SELECT path, session, format, \"offset\", lines FROM watched_files ORDER BY path",
                &[],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(WatchedFile {
                    path: r.text(0)?,
                    session: r.opt_text(1)?,
                    format: r.opt_text(2)?,
                    offset: r.u64(3)?,
                    lines: r.opt_int(4)?.map(|n| n as u64),
                })
            })
            .collect())
    }

    async fn put_watched(&self, f: &WatchedFile, now_ms: u64) -> Result<(), Error> {
        writing!(self, |t| {
            t
            .exec(
                "INSERT INTO watched_files (path, session, format, \"offset\", lines, updated_ms) VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (path) DO UPDATE SET session = excluded.session, format = excluded.format, \"offset\" = excluded.\"offset\", lines = excluded.lines, updated_ms = excluded.updated_ms",
                &[
                    f.path.as_str().into(),
                    f.session.as_deref().into(),
                    f.format.as_deref().into(),
                    big(f.offset),
                    f.lines.map(big).unwrap_or(Val::Null),
                    now_ms.into(),
                ],
            )
            .await
            .map(drop)
        })
    }

    async fn record_mark(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            t
            .exec(
                "INSERT INTO source_marks (session, path, last_episode, bytes) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session, path, last_episode) DO UPDATE SET bytes = excluded.bytes",
                &[session.into(), path.into(), big(last_episode), big(bytes)],
            )
            .await
            .map(drop)
        })
    }

    async fn mark_covering(&self, session: &str, last_episode: u64) -> Result<Option<Mark>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| {
            match t
            .row(
                "SELECT path, last_episode, bytes FROM source_marks WHERE session = $1 AND last_episode <= $2 ORDER BY last_episode DESC, bytes DESC LIMIT 1",
                &[session.into(), big(last_episode)],
            )
            .await?
        {
            None => Ok(None),
            Some(r) => Ok(Some(Mark {
                path: r.text(0)?,
                last_episode: r.u64(1)?,
                bytes: r.u64(2)?,
            })),
        }
        })
    }

    async fn session_mode(&self, session: &str) -> Result<Option<SessionMode>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| match t
            .row(
                "SELECT mode, quiescence_secs FROM session_modes WHERE session = $1",
                &[session.into()],
            )
            .await?
        {
            None => Ok(None),
            Some(r) => Ok(Some(SessionMode {
                mode: Mode::parse(&r.text(0)?).unwrap_or(Mode::Eager),
                quiescence_secs: r.opt_int(1)?.map(|x| x as u32),
            })),
        })
    }

    async fn set_session_mode(&self, session: &str, m: Option<&SessionMode>) -> Result<(), Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            match m {
                None => {
                    t.exec(
                        "DELETE FROM session_modes WHERE session = $1",
                        &[session.into()],
                    )
                    .await?
                }
                Some(m) => {
                    t.exec(
                        "INSERT INTO session_modes (session, mode, quiescence_secs) VALUES ($1, $2, $3)
                         ON CONFLICT (session) DO UPDATE SET mode = excluded.mode, quiescence_secs = excluded.quiescence_secs",
                        &[session.into(), m.mode.as_str().into(), m.quiescence_secs.into()],
                    )
                    .await?
                }
            };
            Ok(())
        })
    }

    async fn session_focus(&self, session: &str) -> Result<Option<String>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| session_text(&mut t, SessionText::FOCUS, session)
            .await)
    }

    async fn set_session_focus(&self, session: &str, focus: Option<&str>) -> Result<(), Error> {
        let session = &self.name(session)?;
        set_session_text(&*self.db, SessionText::FOCUS, session, focus).await
    }

    async fn session_label(&self, session: &str) -> Result<Option<String>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| session_text(&mut t, SessionText::LABEL, session)
            .await)
    }

    async fn set_session_label(&self, session: &str, label: Option<&str>) -> Result<(), Error> {
        let session = &self.name(session)?;
        set_session_text(&*self.db, SessionText::LABEL, session, label).await
    }

    async fn sessions_count(&self) -> Result<u64, Error> {
        let tenant = self.column();
        reading!(self, |t| {
            let hint = indexed_by(t.dialect(), "sessions_tenant_change");
            match t
                .row(
                    &format!("SELECT COUNT(*) FROM sessions{hint} WHERE tenant = $1"),
                    &[tenant.into()],
                )
                .await?
            {
                Some(r) => r.u64(0),
                None => Ok(0),
            }
        })
    }

    async fn sessions_page(&self, offset: u64, limit: u32) -> Result<Vec<String>, Error> {
        let tenant = self.column();
        let keys = reading!(self, |t| {
            let hint = indexed_by(t.dialect(), "sessions_tenant_change");
            t.rows(
                &format!("SELECT id FROM sessions{hint} WHERE tenant = $1 ORDER BY changed_seq DESC, id LIMIT $2 OFFSET $3"),
                &[tenant.into(), limit.into(), big(offset)],
            )
            .await?
            .iter()
            .map(|r| r.text(0))
            .collect()
        })?;
        Ok(self.ids(keys))
    }

    async fn sessions_prefixed(
        &self,
        prefix: &str,
        limit: u32,
    ) -> Result<(Vec<String>, u64), Error> {
        let tenant = self.column();
        let prefix = self.name(prefix)?;
        let prefix = prefix.key();
        let (keys, total) = reading!(self, |t| {
            // SQLite: the key range [prefix, bound) of the primary key (`+tenant`: the
            // tenant's index, which would read every session of the tenant, is not the one to
            // use). PostgreSQL: LIKE with the prefix escaped, on an index of the ids by
            // pattern (byte order).
            let (filter, order, args): (&str, &str, Vec<Val>) = match t.dialect() {
                Dialect::Sqlite => {
                    let bound = rules::prefix_bound(prefix);
                    let bound = bound.as_deref().unwrap_or("\u{10FFFF}\u{10FFFF}");
                    (
                        "id >= $2 AND id < $3 AND +tenant = $1",
                        "id",
                        vec![tenant.into(), prefix.into(), bound.into()],
                    )
                }
                Dialect::Postgres => {
                    let pattern = format!(
                        "{}%",
                        prefix
                            .replace('\\', "\\\\")
                            .replace('%', "\\%")
                            .replace('_', "\\_")
                    );
                    (
                        "tenant = $1 AND id LIKE $2",
                        "id COLLATE \"C\"",
                        vec![tenant.into(), pattern.into()],
                    )
                }
            };
            let total = match t
                .row(
                    &format!("SELECT COUNT(*) FROM sessions WHERE {filter}"),
                    &args,
                )
                .await?
            {
                Some(r) => r.u64(0)?,
                None => 0,
            };
            let mut page = args.clone();
            page.push(limit.into());
            let ids = t
                .rows(
                    &format!(
                        "SELECT id FROM sessions WHERE {filter} ORDER BY {order} LIMIT ${}",
                        page.len()
                    ),
                    &page,
                )
                .await?
                .iter()
                .map(|r| r.text(0))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((ids, total))
        })?;
        Ok((self.ids(keys), total))
    }

    async fn sessions_labelled(&self, q: &str) -> Result<Vec<(String, Option<String>)>, Error> {
        let tenant = self.column();
        let owner = self.owner();
        let (key, query) = crate::tables::search_grams(self, owner.name(), q).await?;
        index_sessions(&*self.db, &owner, &key).await?;
        reading!(self, |t| {
            let rows = if query.is_empty() {
                let hint = indexed_by(t.dialect(), "sessions_tenant_change");
                t.rows(
                    &format!("SELECT s.id, l.label, l.sealed FROM sessions s{hint} LEFT JOIN session_labels l ON l.session = s.id WHERE s.tenant = $1 ORDER BY s.changed_seq DESC, s.id"),
                    &[tenant.into()],
                )
                .await?
            } else {
                // The rarest trigrams first (counted only as far as telling them apart needs):
                // the first gives the candidates, the others must be held by each.
                let mut counted = Vec::with_capacity(query.len());
                for &g in &query {
                    let n = match t
                        .row(
                            "SELECT COUNT(*) FROM (SELECT 1 FROM session_grams WHERE tenant = $1 AND gram = $2 LIMIT $3) x",
                            &[tenant.into(), Val::Int(g), rules::GRAM_COUNT_CAP.into()],
                        )
                        .await?
                    {
                        Some(r) => r.int(0)?,
                        None => 0,
                    };
                    counted.push((n, g));
                }
                let Some(grams) = rules::rarest_grams(counted) else {
                    return Ok(Vec::new());
                };
                let mut sql = String::from(
                    "SELECT s.id, l.label, l.sealed FROM session_grams g0 JOIN sessions s ON s.id = g0.session LEFT JOIN session_labels l ON l.session = s.id WHERE g0.tenant = $1 AND g0.gram = $2",
                );
                let mut args: Vec<Val> = vec![tenant.into()];
                for (k, g) in grams.into_iter().enumerate() {
                    args.push(Val::Int(g));
                    if k > 0 {
                        sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM session_grams g WHERE g.tenant = $1 AND g.gram = ${} AND g.session = g0.session)", k + 2));
                    }
                }
                sql.push_str(" ORDER BY s.changed_seq DESC, s.id");
                t.rows(&sql, &args).await?
            };
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let (key, label) = label_row(&mut t, &owner, r).await?;
                if let Some(id) = self.id_of(&key) {
                    out.push((id.to_string(), label));
                }
            }
            Ok(out)
        })
    }

    async fn pins(&self, session: &str) -> Result<Vec<u64>, Error> {
        let session = &self.name(session)?;
        reading!(self, |t| t
            .rows(
                "SELECT episode FROM session_pins WHERE session = $1 ORDER BY episode",
                &[session.into()],
            )
            .await?
            .iter()
            .map(|r| r.u64(0))
            .collect())
    }

    async fn set_pin(&self, session: &str, episode: u64, pinned: bool) -> Result<bool, Error> {
        let session = &self.name(session)?;
        writing!(self, |t| {
            let n = if pinned {
                t.exec(
                    "INSERT INTO session_pins (session, episode) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[session.into(), big(episode)],
                )
                .await?
            } else {
                t.exec(
                    "DELETE FROM session_pins WHERE session = $1 AND episode = $2",
                    &[session.into(), big(episode)],
                )
                .await?
            };
            Ok(n > 0)
        })
    }
}

#[async_trait]
impl<B: Backend> crate::tables::SlotStore for Sql<B> {
    /// Slots are kept in the store when other processes share it (PostgreSQL); one process
    /// (SQLite) bounds model requests with its own semaphores, and the store grants every slot.
    fn slots_shared(&self) -> bool {
        self.shared()
    }

    async fn slot_take(
        &self,
        pool: &str,
        owner: &str,
        max: usize,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<u64>, Error> {
        if !self.shared() {
            return Ok(Some(0));
        }
        writing!(self, |t| {
            // Takers of one pool take turns, so the count and the insert are one step.
            t.take_turn(&format!("slots:{pool}")).await?;
            t.exec(
                "DELETE FROM model_slots WHERE tenant = $1 AND until_ms <= $2",
                &[pool.into(), big(now_ms)],
            )
            .await?;
            let held = match t
                .row(
                    "SELECT COUNT(*) FROM model_slots WHERE tenant = $1",
                    &[pool.into()],
                )
                .await?
            {
                Some(r) => r.u64(0)?,
                None => 0,
            };
            if held as usize >= max {
                return Ok(None);
            }
            t.row(
                "INSERT INTO model_slots (tenant, owner, until_ms) VALUES ($1, $2, $3) RETURNING id",
                &[pool.into(), owner.into(), big(until_ms)],
            )
            .await?
            .map(|r| r.u64(0))
            .transpose()
        })
    }

    async fn slot_release(&self, id: u64) -> Result<(), Error> {
        if !self.shared() {
            return Ok(());
        }
        writing!(self, |t| t
            .exec("DELETE FROM model_slots WHERE id = $1", &[big(id)])
            .await
            .map(drop))
    }

    async fn slot_renew(&self, owner: &str, until_ms: u64) -> Result<(), Error> {
        if !self.shared() {
            return Ok(());
        }
        writing!(self, |t| t
            .exec(
                "UPDATE model_slots SET until_ms = $2 WHERE owner = $1",
                &[owner.into(), big(until_ms)],
            )
            .await
            .map(drop))
    }
}

/// The full-text index's key of the tenant whose sessions' `tenant` column is `column` (read
/// before a transaction: the lexical key may be made on first use).
pub(crate) async fn terms_key<B: crate::RecallStore + ?Sized>(
    b: &B,
    column: &str,
) -> Result<Vec<u8>, Error> {
    let name = crate::tenant::name_of_column(column);
    Ok(crate::terms::terms_key(
        name,
        b.lexical_key(name).await?.as_deref(),
    ))
}

#[async_trait]
impl<B: Backend> crate::tables::IndexStore for Sql<B> {
    async fn unindexed(&self) -> Result<(u64, u64), Error> {
        reading!(self, |t| {
            match t
            .row(
                "SELECT COUNT(*), CAST(COALESCE(SUM(episodes), 0) AS BIGINT) FROM sessions WHERE indexed = 0",
                &[]
            )
            .await?
        {
            Some(r) => Ok((r.u64(0)?, r.u64(1)?)),
            None => Ok((0, 0)),
        }
        })
    }

    async fn next_unindexed(&self) -> Result<Option<(Tenant, String)>, Error> {
        let (filter, args): (&str, Vec<Val>) = match self.bound() {
            None => ("", Vec::new()),
            Some(t) => (" AND tenant = $1", vec![SessionKey::column_of(t).into()]),
        };
        let row = reading!(self, |t| t
            .row(
                &format!(
                    "SELECT id, tenant FROM sessions WHERE indexed = 0{filter} ORDER BY id LIMIT 1"
                ),
                &args
            )
            .await)?;
        let Some(r) = row else {
            return Ok(None);
        };
        let key = r.text(0)?;
        let tenant = Tenant::new(crate::tenant::name_of_column(&r.text(1)?))
            .map_err(|e| Error::Storage(format!("session row: {e}")))?;
        let id = tenant.session_of(&key).unwrap_or(&key).to_string();
        Ok(Some((tenant, id)))
    }

    async fn index_episodes(
        &self,
        session: &str,
        docs: &[(u64, String)],
        done: bool,
    ) -> Result<u32, Error> {
        let session = &self.name(session)?;
        let key = terms_key(self, session.column()).await?;
        writing!(self, |t| {
            let added = crate::terms::index(&mut t, &key, session, docs, false).await?;
            if done {
                t.exec(
                    "UPDATE sessions SET indexed = 1 WHERE id = $1",
                    &[session.into()],
                )
                .await?;
            }
            Ok(added)
        })
    }
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests {
    use super::*;

    async fn tokens_named(b: &impl Backend, hash: &str) -> usize {
        let mut t = b.begin(false).await.unwrap();
        t.rows("SELECT id FROM tokens WHERE hash = $1", &[hash.into()])
            .await
            .unwrap()
            .len()
    }

    /// A write transaction keeps its statements only when committed: one dropped (an error in
    /// its body, a request that went away) leaves nothing, and the store serves the next.
    async fn commits_and_rollbacks(name: &str, b: &impl Backend) -> Result<(), Error> {
        let insert = "INSERT INTO tokens (tenant, hash, prefix, read_only, label, created_ms) VALUES ($1, $2, 'p', 0, NULL, 1)";
        let mut t = b.begin(true).await.unwrap();
        t.exec(insert, &["acme".into(), "dropped".into()])
            .await
            .unwrap();
        drop(t);
        assert_eq!(tokens_named(b, "dropped").await, 0, "{name}");

        let failed: Result<(), Error> = writing!(b, |t| {
            t.exec(insert, &["acme".into(), "failed".into()]).await?;
            Err(Error::Conflict("the body failed after its insert".into()))
        });
        assert!(failed.is_err(), "{name}");
        assert_eq!(tokens_named(b, "failed").await, 0, "{name}");

        let kept: Result<u64, Error> = writing!(b, |t| {
            t.exec(insert, &["acme".into(), "kept".into()]).await
        });
        assert_eq!(kept.unwrap(), 1, "{name}");
        assert_eq!(tokens_named(b, "kept").await, 1, "{name}");
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_is_kept_only_when_committed_on_either_store() {
        let dir = tempfile::tempdir().unwrap();
        let file = crate::SqliteStore::open(&dir.path().join("a.db")).unwrap();
        commits_and_rollbacks("sqlite file", &*file.db)
            .await
            .unwrap();
        let memory = crate::SqliteStore::in_memory().unwrap();
        commits_and_rollbacks("sqlite in memory", &*memory.db)
            .await
            .unwrap();
        if let Some(pg) = abridge_test_pg::shared() {
            let url = pg.database("once_commits");
            let store = crate::PgStore::connect(&url).await.unwrap();
            commits_and_rollbacks("postgres", &*store.db).await.unwrap();
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod sqlite_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::types::{MemoryFilter, NewEpisode, Role};
    use crate::{RecallStore, SqliteStore, Store};

    fn said(i: usize) -> NewEpisode {
        NewEpisode {
            terms: format!("word{i}"),
            role: Role::User,
            content: format!("message {i}"),
            source_key: format!("k{i}"),
            tokens: 3,
            ..Default::default()
        }
    }

    /// Tasks that each wait for the connection both ways at once (a transaction's read beside
    /// a call that blocks for it), among writers, all finish: the connection's lock queues no
    /// waiter that only a blocked task could take its turn for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_and_writers_waiting_both_ways_at_once_all_finish() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(SqliteStore::open(&dir.path().join("a.db")).unwrap());
        let mut tasks = Vec::new();
        for n in 0..8 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..40 {
                    let session = format!("s{n}");
                    s.append_episodes(&session, vec![said(i)]).await.unwrap();
                    let filter = MemoryFilter::default();
                    let (stats, listed) =
                        tokio::join!(s.stats(&session), s.list_memories("acme", &filter, 0, 5));
                    assert!(stats.unwrap().episodes > 0);
                    listed.unwrap();
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("every task finishes")
                .unwrap();
        }
    }
}
