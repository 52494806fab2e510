//! Tenants: every stored row belongs to one, and a tenant's view of the store cannot name
//! another's rows.
//!
//! A session of tenant `acme` is kept under the key `acme` + U+001F + the session id. A session
//! id cannot hold control characters ([`crate::text::check_session_id`]), so no id a caller
//! sends can reach into another tenant's keys. The local tenant (the CLI, and a server on
//! loopback with no tokens) keeps the bare session id, so databases written before tenants
//! existed keep working. A SQL store bound to a tenant ([`crate::AppStore::for_tenant`]) keys its
//! engine calls this way; the app layer hands only such bound stores to the engine, so no
//! request handler can forget the scope.

use std::sync::Arc;

use crate::jobs::Job;
use crate::sources::{Mark, SessionMode};
use crate::types::{ClusterSummary, Error, Memory, MemoryFilter};
use crate::{AppStore, ClusterRow, JobScope, Popped, RecallStore, UsageDay};

/// The separator between a tenant's name and a session id in a stored key.
const SEP: char = '\u{1f}';

/// A tenant's name: 1 to 64 characters of `a-z 0-9 . _ -`, starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tenant(String);

impl Tenant {
    /// The name of the tenant that owns unprefixed (pre-tenant, CLI) sessions.
    pub const LOCAL: &'static str = "local";

    /// The local tenant.
    pub fn local() -> Tenant {
        Tenant(Self::LOCAL.into())
    }

    /// A tenant by name, checked.
    pub fn new(name: &str) -> Result<Tenant, String> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric());
        if ok {
            Ok(Tenant(name.into()))
        } else {
            Err(format!(
                "tenant name '{}' is not valid: use 1 to 64 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
                crate::text::printable(name)
            ))
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Whether this is the local tenant.
    pub fn is_local(&self) -> bool {
        self.0 == Self::LOCAL
    }

    /// The stored key of one of this tenant's sessions. Only the store builds keys (through
    /// a bound [`crate::Sql`], [`TenantTables`] and [`crate::EventRow::new`]): whatever sits above it
    /// names sessions by id and its tenant by value.
    pub(crate) fn key(&self, session: &str) -> String {
        if self.is_local() {
            session.to_string()
        } else {
            format!("{}{SEP}{session}", self.0)
        }
    }

    /// The session id of a stored key, if the key is this tenant's.
    pub fn session_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        if self.is_local() {
            (!key.contains(SEP)).then_some(key)
        } else {
            key.strip_prefix(self.0.as_str())?.strip_prefix(SEP)
        }
    }

    /// The key range of this tenant's jobs (see [`JobBounds::scope`]).
    pub fn job_bounds(&self) -> JobBounds {
        JobBounds((!self.is_local()).then(|| (self.key(""), format!("{}\u{20}", self.0))))
    }

    /// The tenant a stored key belongs to.
    pub fn of_key(key: &str) -> Tenant {
        match key.split_once(SEP) {
            Some((t, _)) => Tenant(t.to_string()),
            None => Tenant::local(),
        }
    }
}

/// The tenant's name of a `tenant` column ('' is the local tenant's).
pub(crate) fn name_of_column(column: &str) -> &str {
    if column.is_empty() {
        Tenant::LOCAL
    } else {
        column
    }
}

/// The `tenant` column of a session or a job whose session is the stored key `key`: the
/// tenant's name, '' for the local tenant (keys without a separator).
pub(crate) fn tenant_column(key: &str) -> &str {
    key.split_once(SEP).map_or("", |(t, _)| t)
}

/// The stored keys of one tenant's jobs: `[T\x1f, T\x20)` for tenant T, the keys without a
/// separator for the local tenant.
#[derive(Clone, Debug)]
pub struct JobBounds(Option<(String, String)>);

