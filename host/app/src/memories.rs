//! Memories and cluster summaries in the app layer: write, read, list, delete, recall, the
//! clusters and their summaries, and the summarize runs (inline after a write, and the
//! sweeper), for every front end.
//!
//! A summarize run takes the cluster's claim first (so the inline path and the sweeper never
//! summarize one cluster at once), notes the membership version, runs the guest, and settles
//! that version when the run ends without error. A cluster changed meanwhile stays unsettled
//! and is picked up again; a run that failed leaves it unsettled too, with the reason noted.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{App, AppError, AppResult, ErrorKind, Scoped, What};
use crate::store::{ClusterRow, RecallStore};
use crate::types::{
    ClusterAction, ClusterOutcome, ClusterSummary, HitKind, Memory, MemoryFilter, MemoryIn,
    Recalled, Remembered, Scope,
};

/// How long a summarize run's claim on a cluster lasts.
const CLAIM_MS: u64 = 10 * 60 * 1000;

/// A memory as shown to callers.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct MemoryView {
    /// Id.
    pub id: String,
    /// Whose memory.
    pub user: String,
    /// Project.
    pub project: String,
    /// Environment.
    pub environment: String,
    /// Kind of fact.
    #[serde(rename = "type")]
    pub kind: String,
    /// Subject.
    pub key: String,
    /// The fact.
    pub text: String,
    /// 0 to 1.
    pub importance: f32,
    /// Written at, ms since the epoch.
    pub created_ms: u64,
    /// Its cluster.
    pub cluster: u64,
    /// The memory it superseded when it was written (the same fact, or the one named).
    pub supersedes: Option<String>,
    /// The memory that superseded it: it is no longer current (kept, as history).
    pub superseded_by: Option<String>,
    /// When it was superseded, ms since the epoch.
    pub superseded_ms: Option<u64>,
}

impl From<Memory> for MemoryView {
    fn from(m: Memory) -> Self {
        MemoryView {
            id: m.id,
            user: m.scope.user,
            project: m.scope.project,
            environment: m.scope.environment,
            kind: m.scope.kind,
            key: m.scope.key,
            text: m.text,
            importance: m.importance,
            created_ms: m.created_ms,
            cluster: m.cluster,
            supersedes: m.supersedes,
            superseded_ms: m.superseded_by.as_ref().map(|_| m.superseded_ms),
            superseded_by: m.superseded_by,
        }
    }
}

/// A cluster summary as shown to callers.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ClusterSummaryView {
    /// Id.
    pub id: u64,
    /// Its cluster.
    pub cluster: u64,
    /// The text.
    pub text: String,
    /// The memories it covers.
    pub sources: Vec<String>,
    /// Its importance (the largest of its sources').
    pub importance: f32,
    /// Which model (or `extractive`) wrote it.
    pub model: String,
    /// Model calls that produced it.
    pub calls: u32,
    /// Their prompt tokens.
    pub prompt_tokens: u32,
    /// Their output tokens.
    pub output_tokens: u32,
    /// Created at.
    pub created_ms: u64,
    /// Last regenerated at.
    pub updated_ms: u64,
}

impl ClusterSummaryView {
    /// A summary row and the ids of the memories it covers.
    fn new(s: ClusterSummary, sources: Vec<String>) -> Self {
        ClusterSummaryView {
            id: s.id,
            cluster: s.cluster,
            text: s.text,
            sources,
            importance: s.importance,
            model: s.model,
            calls: s.calls,
            prompt_tokens: s.prompt_tokens,
            output_tokens: s.output_tokens,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
        }
    }
}

/// A cluster as shown to callers.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ClusterView {
    /// Id.
    pub id: u64,
    /// Whose memories.
    pub user: String,
    /// Project.
    pub project: String,
    /// Environment.
    pub environment: String,
    /// Kind.
    #[serde(rename = "type")]
    pub kind: String,
    /// Subject.
    pub key: String,
    /// Member ids, oldest first.
    pub members: Vec<String>,
    /// Its summary's id.
    pub summary: Option<u64>,
    /// Why its last summary was discarded.
    pub note: Option<String>,
    /// Whether a summarize run has seen its current members.
    pub settled: bool,
}

