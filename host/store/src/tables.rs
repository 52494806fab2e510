//! The app's own tables behind traits, beside the engine's [`Store`]: durable jobs, imported
//! files and their marks, watched files, per-session modes and API tokens. Every store
//! implements all of them ([`super::SqliteStore`], in a file or in memory, and the PostgreSQL
//! store), so the app runs on any of them and a session's state lives in one place:
//! [`Store::reset_session`] clears all of it.
//!
//! Each call is atomic. Policy stays out of the stores: which lease is live and whose owner is
//! gone is decided by the app's job service and handed in; token hashing is done by
//! the app's token service.

use std::sync::Arc;

use async_trait::async_trait;

use super::Store;
use crate::control::Progress;
use crate::jobs::{Beat, Claim, Job, JobState};
use crate::sources::{Mark, SessionMode, Source, WatchedFile};
use crate::types::{Episode, Error};

/// A tenant's cap on running jobs, checked by a claim (across every process sharing the
/// store): the claim is busy while `max` jobs of `tenant` run under leases lasting past now.
#[derive(Clone, Copy, Debug)]
pub struct TenantCap<'a> {
    /// The tenant.
    pub tenant: &'a crate::tenant::Tenant,
    /// How many may run at once.
    pub max: usize,
}

/// Decides whether a running job's lease is held by a live worker other than the caller.
pub type Liveness<'a> = &'a (dyn Fn(&Job) -> bool + Send + Sync);

/// Durable jobs (see [`crate::jobs`]).
#[async_trait]
pub trait JobStore: Send + Sync {
    /// The active (queued or running) job for (`session`, `target`), or a new queued one
    /// recorded with `config` (JSON); and whether it was created.
    async fn job_enqueue(
        &self,
        session: &str,
        target: u64,
        config: &str,
        now_ms: u64,
    ) -> Result<(Job, bool), Error>;
    /// One job.
    async fn job_get(&self, id: u64) -> Result<Option<Job>, Error>;
    /// Take job `id` for `owner` until `until_ms`: a job in a final state is
    /// [`Claim::Finished`]; one that `live` says another worker holds, or whose session has
    /// another running job `live` says so of, or whose tenant already runs `cap.max` jobs
    /// under leases lasting past `now_ms`, is [`Claim::Busy`]; otherwise it becomes running
    /// under the new lease with one more attempt.
    async fn job_claim(
        &self,
        id: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
        live: Liveness<'_>,
        cap: Option<TenantCap<'_>>,
    ) -> Result<Claim, Error>;
    /// Renew `owner`'s lease and record progress; [`Beat::Lost`] when `owner` no longer
    /// holds the running job, [`Beat::Cancel`] when a cancel was asked.
    async fn job_heartbeat(
        &self,
        id: u64,
        owner: &str,
        until_ms: u64,
        progress: Progress,
        answers: u64,
        now_ms: u64,
    ) -> Result<Beat, Error>;
    /// Record the plan's expected call count.
    async fn job_set_planned(&self, id: u64, calls: u32) -> Result<(), Error>;
    /// Put a job in a final state and drop its lease.
    async fn job_finish(
        &self,
        id: u64,
        state: JobState,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), Error>;
    /// Cancel a queued job now; ask a running one's worker to stop.
    async fn job_cancel(&self, id: u64, now_ms: u64) -> Result<(), Error>;
    /// Give a running job `owner` holds back to the queue; false when it did not hold it.
    async fn job_release(&self, id: u64, owner: &str, now_ms: u64) -> Result<bool, Error>;
    /// Queued and running jobs, oldest first.
    async fn jobs_active(&self) -> Result<Vec<Job>, Error>;
    /// A worker's candidates, oldest first: every running job (the caller checks whose lease
    /// ran out) and each tenant's oldest `per_tenant` queued jobs. Reads about (tenants with
    /// active jobs × `per_tenant` + running jobs) rows, however long a tenant's queue is.
    async fn jobs_runnable(&self, per_tenant: u32) -> Result<Vec<Job>, Error>;
    /// The newest active job of a session.
    async fn job_active_for(&self, session: &str) -> Result<Option<Job>, Error>;
    /// Lease owners of the session's running jobs whose lease lasts past `now_ms`.
    async fn job_lease_owners(&self, session: &str, now_ms: u64) -> Result<Vec<String>, Error>;
    /// The view's jobs (a bound view's: its tenant's; the whole view's: every tenant's) with
    /// `id < before` (all when `None`), newest first, at most `limit`.
    async fn jobs_list(&self, before: Option<u64>, limit: u32) -> Result<Vec<Job>, Error>;
    /// Jobs by state, ordered by state name.
    async fn job_counts(&self) -> Result<Vec<(String, u64)>, Error>;
    /// How many of the view's jobs are queued (a bound view's: read from its tenant's own part
    /// of the active set; the whole view's: every tenant's).
    async fn jobs_queued(&self) -> Result<u64, Error>;
    /// Retention: delete finished jobs (succeeded, failed, cancelled) that finished before
    /// `finished_before_ms`, and each tenant's finished jobs beyond its newest `keep_per_tenant`,
    /// with the events that name them; queued and running jobs are never touched. How many
    /// jobs went.
    async fn jobs_prune(&self, finished_before_ms: u64, keep_per_tenant: u32)
    -> Result<u64, Error>;
}