impl JobBounds {
    /// The job scope these bounds make.
    pub fn scope(&self) -> JobScope<'_> {
        match &self.0 {
            None => JobScope::Local,
            Some((lo, hi)) => JobScope::Keys(lo, hi),
        }
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One tenant's view of the app's session-keyed tables (modes, focus, pins, file marks and
/// jobs): calls name a session by id, and the view keys it into the tenant's space, so no
/// layer above the store builds a key, and another tenant's rows cannot be named.
#[derive(Clone)]
pub struct TenantTables {
    db: Arc<dyn AppStore>,
    tenant: Tenant,
}

impl TenantTables {
    /// Stored keys back to this tenant's session ids (another tenant's never pass).
    fn ids(&self, keys: Vec<String>) -> Vec<String> {
        keys.iter()
            .filter_map(|k| self.tenant.session_of(k).map(str::to_string))
            .collect()
    }

    /// `tenant`'s view of `db`.
    pub fn new(db: Arc<dyn AppStore>, tenant: Tenant) -> Self {
        TenantTables { db, tenant }
    }

    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    fn k(&self, session: &str) -> String {
        self.tenant.key(session)
    }

    /// The tenant's sessions, most recently changed first.
    pub async fn sessions(&self) -> Result<Vec<String>, Error> {
        Ok(self.ids(self.db.sessions().await?))
    }

    /// Remove a session's newest episode (see [`crate::SessionRows::pop_episode`]).
    pub async fn pop_episode(&self, session: &str) -> Result<Option<Popped>, Error> {
        self.db.pop_episode(&self.k(session)).await
    }

    /// The items clients stored with episodes `ids` of a session, by episode.
    pub async fn items(
        &self,
        session: &str,
        ids: &[u64],
    ) -> Result<std::collections::BTreeMap<u64, String>, Error> {
        self.db.items(&self.k(session), ids).await
    }

    /// A session's own refresh mode.
    pub async fn session_mode(&self, session: &str) -> Result<Option<SessionMode>, Error> {
        self.db.session_mode(&self.k(session)).await
    }

    /// Set (`Some`) or clear (`None`) a session's own refresh mode.
    pub async fn set_session_mode(
        &self,
        session: &str,
        mode: Option<&SessionMode>,
    ) -> Result<(), Error> {
        self.db.set_session_mode(&self.k(session), mode).await
    }

    /// A session's focus instructions.
    pub async fn session_focus(&self, session: &str) -> Result<Option<String>, Error> {
        self.db.session_focus(&self.k(session)).await
    }

    /// Set (`Some`) or clear (`None`) a session's focus.
    pub async fn set_session_focus(&self, session: &str, focus: Option<&str>) -> Result<(), Error> {
        self.db.set_session_focus(&self.k(session), focus).await
    }

    /// A session's display names (JSON), if set.
    pub async fn session_label(&self, session: &str) -> Result<Option<String>, Error> {
        self.db.session_label(&self.k(session)).await
    }

    /// Set (`Some`) or clear (`None`) a session's display names (JSON).
    pub async fn set_session_label(&self, session: &str, label: Option<&str>) -> Result<(), Error> {
        self.db.set_session_label(&self.k(session), label).await
    }

    /// This tenant's sessions, most recently changed first: `limit` from `offset` (from its
    /// own part of the store).
    pub async fn sessions_page(&self, offset: u64, limit: u32) -> Result<Vec<String>, Error> {
        let keys = self
            .db
            .sessions_page(tenant_column(&self.k("")), offset, limit)
            .await?;
        Ok(self.ids(keys))
    }

    /// How many sessions this tenant has.
    pub async fn sessions_count(&self) -> Result<u64, Error> {
        self.db.sessions_count(tenant_column(&self.k(""))).await
    }

    /// This tenant's sessions whose id starts with `prefix`, in id order: the first `limit`
    /// and how many there are (read from a key range of an index).
    pub async fn sessions_prefixed(
        &self,
        prefix: &str,
        limit: u32,
    ) -> Result<(Vec<String>, u64), Error> {
        let (keys, total) = self
            .db
            .sessions_prefixed(tenant_column(&self.k("")), &self.k(prefix), limit)
            .await?;
        Ok((self.ids(keys), total))
    }

    /// This tenant's sessions that may match a search for `q`, with their display names
    /// (JSON, if set), most recently changed first (see [`SourceStore::sessions_labelled`]:
    /// every match, perhaps more).
    pub async fn sessions_labelled(&self, q: &str) -> Result<Vec<(String, Option<String>)>, Error> {
        let rows = self
            .db
            .sessions_labelled(tenant_column(&self.k("")), q)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(k, l)| self.tenant.session_of(&k).map(|s| (s.to_string(), l)))
            .collect())
    }