impl From<ClusterRow> for ClusterView {
    fn from(c: ClusterRow) -> Self {
        ClusterView {
            id: c.id,
            user: c.scope.user,
            project: c.scope.project,
            environment: c.scope.environment,
            kind: c.scope.kind,
            key: c.scope.key,
            members: c.member_ids,
            summary: c.summary,
            note: c.note,
            settled: c.settled >= c.version,
        }
    }
}

/// A recall result as shown to callers.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RecallView {
    /// `memory` or `summary`.
    pub kind: &'static str,
    /// The memory id, or the summary id.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Similarity weighted by importance.
    pub score: f32,
    /// Its importance.
    pub importance: f32,
    /// The memories a summary covers (empty for a memory).
    pub sources: Vec<String>,
    /// The memory that superseded this one: it is no longer current, and the current one
    /// comes before it.
    pub superseded_by: Option<String>,
    /// When it was superseded, ms since the epoch.
    pub superseded_ms: Option<u64>,
}

impl From<Recalled> for RecallView {
    fn from(r: Recalled) -> Self {
        RecallView {
            kind: match r.kind {
                HitKind::Memory => "memory",
                HitKind::Summary => "summary",
            },
            id: r.id,
            text: r.text,
            score: r.score,
            importance: r.importance,
            sources: r.sources,
            superseded_ms: r.superseded_by.as_ref().map(|_| r.superseded_ms),
            superseded_by: r.superseded_by,
        }
    }
}

/// The name of a cluster action.
pub fn action_name(a: ClusterAction) -> &'static str {
    match a {
        ClusterAction::Unchanged => "unchanged",
        ClusterAction::Created => "created",
        ClusterAction::Refreshed => "refreshed",
        ClusterAction::Deleted => "deleted",
        ClusterAction::TooFew => "too-few",
        ClusterAction::LostRace => "lost-race",
    }
}

/// A tenant's model usage this month, against its ceiling.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct UsageView {
    /// The month, `YYYY-MM` (UTC).
    pub month: String,
    /// Model calls for cluster summaries.
    pub calls: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Their output tokens.
    pub output_tokens: u64,
    /// What they cost at the configured prices (0 without prices).
    pub cost: f64,
    /// The monthly token ceiling, if any.
    pub limit_tokens: Option<u64>,
    /// The monthly cost ceiling, if any.
    pub limit_cost: Option<f64>,
    /// Whether the ceiling is reached (clusters are not summarized; recall returns memories).
    pub exhausted: bool,
    /// When the month's budget resets, ms since the epoch.
    pub resets_at_ms: u64,
    /// The month's days with usage, oldest first (UTC days).
    pub days: Vec<UsageDayView>,
}

/// A tenant's model usage on one day.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct UsageDayView {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Model calls for cluster summaries.
    pub calls: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Their output tokens.
    pub output_tokens: u64,
    /// What they cost at the configured prices (0 without prices).
    pub cost: f64,
}

/// The month (`YYYY-MM`, UTC) of a time, and when the next one starts (ms).
pub fn month_of(now_ms: u64) -> (String, u64) {
    let ts =
        jiff::Timestamp::from_millisecond(now_ms as i64).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let utc = jiff::tz::TimeZone::UTC;
    let d = utc.to_datetime(ts).date();
    let (y, m) = (d.year(), d.month());
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let next = utc
        .to_timestamp(jiff::civil::date(ny, nm, 1).at(0, 0, 0, 0))
        .map(|t| t.as_millisecond() as u64)
        .unwrap_or(u64::MAX);
    (format!("{y:04}-{m:02}"), next)
}

