//! What the engine's store imports reach: the summary chain of sessions ([`Store`]) and a
//! tenant's memories and clusters ([`RecallStore`]). The implementations (in memory, SQLite,
//! PostgreSQL) and the rules they share live in the `abridge-store` crate.

use async_trait::async_trait;

use crate::types::{
    CachedAnswer, Calibration, Centroid, ClusterSummary, ClusterSummaryWrite, Compaction, Episode,
    Error, FailureMarker, Hit, MemberSet, Memory, MemoryFilter, NewEpisode, NewMemory, Scope,
    SessionStats, StoredMemory, SummaryRow, SummaryWrite, TermMatches,
};

/// What the engine stores. Implementations must write each call atomically and enforce the
/// chain rule of [`SummaryWrite`]: rows of a session cover every episode exactly once, in
/// order.
#[async_trait]
pub trait Store: Send + Sync {
    /// Append episodes (skipping source keys already present); returns how many were new.
    async fn append_episodes(&self, session: &str, episodes: Vec<NewEpisode>)
    -> Result<u32, Error>;
    /// Session figures (zero for an unknown session).
    async fn stats(&self, session: &str) -> Result<SessionStats, Error>;
    /// Episodes with `id > after`, ascending, at most `limit`.
    async fn episodes_after(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error>;
    /// The episodes with these ids (at most 1000), ascending; an id the session does not hold
    /// is left out (the WIT `store.episodes`). The SQL stores read them in one statement;
    /// this default reads them an episode at a time.
    async fn episodes(&self, session: &str, ids: &[u64]) -> Result<Vec<Episode>, Error> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids.into_iter().filter(|&id| id > 0) {
            out.extend(
                self.episodes_after(session, id - 1, 1)
                    .await?
                    .into_iter()
                    .filter(|e| e.id == id),
            );
        }
        Ok(out)
    }
    /// The transcript bytes (UTF-8 content) of episodes `1..=id` and the time of episode `id`,
    /// `None` for an episode not stored: what a summary row covers is a subtraction of two of
    /// these (coverage figures). Every store keeps the running total per episode.
    async fn bytes_through(
        &self,
        session: &str,
        id: u64,
    ) -> Result<Option<(u64, Option<i64>)>, Error>;
    /// The newest summary row.
    async fn latest_summary(&self, session: &str) -> Result<Option<SummaryRow>, Error>;
    /// The active chain (rows not compacted), oldest first.
    async fn summaries(&self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Every row, compacted ones included: by first episode, then level, highest first.
    async fn summary_history(&self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Write a summary row and its coverage in one transaction.
    async fn write_summary(&self, session: &str, write: SummaryWrite) -> Result<SummaryRow, Error>;
    /// Fold the oldest active rows into one "earlier" row in one transaction (see
    /// [`check_compaction`]).
    async fn compact_summaries(&self, session: &str, c: Compaction) -> Result<SummaryRow, Error>;
    /// The session's failure marker (see the WIT `store.failure`).
    async fn failure(&self, session: &str) -> Result<Option<FailureMarker>, Error>;
    /// Record or clear the session's failure marker.
    async fn set_failure(&self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error>;
    /// Delete the session's episodes, summaries and failure marker.
    async fn reset_session(&self, session: &str) -> Result<(), Error>;
    /// A cached partial summary by key, with what it cost (see the WIT `store.partial`).
    async fn partial(&self, key: &str) -> Result<Option<CachedAnswer>, Error>;
    /// Cache a partial summary and what it cost.
    async fn put_partial(&self, key: &str, answer: &CachedAnswer) -> Result<(), Error>;
    /// Calibration totals for a model (see the WIT `store.calibration`).
    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, Error>;
    /// The full-text index's episodes holding any of `terms` (the guest's
    /// `text.index-terms`), in `session` or, without one, in every session of `tenant` (a
    /// tenant's name; `None`: the store's own scope, the local tenant for a store that is not
    /// a tenant's view), at most `limit` (see the WIT `store.search-episodes`).
    async fn search_episodes(
        &self,
        tenant: Option<&str>,
        session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<TermMatches, Error>;
    /// Add one measured prompt to a model's calibration totals.
    async fn record_calibration(
        &self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error>;
}

/// A cluster as listed.
#[derive(Clone, Debug)]
pub struct ClusterRow {
    /// Id.
    pub id: u64,
    /// Scope.
    pub scope: Scope,
    /// Active members.
    pub members: u32,
    /// Member ids, oldest first.
    pub member_ids: Vec<String>,
    /// Its summary's id.
    pub summary: Option<u64>,
    /// Why its last summary was discarded.
    pub note: Option<String>,
    /// Embedding model of its vectors.
    pub model: String,
    /// Membership version.
    pub version: u64,
    /// Version the last summarize run settled.
    pub settled: u64,
}

/// A cluster whose summary may be stale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsettled {
    /// Its tenant.
    pub tenant: String,
    /// Its id.
    pub cluster: u64,
    /// Its membership version now.
    pub version: u64,
    /// User and project (the per-run caps count by them).
    pub user: String,
    /// Project.
    pub project: String,
}

/// A tenant's model usage on one day.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageDay {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Model calls.
    pub calls: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Their output tokens.
    pub output_tokens: u64,
}

/// The month (`YYYY-MM`) of a day (`YYYY-MM-DD`).
pub fn month_of_day(day: &str) -> &str {
    day.get(..7).unwrap_or(day)
}

/// Memories, clusters and cluster summaries, per tenant.
#[async_trait]
pub trait RecallStore: Send + Sync {
    /// Clusters of a scope with their mean vectors.
    async fn centroids(&self, tenant: &str, scope: &Scope) -> Result<Vec<Centroid>, Error>;
    /// Store a memory into a cluster (or a new one), updating the centroid.
    async fn put_memory(&self, tenant: &str, m: NewMemory) -> Result<StoredMemory, Error>;
    /// One memory.
    async fn get_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error>;
    /// The newest current (not superseded) memory of `scope` with fact key `fact_key` (as the
    /// guest gives it: the store hashes it as it does when writing).
    async fn current_memory(
        &self,
        tenant: &str,
        scope: &Scope,
        fact_key: &str,
    ) -> Result<Option<Memory>, Error>;
    /// A cluster's members, oldest first.
    async fn cluster_members(&self, tenant: &str, cluster: u64) -> Result<Vec<Memory>, Error>;
    /// A cluster's members with `seq > after` (oldest first), its member count and membership
    /// version; a cluster that does not exist is an empty set at version 0. Its cost follows
    /// the members returned, not the cluster's size.
    async fn members_after(
        &self,
        tenant: &str,
        cluster: u64,
        after: u64,
    ) -> Result<MemberSet, Error>;
    /// A cluster's members by rank: importance (highest first), then oldest, then id; `limit`
    /// of them from `offset`.
    async fn top_members(
        &self,
        tenant: &str,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<Memory>, Error>;
    /// The ids of a cluster's members with `seq <= upto`, oldest first.
    async fn member_ids(&self, tenant: &str, cluster: u64, upto: u64)
    -> Result<Vec<String>, Error>;
    /// Delete a memory, updating its centroid.
    async fn delete_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error>;
    /// Replace a cluster's vectors (a new embedding model).
    async fn set_vectors(
        &self,
        tenant: &str,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error>;
    /// A cluster's summary.
    async fn cluster_summary(
        &self,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<ClusterSummary>, Error>;
    /// A summary by id.
    async fn summary_by_id(&self, tenant: &str, id: u64) -> Result<Option<ClusterSummary>, Error>;
    /// Write a cluster summary if the current one's member hash is `w.expect` and the
    /// cluster's membership version is `w.version` (`rules::summary_write_allowed`).
    async fn write_cluster_summary(
        &self,
        tenant: &str,
        w: ClusterSummaryWrite,
    ) -> Result<bool, Error>;
    /// Delete a cluster's summary.
    async fn delete_cluster_summary(&self, tenant: &str, cluster: u64) -> Result<(), Error>;
    /// Record or clear why a cluster's summary was discarded.
    async fn set_cluster_note(
        &self,
        tenant: &str,
        cluster: u64,
        note: Option<String>,
    ) -> Result<(), Error>;
    /// The `limit` most similar memories and the `limit` most similar summaries.
    async fn search(
        &self,
        tenant: &str,
        query: &[f32],
        model: &str,
        filter: &MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error>;
    /// Memories under a filter, oldest first, `limit` from `offset`; and the total.
    async fn list_memories(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Memory>, usize), Error>;
    /// Clusters under a filter.
    async fn clusters(&self, tenant: &str, filter: &MemoryFilter)
    -> Result<Vec<ClusterRow>, Error>;
    /// Clusters (of one tenant, or all) whose version is past the settled one, oldest change
    /// first.
    async fn unsettled(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<Unsettled>, Error>;
    /// A cluster's membership version (`None`: no such cluster).
    async fn cluster_version(&self, tenant: &str, cluster: u64) -> Result<Option<u64>, Error>;
    /// Record that a summarize run saw `version`.
    async fn settle(&self, tenant: &str, cluster: u64, version: u64) -> Result<(), Error>;
    /// Take the cluster for `owner` until `until_ms` unless another live owner holds it.
    async fn claim_cluster(
        &self,
        tenant: &str,
        cluster: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, Error>;
    /// Give a claim back.
    async fn release_cluster(&self, tenant: &str, cluster: u64, owner: &str) -> Result<(), Error>;
    /// Add model usage to a tenant's day (`YYYY-MM-DD`, UTC) and so to its month.
    async fn add_usage(
        &self,
        tenant: &str,
        day: &str,
        calls: u64,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), Error>;
    /// A tenant's usage in a month: calls, prompt tokens, output tokens.
    async fn usage(&self, tenant: &str, month: &str) -> Result<(u64, u64, u64), Error>;
    /// A tenant's usage per day of a month (`YYYY-MM`), days with usage only, oldest first.
    async fn usage_days(&self, tenant: &str, month: &str) -> Result<Vec<UsageDay>, Error>;
    /// Delete a tenant's memories, clusters, summaries, usage and data keys (a tenant deleted:
    /// without its data keys, its sealed text cannot be opened anywhere).
    async fn forget_tenant(&self, tenant: &str) -> Result<(), Error>;
    /// The secret that keys the tenant's lexical embedding (`None` without a master key: the
    /// lexical vectors are then unkeyed). Derived from the tenant's first data key, so it
    /// lasts across master key rotations and goes with the tenant.
    async fn lexical_key(&self, _tenant: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(None)
    }
    /// Load what makes recall fast before the first recall asks for it (the vector indexes a
    /// store saved, once per tenant and model); how many were loaded. A store whose index
    /// lives in its database loads nothing.
    async fn warm(&self) -> Result<usize, Error> {
        Ok(0)
    }
}