    /// A session's pinned episodes, ascending.
    pub async fn pins(&self, session: &str) -> Result<Vec<u64>, Error> {
        self.db.pins(&self.k(session)).await
    }

    /// Pin or unpin one episode; whether anything changed.
    pub async fn set_pin(&self, session: &str, episode: u64, pinned: bool) -> Result<bool, Error> {
        self.db.set_pin(&self.k(session), episode, pinned).await
    }

    /// After importing `path` up to `bytes`, the session's newest episode is `last_episode`.
    pub async fn record_mark(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        self.db
            .record_mark(&self.k(session), path, last_episode, bytes)
            .await
    }

    /// The furthest mark of the session at or before `last_episode`.
    pub async fn mark_covering(
        &self,
        session: &str,
        last_episode: u64,
    ) -> Result<Option<Mark>, Error> {
        self.db.mark_covering(&self.k(session), last_episode).await
    }

    /// The session's active job for `target`, or a new queued one (see
    /// [`crate::JobStore::job_enqueue`]).
    pub async fn job_enqueue(
        &self,
        session: &str,
        target: u64,
        config: &str,
        now_ms: u64,
    ) -> Result<(Job, bool), Error> {
        self.db
            .job_enqueue(&self.k(session), target, config, now_ms)
            .await
    }

    /// The session's newest active job.
    pub async fn job_active_for(&self, session: &str) -> Result<Option<Job>, Error> {
        self.db.job_active_for(&self.k(session)).await
    }

    /// Lease owners of the session's running jobs whose lease lasts past `now_ms`.
    pub async fn job_lease_owners(&self, session: &str, now_ms: u64) -> Result<Vec<String>, Error> {
        self.db.job_lease_owners(&self.k(session), now_ms).await
    }

    /// The tenant's jobs with `id < before` (all when `None`), newest first, at most `limit`.
    pub async fn jobs_list(&self, before: Option<u64>, limit: u32) -> Result<Vec<Job>, Error> {
        let bounds = self.tenant.job_bounds();
        self.db.jobs_list(Some(bounds.scope()), before, limit).await
    }

    /// How many of the tenant's jobs are queued.
    pub async fn jobs_queued(&self) -> Result<u64, Error> {
        let bounds = self.tenant.job_bounds();
        self.db.jobs_queued(bounds.scope()).await
    }

    /// The tenant's API tokens (live and revoked), oldest first; another tenant's never.
    pub async fn tokens(&self) -> Result<Vec<crate::tables::TokenRow>, Error> {
        let mut rows = self.db.tokens().await?;
        rows.retain(|r| r.tenant == self.tenant.name());
        Ok(rows)
    }

    /// Revoke the tenant's live token `id`: the row as revoked, or `None` when the tenant has
    /// no such live token (another tenant's token is never touched).
    pub async fn revoke_token(
        &self,
        id: u64,
        now_ms: u64,
    ) -> Result<Option<crate::tables::TokenRow>, Error> {
        let Some(row) = self
            .tokens()
            .await?
            .into_iter()
            .find(|r| r.id == id && r.revoked_ms.is_none())
        else {
            return Ok(None);
        };
        Ok(self
            .db
            .revoke_token(id, now_ms)
            .await?
            .then_some(crate::tables::TokenRow {
                revoked_ms: Some(now_ms),
                ..row
            }))
    }
}