/// The UTC day (`YYYY-MM-DD`) of a time.
pub fn day_of(now_ms: u64) -> String {
    let ts =
        jiff::Timestamp::from_millisecond(now_ms as i64).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let d = jiff::tz::TimeZone::UTC.to_datetime(ts).date();
    format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
}

/// The periodic cluster sweeper of [`App::start_sweeper`].
pub struct Sweeper {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Stop: a sweep under way ends at once; the claims it holds are released by their expiry
    /// or by the next sweep's owner check.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.abort();
        let _ = self.task.await;
    }
}

/// What one sweep did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepReport {
    /// Clusters looked at.
    pub clusters: usize,
    /// Summaries created or refreshed.
    pub written: usize,
    /// Summaries deleted (clusters fell under the minimum).
    pub deleted: usize,
    /// Clusters another worker held.
    pub busy: usize,
    /// Clusters left for the next run by the per-run cap.
    pub deferred: usize,
    /// Clusters whose summary failed (reason noted on the cluster).
    pub failed: usize,
    /// Clusters not summarized because their tenant's monthly ceiling is reached.
    pub refused: usize,
    /// Tenants passed over because they were swept within the cooldown.
    pub cooling: usize,
    /// Model calls made.
    pub calls: u32,
    /// Prompt tokens spent.
    pub prompt_tokens: u64,
}

/// A filter from optional fields.
pub fn filter(
    user: Option<String>,
    project: Option<String>,
    environment: Option<String>,
    kind: Option<String>,
    key: Option<String>,
) -> MemoryFilter {
    MemoryFilter {
        user,
        project,
        environment,
        kind,
        key,
        exact: false,
    }
}

impl Scoped {
    /// The memory settings of this tenant's calls: the app's, keyed by the tenant's lexical
    /// embedding secret when the store seals (one place decides it for every memory call).
    async fn memory_config(&self) -> AppResult<crate::types::MemoryConfig> {
        let mut cfg = self.app.inner.cfg.memory.clone();
        cfg.lexical_key = self.tables.lexical_key(self.tenant.name()).await?;
        Ok(cfg)
    }

    /// Store memories (ids are made for those without one), a bounded batch at a time, then
    /// summarize the clusters they left due as `summaries` says, unless the tenant's monthly
    /// ceiling is reached (the memories are stored all the same; the refusal is returned).
    /// The one write for every front end.
    pub async fn remember<M: Into<MemoryIn>>(
        &self,
        items: Vec<M>,
        summaries: Summaries,
    ) -> AppResult<Written> {
        if items.is_empty() {
            return Err(AppError::invalid("no memories given; send at least one"));
        }
        let most = self.app.inner.cfg.limits.messages_per_request as usize;
        if most > 0 && items.len() > most {
            return Err(AppError::invalid(format!(
                "{} memories in one write, more than one write takes ({most})",
                items.len()
            ))
            .hint(format!("send at most {most} at a time")));
        }
        let items: Vec<MemoryIn> = items.into_iter().map(Into::into).collect();
        let mut memories = Vec::with_capacity(items.len());
        for chunk in items.chunks(BATCH) {
            memories.extend(self.remember_batch(chunk.to_vec()).await?);
        }
        let mut due: Vec<u64> = Vec::new();
        for m in memories.iter().filter(|m| m.due) {
            if !due.contains(&m.cluster) {
                due.push(m.cluster);
            }
        }
        let refused = if due.is_empty() || summaries == Summaries::Leave {
            None
        } else {
            self.over_ceiling().await?
        };
        let mut out = Written {
            memories,
            summarizing: refused.is_none() && !due.is_empty() && summaries != Summaries::Leave,
            refused,
            outcomes: Vec::new(),
        };
        if out.refused.is_some() {
            return Ok(out);
        }
        out.outcomes = self.summarize_after(due, summaries).await;
        Ok(out)
    }