/// Imported files, watched files, how far summaries reach into files, per-session modes.
#[async_trait]
pub trait SourceStore: Send + Sync {
    /// What is recorded of an imported file.
    async fn source(&self, path: &str) -> Result<Option<Source>, Error>;
    /// Record (or replace) what is known of an imported file.
    async fn put_source(&self, source: &Source, now_ms: u64) -> Result<(), Error>;
    /// Every watched file, by path.
    async fn watched_files(&self) -> Result<Vec<WatchedFile>, Error>;
    /// Record a watched file's state.
    async fn put_watched(&self, file: &WatchedFile, now_ms: u64) -> Result<(), Error>;
    /// After importing `path` up to `bytes`, `session`'s newest episode is `last_episode`.
    async fn record_mark(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error>;
    /// The furthest mark of `session` at or before `last_episode`.
    async fn mark_covering(&self, session: &str, last_episode: u64) -> Result<Option<Mark>, Error>;
    /// A session's own refresh mode.
    async fn session_mode(&self, session: &str) -> Result<Option<SessionMode>, Error>;
    /// Set (`Some`) or clear (`None`) a session's own refresh mode.
    async fn set_session_mode(
        &self,
        session: &str,
        mode: Option<&SessionMode>,
    ) -> Result<(), Error>;
    /// A session's focus instructions for its fold prompts.
    async fn session_focus(&self, session: &str) -> Result<Option<String>, Error>;
    /// Set (`Some`) or clear (`None`) a session's focus.
    async fn set_session_focus(&self, session: &str, focus: Option<&str>) -> Result<(), Error>;
    /// A session's display names as stored (JSON `{"title", "project"}`), sealed like the
    /// focus.
    async fn session_label(&self, session: &str) -> Result<Option<String>, Error>;
    /// Set (`Some`) or clear (`None`) a session's display names.
    async fn set_session_label(&self, session: &str, label: Option<&str>) -> Result<(), Error>;
    /// The view's tenant's sessions (the whole view's: the local tenant's), most recently
    /// changed first: `limit` from `offset`. Read from the tenant's part of an index, never
    /// another tenant's sessions.
    async fn sessions_page(&self, offset: u64, limit: u32) -> Result<Vec<String>, Error>;
    /// How many sessions the view's tenant has (counted in its part of the index).
    async fn sessions_count(&self) -> Result<u64, Error>;
    /// The view's tenant's sessions whose id starts with `prefix`, in id order: the first
    /// `limit`, and how many there are. Read from a key range of an index, never the
    /// tenant's other sessions.
    async fn sessions_prefixed(
        &self,
        prefix: &str,
        limit: u32,
    ) -> Result<(Vec<String>, u64), Error>;
    /// The view's tenant's sessions that may match a search for `q`, with their display names as
    /// stored (opened), most recently changed first: every session whose id (as its tenant
    /// sees it) or a name contains `q`, ignoring case, and perhaps others (the caller checks
    /// each). The SQL stores read a trigram index (`rules::gram_hashes`) and only the sessions
    /// holding every looked-up trigram of `q`; a `q` of fewer than three characters has none,
    /// and then every session of the tenant is returned.
    async fn sessions_labelled(&self, q: &str) -> Result<Vec<(String, Option<String>)>, Error>;
    /// A session's pinned episodes, ascending.
    async fn pins(&self, session: &str) -> Result<Vec<u64>, Error>;
    /// Pin (`true`) or unpin (`false`) one episode; returns whether anything changed.
    async fn set_pin(&self, session: &str, episode: u64, pinned: bool) -> Result<bool, Error>;
}

/// An API token as stored and listed: never the token (the store also keeps its hash).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TokenRow {
    /// Row id (what `tokens revoke` takes).
    pub id: u64,
    /// Tenant name.
    pub tenant: String,
    /// The first characters of the token, to recognise it.
    pub prefix: String,
    /// Whether it may only read.
    pub read_only: bool,
    /// A label given at creation.
    pub label: Option<String>,
    /// Created, ms since the epoch.
    pub created_ms: u64,
    /// Revoked, ms since the epoch.
    pub revoked_ms: Option<u64>,
}