/// One tenant's view of the memories and their clusters ([`RecallStore`] calls with the
/// tenant filled in): the same "a tenant value the store enforces" as a bound [`crate::Sql`] and
/// [`TenantTables`], for the tables keyed by tenant rather than by session.
#[derive(Clone)]
pub struct TenantRecall {
    db: Arc<dyn RecallStore>,
    tenant: Tenant,
}

impl TenantRecall {
    /// `tenant`'s view of `db`.
    pub fn new(db: Arc<dyn RecallStore>, tenant: Tenant) -> Self {
        TenantRecall { db, tenant }
    }

    fn t(&self) -> &str {
        self.tenant.name()
    }

    /// One memory.
    pub async fn get_memory(&self, id: &str) -> Result<Option<Memory>, Error> {
        self.db.get_memory(self.t(), id).await
    }

    /// The memories passing `filter`, oldest first, a page of them and how many pass.
    pub async fn list_memories(
        &self,
        filter: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Memory>, usize), Error> {
        self.db.list_memories(self.t(), filter, offset, limit).await
    }

    /// The clusters with members passing `filter`.
    pub async fn clusters(&self, filter: &MemoryFilter) -> Result<Vec<ClusterRow>, Error> {
        self.db.clusters(self.t(), filter).await
    }

    /// A cluster summary by its id.
    pub async fn summary_by_id(&self, id: u64) -> Result<Option<ClusterSummary>, Error> {
        self.db.summary_by_id(self.t(), id).await
    }

    /// The ids of the memories a summary covers, oldest first.
    pub async fn summary_sources(&self, s: &ClusterSummary) -> Result<Vec<String>, Error> {
        self.db.member_ids(self.t(), s.cluster, s.covered_seq).await
    }

    /// The memories a summary covers, oldest first.
    pub async fn summary_members(&self, s: &ClusterSummary) -> Result<Vec<Memory>, Error> {
        let mut v = self.db.cluster_members(self.t(), s.cluster).await?;
        v.retain(|m| m.seq <= s.covered_seq);
        Ok(v)
    }