    /// Summarize the clusters a write or delete left due, as `summaries` says; the outcomes
    /// of those summarized here.
    async fn summarize_after(
        &self,
        due: Vec<u64>,
        summaries: Summaries,
    ) -> Vec<(u64, AppResult<Option<ClusterOutcome>>)> {
        match summaries {
            Summaries::Now => {
                let results = self.summarize_due(&due).await;
                due.into_iter().zip(results).collect()
            }
            Summaries::Later if !due.is_empty() => {
                let me = self.clone();
                tokio::spawn(async move {
                    // Failures are published as `cluster.failed` events, noted on the
                    // cluster and retried by the sweeper.
                    let _ = me.summarize_due(&due).await;
                });
                Vec::new()
            }
            Summaries::Later | Summaries::Leave => Vec::new(),
        }
    }

    async fn remember_batch(&self, mut items: Vec<MemoryIn>) -> AppResult<Vec<Remembered>> {
        for m in &mut items {
            if m.id.is_empty() {
                m.id = self.app.unique_id();
            }
        }
        let cfg = self.memory_config().await?;
        let out = self.engine().remember(&items, &cfg).await?;
        for r in out.iter().filter(|r| r.created) {
            self.publish(
                What::MemoryWritten {
                    id: r.id.clone(),
                    cluster: r.cluster,
                    members: r.members,
                    due: r.due,
                },
                None,
                None,
            );
        }
        Ok(out)
    }