/// What removing a session's newest episode did (see [`SessionRows::pop_episode`]).
#[derive(Clone, Debug)]
pub struct Popped {
    /// The episode removed.
    pub episode: Episode,
    /// The item its client stored with it (JSON text), if any.
    pub item: Option<String>,
    /// Summary rows deleted because they covered it.
    pub dropped: Vec<u64>,
    /// Rows those had folded, active again.
    pub reopened: Vec<u64>,
}

/// What only the app asks of a session's rows (the engine's imports never do): the list of
/// sessions, removing the newest episode, and the items clients stored with episodes.
#[async_trait]
pub trait SessionRows: Send + Sync {
    /// Known sessions, most recently changed first.
    async fn sessions(&self) -> Result<Vec<String>, Error>;
    /// Remove the session's newest episode in one transaction: the summary rows covering it
    /// go and the rows they had folded become active again (the store rule `pop_plan`), its
    /// pin and the session's `summary.written` events go, and a running job of the session is
    /// asked to stop. `None` for a session without episodes.
    async fn pop_episode(&self, session: &str) -> Result<Option<Popped>, Error>;
    /// The items clients stored with episodes `ids` of `session` (the WIT `new-episode.item`),
    /// by episode; an episode stored without one, or not stored, is absent.
    async fn items(
        &self,
        session: &str,
        ids: &[u64],
    ) -> Result<std::collections::BTreeMap<u64, String>, Error>;
}

/// API tokens (see the app's token service).
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Store a new token's hash; returns its row id.
    async fn insert_token(
        &self,
        tenant: &str,
        hash: &str,
        prefix: &str,
        read_only: bool,
        label: Option<&str>,
        now_ms: u64,
    ) -> Result<u64, Error>;
    /// The view's tokens (a bound view's: its tenant's; the whole view's: every token), oldest
    /// first.
    async fn tokens(&self) -> Result<Vec<TokenRow>, Error>;
    /// Revoke a live token; false when the view has none with that id (a bound view never
    /// touches another tenant's).
    async fn revoke_token(&self, id: u64, now_ms: u64) -> Result<bool, Error>;
    /// Whether any token is live.
    async fn any_live_token(&self) -> Result<bool, Error>;
    /// The live token with this hash.
    async fn live_token(&self, hash: &str) -> Result<Option<TokenRow>, Error>;
}

/// An event as stored (see the app's events).
#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    /// The tenant's name.
    pub tenant: String,
    /// The tenant's sequence number (given by the store).
    pub id: u64,
    /// What happened (`job.queued`, `summary.written`, …).
    pub kind: String,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The stored key of the session it concerns (what [`Store::reset_session`] takes).
    pub session_key: Option<String>,
    /// The job it concerns.
    pub job: Option<u64>,
    /// Kind-specific fields, as JSON text.
    pub data: String,
}

impl EventRow {
    /// An event of `tenant`, about `session` (by id) when it concerns one: the row keys the
    /// session into the tenant's space, as [`Store::reset_session`] finds it.
    pub fn new(
        tenant: &crate::tenant::Tenant,
        kind: &str,
        at_ms: u64,
        session: Option<&str>,
        job: Option<u64>,
        data: String,
    ) -> EventRow {
        EventRow {
            tenant: tenant.name().to_string(),
            id: 0,
            kind: kind.to_string(),
            at_ms,
            session_key: session.map(|s| tenant.key(s)),
            job,
            data,
        }
    }

    /// The session the event concerns, by id, if it is `tenant`'s.
    pub fn session<'a>(&'a self, tenant: &crate::tenant::Tenant) -> Option<&'a str> {
        tenant.session_of(self.session_key.as_deref()?)
    }
}

/// The event log: per tenant, dense increasing ids, bounded to the newest events.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Store `rows` (all of `tenant`, in order; their ids are ignored) under ids following
    /// both the tenant's newest stored id and `floor`, then drop all but the tenant's newest
    /// `keep`. Returns the id of the first.
    async fn append_events(
        &self,
        tenant: &str,
        floor: u64,
        rows: &[EventRow],
        keep: usize,
    ) -> Result<u64, Error>;
    /// Every tenant's newest `keep` events, by tenant, oldest first.
    async fn recent_events(&self, keep: usize) -> Result<Vec<EventRow>, Error>;
    /// One tenant's events with `id > after`, oldest first, at most `limit`.
    async fn events_after(
        &self,
        tenant: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, Error>;
    /// Each tenant's newest event id.
    async fn event_heads(&self) -> Result<Vec<(String, u64)>, Error>;
    /// Whether other processes write events to this store too (a shared database): the bus
    /// then reads back what they wrote, so a subscriber on any instance sees every event.
    fn events_shared(&self) -> bool {
        false
    }
    /// A signal that other processes wrote events (tenant names), when the store has one
    /// (PostgreSQL's LISTEN/NOTIFY); the bus also looks every second without it.
    async fn event_signal(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        None
    }
}