    /// Claim a cluster for `owner` until `until_ms` (see [`RecallStore::claim_cluster`]).
    pub async fn claim_cluster(
        &self,
        cluster: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, Error> {
        self.db
            .claim_cluster(self.t(), cluster, owner, now_ms, until_ms)
            .await
    }

    /// Release `owner`'s claim.
    pub async fn release_cluster(&self, cluster: u64, owner: &str) -> Result<(), Error> {
        self.db.release_cluster(self.t(), cluster, owner).await
    }

    /// A cluster's membership version.
    pub async fn cluster_version(&self, cluster: u64) -> Result<Option<u64>, Error> {
        self.db.cluster_version(self.t(), cluster).await
    }

    /// Record that the cluster's summary is up to date with `version`.
    pub async fn settle(&self, cluster: u64, version: u64) -> Result<(), Error> {
        self.db.settle(self.t(), cluster, version).await
    }

    /// Count model usage on UTC day `day` (and its month).
    pub async fn add_usage(
        &self,
        day: &str,
        calls: u64,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), Error> {
        self.db
            .add_usage(self.t(), day, calls, prompt_tokens, output_tokens)
            .await
    }

    /// Calls, prompt tokens and output tokens in `month`.
    pub async fn usage(&self, month: &str) -> Result<(u64, u64, u64), Error> {
        self.db.usage(self.t(), month).await
    }

    /// Usage per day of `month`.
    pub async fn usage_days(&self, month: &str) -> Result<Vec<UsageDay>, Error> {
        self.db.usage_days(self.t(), month).await
    }

    /// Forget everything the tenant keeps here.
    pub async fn forget_tenant(&self) -> Result<(), Error> {
        self.db.forget_tenant(self.t()).await
    }

    /// The secret keying the tenant's lexical embedding, with a master key.
    pub async fn lexical_key(&self) -> Result<Option<Vec<u8>>, Error> {
        self.db.lexical_key(self.t()).await
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::SqliteStore;
    use crate::types::{CachedAnswer, NewEpisode, Role};

    fn ep(key: &str) -> NewEpisode {
        NewEpisode {
            item: None,
            terms: String::new(),
            role: Role::User,
            content: format!("message {key}"),
            timestamp_ms: None,
            source_key: key.into(),
            tokens: 3,
            speaker: None,
        }
    }

    #[test]
    fn names() {
        assert!(Tenant::new("acme-1.eu_x").is_ok());
        for bad in ["", "Acme", "-x", "a b", "a\u{1f}b", &"x".repeat(65)] {
            assert!(Tenant::new(bad).is_err(), "{bad:?}");
        }
        let t = Tenant::new("acme").unwrap();
        assert_eq!(t.session_of(&t.key("s/1")), Some("s/1"));
        assert_eq!(Tenant::local().session_of(&t.key("s")), None);
        assert_eq!(t.session_of("s"), None);
        assert_eq!(Tenant::new("acm").unwrap().session_of(&t.key("s")), None);
        assert_eq!(Tenant::of_key(&t.key("s")), t);
        assert_eq!(Tenant::of_key("s"), Tenant::local());
    }

    #[tokio::test]
    async fn the_same_session_id_in_two_tenants_is_two_sessions() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let a = db.for_tenant(&Tenant::new("a").unwrap());
        let b = db.for_tenant(&Tenant::new("b").unwrap());
        let local = db.for_tenant(&Tenant::local());
        let (a_rows, local_rows) = (
            TenantTables::new(db.clone(), Tenant::new("a").unwrap()),
            TenantTables::new(db.clone(), Tenant::local()),
        );
        a.append_episodes("s", vec![ep("1"), ep("2")])
            .await
            .unwrap();
        b.append_episodes("s", vec![ep("1")]).await.unwrap();
        local.append_episodes("s", vec![ep("9")]).await.unwrap();
        assert_eq!(a.stats("s").await.unwrap().episodes, 2);
        assert_eq!(b.stats("s").await.unwrap().episodes, 1);
        assert_eq!(local.stats("s").await.unwrap().episodes, 1);
        assert_eq!(a_rows.sessions().await.unwrap(), vec!["s".to_string()]);
        assert_eq!(local_rows.sessions().await.unwrap(), vec!["s".to_string()]);
        b.reset_session("s").await.unwrap();
        assert_eq!(a.stats("s").await.unwrap().episodes, 2);
        let answer = CachedAnswer {
            text: "t".into(),
            prompt_tokens: 1,
            output_tokens: 1,
        };
        a.put_partial("k", &answer).await.unwrap();
        assert!(a.partial("k").await.unwrap().is_some());
        assert!(b.partial("k").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_tenant_lists_and_revokes_only_its_own_tokens() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let mine = db
            .insert_token("acme", "h1", "abr_1", false, None, 1)
            .await
            .unwrap();
        let theirs = db
            .insert_token("globex", "h2", "abr_2", false, None, 1)
            .await
            .unwrap();
        let acme = TenantTables::new(db.clone(), Tenant::new("acme").unwrap());
        let ids: Vec<u64> = acme.tokens().await.unwrap().iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![mine]);
        assert!(acme.revoke_token(theirs, 2).await.unwrap().is_none());
        assert!(db.live_token("h2").await.unwrap().is_some());
        let gone = acme.revoke_token(mine, 2).await.unwrap().unwrap();
        assert_eq!((gone.id, gone.revoked_ms), (mine, Some(2)));
        assert!(acme.revoke_token(mine, 3).await.unwrap().is_none());
    }
}