    /// Summarize the clusters a write or delete left due, one after another; failures are
    /// noted on their clusters and published, and the sweeper retries them.
    pub async fn summarize_due(&self, clusters: &[u64]) -> Vec<AppResult<Option<ClusterOutcome>>> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for &c in clusters {
            if seen.insert(c) {
                out.push(self.summarize_cluster(c).await);
            }
        }
        out
    }

    /// The tenant's usage this month against its ceiling.
    pub async fn usage(&self) -> AppResult<UsageView> {
        let (month, resets_at_ms) = month_of(self.app.now_ms());
        let (calls, prompt, output) = self.tables.usage(self.tenant.name(), &month).await?;
        let ceiling = self.app.inner.cfg.limits.ceiling;
        let cost = |p: u64, o: u64| ceiling.map_or(0.0, |c| c.cost_of(p, o));
        let days = self
            .tables
            .usage_days(self.tenant.name(), &month)
            .await?
            .into_iter()
            .map(|d| UsageDayView {
                cost: cost(d.prompt_tokens, d.output_tokens),
                day: d.day,
                calls: d.calls,
                prompt_tokens: d.prompt_tokens,
                output_tokens: d.output_tokens,
            })
            .collect();
        Ok(UsageView {
            month,
            days,
            calls,
            prompt_tokens: prompt,
            output_tokens: output,
            cost: cost(prompt, output),
            limit_tokens: ceiling.and_then(|c| c.tokens),
            limit_cost: ceiling.and_then(|c| c.cost),
            exhausted: ceiling.is_some_and(|c| c.exhausted(prompt, output).is_some()),
            resets_at_ms,
        })
    }

    /// The refusal when the tenant's monthly ceiling is reached.
    pub async fn over_ceiling(&self) -> AppResult<Option<AppError>> {
        let Some(c) = self.app.inner.cfg.limits.ceiling else {
            return Ok(None);
        };
        let (month, resets_at_ms) = month_of(self.app.now_ms());
        let (_, prompt, output) = self.tables.usage(self.tenant.name(), &month).await?;
        Ok(c.exhausted(prompt, output).map(|(spent, limit, unit)| {
            AppError::new(
                ErrorKind::QuotaExhausted {
                    spent: spent as u64,
                    limit: limit as u64,
                    resets_at_ms,
                },
                format!(
                    "tenant '{}' has used its monthly budget for summaries ({spent:.0} of {limit:.0} {unit} in {month}); clusters are not summarized and recall returns memories until it resets",
                    self.tenant
                ),
            )
            .hint("raise ABRIDGE_MONTHLY_TOKENS or ABRIDGE_MONTHLY_COST, or wait for the next month")
        }))
    }

    /// One summarize run of a cluster under its claim; `Ok(None)` when another worker holds it.
    /// Refused with [`ErrorKind::QuotaExhausted`] when the tenant's monthly ceiling is reached.
    pub async fn summarize_cluster(&self, cluster: u64) -> AppResult<Option<ClusterOutcome>> {
        if let Some(refusal) = self.over_ceiling().await? {
            return Err(refusal);
        }
        // At most the tenant's share of cluster summaries at once; the rest wait here.
        let _slot = self
            .state
            .clusters
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| AppError::new(ErrorKind::Unavailable, "shutting down"))?;
        let (store, t) = (&*self.tables, self.tenant.name());
        let owner = format!("{}-{}", self.app.unique_id(), std::process::id());
        let now = self.app.now_ms();
        // A claim is refused for a cluster another worker holds, and for one that does not
        // exist: only then is it worth telling the two apart.
        let claimed = store
            .claim_cluster(t, cluster, &owner, now, now + CLAIM_MS)
            .await?;
        let version = store.cluster_version(t, cluster).await?;
        let Some(version) = version.filter(|_| claimed) else {
            return match version {
                None => Err(AppError::not_found(format!("no cluster {cluster}"))),
                Some(_) => Ok(None),
            };
        };
        let mcfg = self.memory_config().await?;
        let result = self
            .engine()
            .summarize_cluster(cluster, &self.app.inner.cfg.config, &mcfg)
            .await;
        let settled = match &result {
            Ok(_) => store.settle(t, cluster, version).await,
            Err(_) => Ok(()),
        };
        store.release_cluster(t, cluster, &owner).await?;
        settled?;
        // The model's calls were counted in the tenant's usage as they were made (see
        // `limits::Guarded::counting`), whatever became of their answers.
        match result {
            Ok(o) => {
                if !matches!(o.action, ClusterAction::Unchanged | ClusterAction::TooFew) {
                    self.publish(
                        What::ClusterSummarized {
                            cluster,
                            action: action_name(o.action).to_string(),
                            summary: o.summary.as_ref().map(|s| s.id),
                            covered: o.summary.as_ref().map(|s| s.covered),
                            calls: o.calls,
                            prompt_tokens: o.prompt_tokens,
                        },
                        None,
                        None,
                    );
                }
                Ok(Some(o))
            }
            Err(e) => {
                let e = AppError::from(e);
                self.publish(
                    What::ClusterFailed {
                        cluster,
                        error: e.message.clone(),
                    },
                    None,
                    None,
                );
                Err(e)
            }
        }
    }

    /// One memory; a foreign or unknown id is not found.
    pub async fn memory(&self, id: &str) -> AppResult<MemoryView> {
        self.tables
            .get_memory(self.tenant.name(), id)
            .await?
            .map(MemoryView::from)
            .ok_or_else(|| AppError::not_found(format!("no memory '{id}'")))
    }

    /// Memories under a filter, oldest first; and the total.
    pub async fn memories(
        &self,
        f: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> AppResult<(Vec<MemoryView>, usize)> {
        let (rows, total) = self
            .tables
            .list_memories(self.tenant.name(), f, offset, limit)
            .await?;
        Ok((rows.into_iter().map(MemoryView::from).collect(), total))
    }

    /// Delete a memory; a summary that covered it goes at once, and the cluster is left due
    /// when it still has enough members (pass `due` clusters to [`Scoped::summarize_due`]).
    pub async fn forget(&self, id: &str, summaries: Summaries) -> AppResult<Deleted> {
        let f = self
            .engine()
            .forget(id, &self.memory_config().await?)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no memory '{id}'")))?;
        self.publish(
            What::MemoryDeleted {
                id: id.to_string(),
                cluster: f.cluster,
                summary_deleted: f.summary_deleted,
            },
            None,
            None,
        );
        let outcomes = if f.due {
            self.summarize_after(vec![f.cluster], summaries).await
        } else {
            Vec::new()
        };
        Ok(Deleted {
            cluster: f.cluster,
            summary_deleted: f.summary_deleted,
            due: f.due,
            outcomes,
        })
    }

    /// The best memories and summaries for a query.
    pub async fn recall(
        &self,
        query: &str,
        f: &MemoryFilter,
        k: u32,
    ) -> AppResult<Vec<RecallView>> {
        // Over the ceiling, recall falls back to the raw memories.
        let summaries = self.over_ceiling().await?.is_none();
        let r = self
            .engine()
            .recall(query, f, k, summaries, &self.memory_config().await?)
            .await?;
        Ok(r.into_iter().map(RecallView::from).collect())
    }

    /// Clusters under a filter.
    pub async fn clusters(&self, f: &MemoryFilter) -> AppResult<Vec<ClusterView>> {
        Ok(self
            .tables
            .clusters(self.tenant.name(), f)
            .await?
            .into_iter()
            .map(ClusterView::from)
            .collect())
    }

    async fn summary_row(&self, id: u64) -> AppResult<ClusterSummary> {
        self.tables
            .summary_by_id(self.tenant.name(), id)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no summary {id}")))
    }

    /// A cluster summary by id, with the ids of the memories it covers.
    pub async fn cluster_summary(&self, id: u64) -> AppResult<ClusterSummaryView> {
        let s = self.summary_row(id).await?;
        let sources = self
            .tables
            .member_ids(self.tenant.name(), s.cluster, s.covered_seq)
            .await?;
        Ok(ClusterSummaryView::new(s, sources))
    }

    /// The memories a summary covers, oldest first.
    pub async fn summary_sources(&self, id: u64) -> AppResult<Vec<MemoryView>> {
        let s = self.summary_row(id).await?;
        let mut members = self
            .tables
            .cluster_members(self.tenant.name(), s.cluster)
            .await?;
        members.retain(|m| m.seq <= s.covered_seq);
        Ok(members.into_iter().map(MemoryView::from).collect())
    }
}