/// Model request slots shared by every process on a store (a database several instances
/// share): a slot is a row with a lease its owner renews, so the per-tenant and overall
/// bounds on model requests in flight hold across instances, and a dead instance's slots
/// stop counting when their lease runs out. A store only one process uses keeps none (the
/// process's own semaphores bound it): the defaults always grant.
#[async_trait]
pub trait SlotStore: Send + Sync {
    /// Whether slots are kept here (other processes share this store).
    fn slots_shared(&self) -> bool {
        false
    }
    /// Take a slot of `pool` for `owner` until `until_ms` unless `max` slots of the pool are
    /// held under leases lasting past `now_ms`; the slot's id.
    async fn slot_take(
        &self,
        pool: &str,
        owner: &str,
        max: usize,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<u64>, Error> {
        let _ = (pool, owner, max, now_ms, until_ms);
        Ok(Some(0))
    }
    /// Give a slot back.
    async fn slot_release(&self, id: u64) -> Result<(), Error> {
        let _ = id;
        Ok(())
    }
    /// Extend the lease of every slot `owner` holds.
    async fn slot_renew(&self, owner: &str, until_ms: u64) -> Result<(), Error> {
        let _ = (owner, until_ms);
        Ok(())
    }
}

/// The full-text index's catch-up: sessions stored before the index existed (SQLite's
/// migration 34, PostgreSQL's 13) are indexed by the app in batches, their terms from the
/// guest. A session stored since is indexed as its episodes arrive.
#[async_trait]
pub trait IndexStore: Send + Sync {
    /// Sessions not yet indexed, and their episodes.
    async fn unindexed(&self) -> Result<(u64, u64), Error>;
    /// The next session not yet indexed, if any: its tenant (from the row's `tenant` column)
    /// and its id as that tenant names it (index it through the tenant's view).
    async fn next_unindexed(&self) -> Result<Option<(crate::tenant::Tenant, String)>, Error>;
    /// Index episodes of `session` (`(episode, terms)`, the guest's terms: the store keeps
    /// their keyed hashes), skipping those indexed already or no longer stored, in one
    /// transaction; with `done`, the session is indexed from then on. Returns those added.
    async fn index_episodes(
        &self,
        session: &str,
        docs: &[(u64, String)],
        done: bool,
    ) -> Result<u32, Error>;
}

/// Everything the app keeps: the engine's store and the app's tables, in one place.
pub trait AppStore:
    Store
    + SessionRows
    + JobStore
    + SourceStore
    + TokenStore
    + EventStore
    + SlotStore
    + IndexStore
    + super::RecallStore
{
    /// The same database bound to `tenant`: every call names sessions by the tenant's own
    /// ids, lists and counts only the tenant's rows, and refuses a memory call for another
    /// tenant (see [`crate::Sql`]).
    fn for_tenant(&self, tenant: &crate::tenant::Tenant) -> Arc<dyn AppStore>;
    /// The tenant this view is bound to (`None`: the whole database).
    fn tenant(&self) -> Option<&crate::tenant::Tenant>;
}

/// A tenant's session search key and a query's trigram hashes under it (`tenant`: the
/// tenant's name). The key comes from the tenant's lexical key, so the SQL stores derive it
/// the one way `RecallStore::lexical_key` does.
pub(crate) async fn search_grams<S: crate::RecallStore + ?Sized>(
    s: &S,
    tenant: &str,
    q: &str,
) -> Result<(Vec<u8>, Vec<i64>), Error> {
    let lexical = s.lexical_key(tenant).await?;
    let key = crate::rules::grams_key(lexical.as_deref());
    let query = crate::rules::gram_hashes(&key, [q]).into_iter().collect();
    Ok((key, query))
}

/// A per-session text kept in a table of its own and sealed at rest (the focus, the display
/// names): where each SQL store finds it.
#[derive(Clone, Copy)]
pub(crate) struct SessionText {
    /// The table.
    pub table: &'static str,
    /// Its text column.
    pub column: &'static str,
    /// The sealing place ([`crate::keyring::place`]).
    pub place: &'static str,
}

impl SessionText {
    /// The focus instructions.
    pub const FOCUS: SessionText = SessionText {
        table: "session_focus",
        column: "focus",
        place: crate::keyring::place::FOCUS,
    };
    /// The display names.
    pub const LABEL: SessionText = SessionText {
        table: "session_labels",
        column: "label",
        place: crate::keyring::place::LABEL,
    };
}