/// What deleting a tenant removed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantDeleted {
    /// Sessions deleted (with their episodes, summaries and events).
    pub sessions: usize,
    /// Memories deleted (with their clusters, summaries and data keys).
    pub memories: usize,
    /// Tokens revoked.
    pub tokens: usize,
}

impl Scoped {
    /// Delete everything the tenant has: its sessions, its memories with their clusters and
    /// summaries, its usage and its data keys (so sealed text of it that survives anywhere,
    /// a backup say, can no longer be opened), and revoke its tokens.
    pub async fn delete_tenant(&self) -> AppResult<TenantDeleted> {
        let mut out = TenantDeleted::default();
        let (_, total) = self.memories(&MemoryFilter::default(), 0, 1).await?;
        out.memories = total;
        for s in self.session_ids().await? {
            self.reset(&s).await?;
            out.sessions += 1;
        }
        // The events published so far are written first: one written after would seal its
        // data under a data key made anew for the tenant being deleted.
        self.app.events().flush().await;
        self.tables.forget_tenant(self.tenant.name()).await?;
        let now = self.app.now_ms();
        for t in self.app.tokens().list().await? {
            if t.tenant == self.tenant.name() && t.revoked_ms.is_none() {
                self.app.tokens().revoke(t.id, now).await?;
                out.tokens += 1;
            }
        }
        Ok(out)
    }
}

impl Scoped {
    /// One sweep of this tenant's clusters (see [`App::sweep`]).
    pub async fn sweep(&self, per_scope: usize) -> AppResult<SweepReport> {
        self.app().sweep(Some(self.tenant()), per_scope).await
    }
}

impl App {
    /// One sweep: summarize clusters whose summary may be missing or stale (of one tenant or
    /// all), at most `per_scope` per user and project, skipping clusters another worker holds.
    pub async fn sweep(
        &self,
        tenant: Option<&crate::tenant::Tenant>,
        per_scope: usize,
    ) -> AppResult<SweepReport> {
        self.sweep_with(tenant, per_scope, 0).await
    }

    /// The periodic sweep: as [`App::sweep`] over every tenant, passing over a tenant swept
    /// less than the cooldown (`Limits::sweep_cooldown_ms`) ago.
    pub async fn sweep_periodic(&self, per_scope: usize) -> AppResult<SweepReport> {
        self.sweep_with(None, per_scope, self.inner.cfg.limits.sweep_cooldown_ms)
            .await
    }

    /// Start the periodic sweeper: every `every`, [`App::sweep_periodic`] with `per_scope`,
    /// logging what it did with `tracing`. `abridge serve` and embedders run this loop
    /// (`abridge clusters sweep` runs one sweep); stop it with [`Sweeper::stop`].
    pub fn start_sweeper(&self, every: std::time::Duration, per_scope: usize) -> Sweeper {
        let app = self.clone();
        let (tx, mut stop) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                match app.sweep_periodic(per_scope).await {
                    Ok(r) if r.clusters > 0 => tracing::info!(
                        clusters = r.clusters,
                        written = r.written,
                        deleted = r.deleted,
                        failed = r.failed,
                        deferred = r.deferred,
                        calls = r.calls,
                        "cluster sweep"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e.message, "cluster sweep failed"),
                }
            }
        });
        Sweeper { stop: tx, task }
    }

    async fn sweep_with(
        &self,
        tenant: Option<&crate::tenant::Tenant>,
        per_scope: usize,
        cooldown_ms: u64,
    ) -> AppResult<SweepReport> {
        let store = self.inner.db.clone() as Arc<dyn RecallStore>;
        let todo = store.unsettled(tenant.map(|t| t.name()), 10_000).await?;
        let mut report = SweepReport::default();
        let now = self.now_ms();
        let mut cooling = std::collections::BTreeSet::new();
        let todo: Vec<_> = {
            let mut swept = self.inner.swept.lock().expect("sweep lock");
            let mut keep = Vec::new();
            let mut fresh = std::collections::BTreeSet::new();
            for u in todo {
                let last = swept.get(&u.tenant).copied();
                if cooldown_ms > 0
                    && !fresh.contains(&u.tenant)
                    && last.is_some_and(|l| now.saturating_sub(l) < cooldown_ms)
                {
                    cooling.insert(u.tenant.clone());
                    continue;
                }
                fresh.insert(u.tenant.clone());
                keep.push(u);
            }
            for t in fresh {
                swept.insert(t, now);
            }
            keep
        };
        report.cooling = cooling.len();
        let mut per: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for u in todo {
            let n = per
                .entry((u.tenant.clone(), u.user.clone(), u.project.clone()))
                .or_default();
            if *n >= per_scope.max(1) {
                report.deferred += 1;
                continue;
            }
            *n += 1;
            report.clusters += 1;
            let Ok(t) = crate::tenant::Tenant::new(&u.tenant) else {
                continue;
            };
            match self.tenant(&t).summarize_cluster(u.cluster).await {
                Ok(Some(o)) => {
                    report.calls += o.calls;
                    report.prompt_tokens += u64::from(o.prompt_tokens);
                    match o.action {
                        ClusterAction::Created | ClusterAction::Refreshed => report.written += 1,
                        ClusterAction::Deleted => report.deleted += 1,
                        _ => {}
                    }
                }
                Ok(None) => report.busy += 1,
                Err(e) if matches!(e.kind, ErrorKind::QuotaExhausted { .. }) => report.refused += 1,
                Err(e) => {
                    tracing::warn!(tenant = %u.tenant, cluster = u.cluster, error = %e.message, "cluster summary failed");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }
}

/// Memories the engine stores in one call.
const BATCH: usize = 500;

/// The type of a memory written without one.
pub const DEFAULT_TYPE: &str = "fact";
/// The key of a memory written without one: one subject for the user's (and project's)
/// unkeyed facts, within which related ones cluster by meaning (a key made of the text would
/// put every fact in a cluster of its own, and no cluster summary would ever form).
pub const DEFAULT_KEY: &str = "general";
/// The longest text a pinned rule keeps, in characters.
pub const PIN_CHARS: usize = 1_000;
/// An example of the smallest memory, for the messages that show the shape.
pub const EXAMPLE: &str = r#"{"user": "alice", "text": "Prefers dark mode in every editor"}"#;

fn default_type() -> String {
    DEFAULT_TYPE.into()
}

fn default_key() -> String {
    DEFAULT_KEY.into()
}

/// One memory to store: the one input record of the HTTP body, the CLI's `memory add` and
/// `memory import` lines, and the MCP `remember` tool. Only `user` and `text` are needed.
#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct MemoryInput {
    /// A client id: writing it again is a no-op (default: one is made).
    #[serde(default)]
    pub id: Option<String>,
    /// Whose memory.
    pub user: String,
    /// The project (default empty).
    #[serde(default)]
    pub project: String,
    /// The environment (default empty).
    #[serde(default)]
    pub environment: String,
    /// The type of fact: `preference`, `fact`, `relationship`, … (default `fact`).
    #[serde(rename = "type", default = "default_type")]
    pub kind: String,
    /// The subject: a person, topic or entity (default `general`; related facts cluster by
    /// meaning within a key).
    #[serde(default = "default_key")]
    pub key: String,
    /// The fact.
    pub text: String,
    /// 0 to 1 (default 0.5).
    #[serde(default)]
    pub importance: Option<f32>,
    /// The id of a memory of the same scope this one replaces (default: the fact found in the
    /// text decides: "I moved to Lyon" replaces "I live in Porto").
    #[serde(default)]
    pub replaces: Option<String>,
}

impl From<MemoryInput> for MemoryIn {
    fn from(m: MemoryInput) -> Self {
        MemoryIn {
            id: m.id.unwrap_or_default(),
            scope: scope(&m.user, &m.project, &m.environment, &m.kind, &m.key),
            text: m.text,
            importance: m.importance,
            replaces: m.replaces,
        }
    }
}

/// What deleting a memory did.
#[derive(Debug)]
pub struct Deleted {
    /// The cluster it was in.
    pub cluster: u64,
    /// Whether a summary that covered it was deleted with it.
    pub summary_deleted: bool,
    /// Whether the cluster's summary is to be rebuilt from the remaining members.
    pub due: bool,
    /// How the rebuild went ([`Summaries::Now`]).
    pub outcomes: Vec<(u64, AppResult<Option<ClusterOutcome>>)>,
}

/// When a write's due clusters are summarized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Summaries {
    /// Here, before the write returns, with each outcome (the command line, the MCP tool).
    Now,
    /// In the background, after the write is acknowledged (the service: follow it with the
    /// events).
    Later,
    /// Not by this write: the sweeper (or [`Scoped::summarize_due`]) takes them.
    Leave,
}

/// What a write did.
#[derive(Debug)]
pub struct Written {
    /// Each memory, in the order given.
    pub memories: Vec<Remembered>,
    /// Whether the clusters it left due are being (or were) summarized.
    pub summarizing: bool,
    /// Why no cluster is summarized: the tenant's monthly ceiling is reached (the memories
    /// are stored).
    pub refused: Option<AppError>,
    /// Each due cluster and how its summary went ([`Summaries::Now`]).
    pub outcomes: Vec<(u64, AppResult<Option<ClusterOutcome>>)>,
}

/// A scope from its five fields.
pub fn scope(user: &str, project: &str, environment: &str, kind: &str, key: &str) -> Scope {
    Scope {
        user: user.into(),
        project: project.into(),
        environment: environment.into(),
        kind: kind.into(),
        key: key.into(),
    }
}
