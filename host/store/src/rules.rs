//! The rules every store enforces, written once. A store reads what a rule needs (with its own
//! SQL, or from its maps), asks the rule, and writes what the rule answers: no store decides a
//! chain, a memory's identity, a cluster's centroid, a summary's freshness, a ranking or a
//! reset on its own. The conformance suite (`tests/conformance.rs`) proves that the in-memory
//! store, SQLite and PostgreSQL keep them alike.

use crate::jobs::{Claim, Job, JobState};
use crate::tables::{Liveness, TenantCap};
use crate::types::{
    ClusterSummary, ClusterSummaryWrite, Compaction, Error, Hit, HitKind, Memory, MemoryFilter,
    NewMemory, Scope, SummaryRow, SummaryWrite,
};

// ---- The summary chain ------------------------------------------------------------------

/// The chain rule every store enforces before writing: rows of a session cover episodes
/// `1..=n` exactly once, in order. `episodes` is the session's episode count, `prev` its
/// latest row, and `target` the first and last episode of the active row `w.replaces` names
/// (`None` when no active row of this session has that id).
///
/// A write is one of three kinds: a new row starting right after the latest; an update of the
/// latest row that keeps its first episode and extends (or keeps) its end; or a rewrite of any
/// other active row that keeps its range exactly (a better summarizer rewriting what a fallback
/// wrote: the chain's coverage does not change).
pub fn check_chain(
    session: &str,
    episodes: u64,
    prev: Option<&SummaryRow>,
    target: Option<(u64, u64)>,
    w: &SummaryWrite,
) -> Result<(), Error> {
    let conflict =
        |why: String| Error::Conflict(format!("summary chain rule for session '{session}': {why}"));
    if w.last_episode > episodes || w.last_episode < w.first_episode || w.first_episode == 0 {
        return Err(conflict(format!(
            "coverage {}-{} is outside episodes 1-{episodes}",
            w.first_episode, w.last_episode
        )));
    }
    match (w.replaces, prev) {
        (None, _) => {
            let expect = prev.map_or(1, |p| p.last_episode + 1);
            if w.first_episode != expect {
                return Err(conflict(format!(
                    "a new row must start at episode {expect}, not {}",
                    w.first_episode
                )));
            }
        }
        (Some(id), Some(p)) if p.id == id => {
            if w.first_episode != p.first_episode || w.last_episode < p.last_episode {
                return Err(conflict(format!(
                    "an update of row {id} must keep its first episode {} and reach at least {}",
                    p.first_episode, p.last_episode
                )));
            }
        }
        (Some(id), _) => match target {
            Some((first, last)) => {
                if (w.first_episode, w.last_episode) != (first, last) {
                    return Err(conflict(format!(
                        "row {id} is not the latest row: a rewrite must keep its range {first}-{last}"
                    )));
                }
            }
            None => {
                return Err(conflict(format!(
                    "row {id} is not in the session's active chain"
                )));
            }
        },
    }
    Ok(())
}

/// The rule every store enforces before a compaction: the rows folded are the oldest rows of
/// the active chain (`active`, oldest first), at least two, in order. Returns the new row's
/// first and last episode and its level.
pub fn check_compaction(
    session: &str,
    active: &[SummaryRow],
    c: &Compaction,
) -> Result<(u64, u64, u32), Error> {
    let conflict = |why: String| {
        Error::Conflict(format!(
            "summary compaction rule for session '{session}': {why}"
        ))
    };
    if c.rows.len() < 2 {
        return Err(conflict("a compaction folds at least two rows".into()));
    }
    let head: Vec<u64> = active.iter().take(c.rows.len()).map(|r| r.id).collect();
    if head != c.rows {
        return Err(conflict(format!(
            "rows {:?} are not the oldest rows of the active chain ({:?})",
            c.rows, head
        )));
    }
    let folded = &active[..c.rows.len()];
    let level = folded.iter().map(|r| r.level).max().unwrap_or(0) + 1;
    Ok((
        folded[0].first_episode,
        folded[folded.len() - 1].last_episode,
        level,
    ))
}

/// What removing a session's newest episode `last` does to its summary rows (`history`: every
/// row, compacted ones included). Rows are ranges of a prefix, so only a row ending at `last`
/// covers it: every such row goes (`drop`: the latest active row, and each compaction that
/// folded it), and the rows those had folded that end before `last` become active again
/// (`reopen`). The chain rule holds after: the active rows cover `1..=k` for some `k < last`,
/// and the next refresh folds `k+1..last-1` again, without the removed episode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PopPlan {
    /// Rows deleted, ids ascending.
    pub drop: Vec<u64>,
    /// Rows made active again (their `compacted_into` cleared), ids ascending.
    pub reopen: Vec<u64>,
}

/// The plan for removing episode `last` (see [`PopPlan`]).
pub fn pop_plan(history: &[SummaryRow], last: u64) -> PopPlan {
    let mut drop: Vec<u64> = history
        .iter()
        .filter(|r| r.last_episode >= last)
        .map(|r| r.id)
        .collect();
    drop.sort_unstable();
    let mut reopen: Vec<u64> = history
        .iter()
        .filter(|r| r.last_episode < last)
        .filter(|r| {
            r.compacted_into
                .is_some_and(|c| drop.binary_search(&c).is_ok())
        })
        .map(|r| r.id)
        .collect();
    reopen.sort_unstable();
    PopPlan { drop, reopen }
}

/// One step of removing a session's newest episode besides its summary rows (see
/// [`POP_CASCADE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PopStep {
    /// Unpin the episode.
    Pin,
    /// Delete the session's `summary.written` events: they carry the text of rows that may
    /// have folded the episode in.
    SummaryEvents,
    /// Ask the session's running job to stop: it may have read the episode, and the next
    /// message takes the same id.
    CancelRunningJob,
    /// Take the episode out of its tenant's full-text totals.
    SearchTotals,
    /// Take the episode out of the full-text index.
    Terms,
}

/// What removing a session's newest episode touches outside the summary chain, in the same
/// transaction. Every store walks this list.
pub const POP_CASCADE: &[PopStep] = &[
    PopStep::Pin,
    PopStep::SummaryEvents,
    PopStep::CancelRunningJob,
    PopStep::SearchTotals,
    PopStep::Terms,
];

/// A pop step as one SQL statement: the session's key is parameter 1; when the flag is set,
/// the episode id is parameter 2.
pub fn pop_sql(step: PopStep, d: Dialect) -> (String, bool) {
    let (p1, p2) = (d.param(1), d.param(2));
    match step {
        PopStep::Pin => (
            format!("DELETE FROM session_pins WHERE session = {p1} AND episode = {p2}"),
            true,
        ),
        PopStep::SummaryEvents => (
            format!("DELETE FROM events WHERE session_key = {p1} AND kind = 'summary.written'"),
            false,
        ),
        PopStep::CancelRunningJob => (reset_sql(ResetStep::CancelRunningJob, d), false),
        PopStep::SearchTotals => (
            format!(
                "UPDATE search_totals SET docs = search_totals.docs - 1, length = search_totals.length - t.total FROM (SELECT tenant, length AS total FROM episode_terms WHERE session = {p1} AND episode = {p2}) AS t WHERE search_totals.tenant = t.tenant"
            ),
            true,
        ),
        PopStep::Terms => (
            format!("DELETE FROM episode_terms WHERE session = {p1} AND episode = {p2}"),
            true,
        ),
    }
}

// ---- Job claims -------------------------------------------------------------------------

/// Why a claim does not take a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The job reached a final state.
    Finished,
    /// A live worker holds it, or its session's running job, or its tenant's cap is reached.
    Busy,
}

impl Refusal {
    /// The claim's answer for `job`.
    pub fn answer(self, job: Job) -> Claim {
        match self {
            Refusal::Finished => Claim::Finished(job),
            Refusal::Busy => Claim::Busy(job),
        }
    }
}

/// A new job's id, given the newest id stored: the time it is queued, in milliseconds, times
/// 1,024, plus a random number below 1,024, and in any case above the newest id by a random
/// step of 1 to 1,024. Ids keep the order jobs were queued in, stay below 2^53 (exact in
/// JavaScript clients) until the year 2248, and say nothing about how many jobs other tenants
/// queue, which sequential ids would (a tenant could count them in the gaps between its
/// own). A store that finds the id taken (another instance drew it first) draws again.
pub fn new_job_id(now_ms: u64, newest: Option<u64>) -> u64 {
    let mut r = [0u8; 4];
    // The operating system's random source; should it fail, the time and the step of one
    // still give a fresh id.
    let _ = getrandom::fill(&mut r);
    let low = u64::from(u16::from_le_bytes([r[0], r[1]]) & 0x3ff);
    let step = 1 + u64::from(u16::from_le_bytes([r[2], r[3]]) & 0x3ff);
    let by_time = (now_ms.clamp(1, (1 << 43) - 1) << 10) | low;
    by_time.max(newest.map_or(0, |n| n + step))
}

/// The claim rule's first step, on the job as stored: a job in a final state is finished,
/// one a live worker holds is busy; `None` lets the claim go on to [`claim_rest`].
pub fn claim_first(job: &Job, live: Liveness<'_>) -> Option<Refusal> {
    if !job.state.is_active() {
        Some(Refusal::Finished)
    } else if live(job) {
        Some(Refusal::Busy)
    } else {
        None
    }
}

/// The claim rule's second step: one running job per session, so another running job of the
/// session that a live worker holds (`others`: the session's other running jobs) makes it
/// busy; so does the tenant's cap, when `running` (the tenant's other running jobs whose
/// leases last past now, see [`counts_against_cap`]) reaches `cap.max`.
pub fn claim_rest(
    others: &[Job],
    live: Liveness<'_>,
    running: usize,
    cap: Option<TenantCap<'_>>,
) -> Option<Refusal> {
    (others.iter().any(live) || cap.is_some_and(|cap| running >= cap.max)).then_some(Refusal::Busy)
}

/// Whether `other` counts against the cap of a claim of job `id` at `now_ms`: another job of
/// the cap's tenant, running under a lease that lasts past now.
pub fn counts_against_cap(other: &Job, id: u64, now_ms: u64, cap: TenantCap<'_>) -> bool {
    other.id != id
        && other.state == JobState::Running
        && other.lease_until_ms.is_some_and(|u| u > now_ms)
        && other.tenant == *cap.tenant
}

/// A job as a claim leaves it: running under `owner`'s lease until `until_ms`, one more
/// attempt, its first start kept, its last error cleared. (The SQL stores write the same in
/// one `UPDATE`.)
pub fn claimed(job: &mut Job, owner: &str, now_ms: u64, until_ms: u64) {
    job.state = JobState::Running;
    job.attempts += 1;
    job.lease_owner = Some(owner.to_string());
    job.lease_until_ms = Some(until_ms);
    job.started_ms.get_or_insert(now_ms);
    job.updated_ms = now_ms;
    job.error = None;
}

// ---- The reset cascade ------------------------------------------------------------------

/// One step of forgetting a session (see [`RESET_CASCADE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetStep {
    /// Delete the rows of `table` whose `column` is the session's key.
    Rows {
        /// The table.
        table: &'static str,
        /// The column holding the session's key.
        column: &'static str,
    },
    /// Delete the imported files that produced the session (their `sessions` list names it),
    /// so the next backfill or watch reads them again and the session comes back.
    SourcesNaming,
    /// Delete the session's jobs that are not running.
    JobsNotRunning,
    /// Ask the session's running job to stop (its write would fail the chain rule against the
    /// emptied session anyway).
    CancelRunningJob,
    /// Take the session's episodes out of its tenant's full-text totals.
    SearchTotals,
}

/// Everything a reset forgets, in order, in one transaction: the session's summaries and
/// episodes, its failure marker, file marks and the files it came from, its watched files,
/// mode, focus and pins, its events (they carry its summaries' text), its jobs, and the
/// session row itself. Every store walks this list; none keeps its own.
pub const RESET_CASCADE: &[ResetStep] = &[
    ResetStep::SearchTotals,
    ResetStep::Rows {
        table: "episode_terms",
        column: "session",
    },
    ResetStep::Rows {
        table: "summaries",
        column: "session",
    },
    ResetStep::Rows {
        table: "episodes",
        column: "session",
    },
    ResetStep::Rows {
        table: "failure_markers",
        column: "session",
    },
    ResetStep::Rows {
        table: "source_marks",
        column: "session",
    },
    ResetStep::SourcesNaming,
    ResetStep::Rows {
        table: "watched_files",
        column: "session",
    },
    ResetStep::Rows {
        table: "session_modes",
        column: "session",
    },
    ResetStep::Rows {
        table: "session_focus",
        column: "session",
    },
    ResetStep::Rows {
        table: "session_labels",
        column: "session",
    },
    ResetStep::Rows {
        table: "session_grams",
        column: "session",
    },
    ResetStep::Rows {
        table: "session_pins",
        column: "session",
    },
    ResetStep::Rows {
        table: "events",
        column: "session_key",
    },
    ResetStep::JobsNotRunning,
    ResetStep::CancelRunningJob,
    ResetStep::Rows {
        table: "sessions",
        column: "id",
    },
];

/// A SQL dialect's spelling of what the rules need in SQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: `?n` placeholders, JSON through `json_each`.
    Sqlite,
    /// PostgreSQL: `$n` placeholders, JSON through `jsonb`.
    Postgres,
}

impl Dialect {
    /// The `n`-th placeholder.
    pub fn param(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    /// The memories' and clusters' `user` column (a reserved word in PostgreSQL).
    pub fn user_column(self) -> &'static str {
        match self {
            Dialect::Sqlite => "user",
            Dialect::Postgres => "\"user\"",
        }
    }
}

/// A reset step as one SQL statement with the session's key as its only parameter.
pub fn reset_sql(step: ResetStep, d: Dialect) -> String {
    let p = d.param(1);
    match step {
        ResetStep::Rows { table, column } => format!("DELETE FROM {table} WHERE {column} = {p}"),
        ResetStep::SourcesNaming => match d {
            Dialect::Sqlite => format!(
                "DELETE FROM sources WHERE EXISTS (SELECT 1 FROM json_each(sources.sessions) WHERE value = {p})"
            ),
            Dialect::Postgres => format!("DELETE FROM sources WHERE sessions::jsonb ? {p}"),
        },
        ResetStep::JobsNotRunning => {
            format!("DELETE FROM jobs WHERE session = {p} AND state != 'running'")
        }
        ResetStep::CancelRunningJob => {
            format!(
                "UPDATE jobs SET cancel_requested = 1 WHERE session = {p} AND state = 'running'"
            )
        }
        ResetStep::SearchTotals => format!(
            "UPDATE search_totals SET docs = search_totals.docs - t.n, length = search_totals.length - t.total FROM (SELECT tenant, COUNT(*) AS n, SUM(length) AS total FROM episode_terms WHERE session = {p} GROUP BY tenant) AS t WHERE search_totals.tenant = t.tenant"
        ),
    }
}

// ---- Memories and their clusters --------------------------------------------------------

/// Whether two scopes are the same.
pub fn same_scope(a: &Scope, b: &Scope) -> bool {
    (&a.user, &a.project, &a.environment, &a.kind, &a.key)
        == (&b.user, &b.project, &b.environment, &b.kind, &b.key)
}

/// Whether a scope passes a filter (an absent field matches anything).
pub fn matches(f: &MemoryFilter, s: &Scope) -> bool {
    let ok = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    ok(&f.user, &s.user)
        && ok(&f.project, &s.project)
        && ok(&f.environment, &s.environment)
        && ok(&f.kind, &s.kind)
        && ok(&f.key, &s.key)
}

/// [`matches`] in SQL: a `WHERE` fragment (after the tenant's own condition, parameter 1) over
/// columns with the given prefix, and the values of every parameter: the tenant first, then
/// the filter's fields.
pub fn filter_sql(
    d: Dialect,
    tenant: &str,
    f: &MemoryFilter,
    prefix: &str,
) -> (String, Vec<String>) {
    let mut sql = String::new();
    let mut args = vec![tenant.to_string()];
    for (col, v) in [
        (d.user_column(), &f.user),
        ("project", &f.project),
        ("environment", &f.environment),
        ("kind", &f.kind),
        ("key", &f.key),
    ] {
        if let Some(v) = v {
            args.push(v.clone());
            sql.push_str(&format!(" AND {prefix}{col} = {}", d.param(args.len())));
        }
    }
    (sql, args)
}

/// A write of `m` whose id is already stored as `stored`: the same fact (scope and text) is an
/// idempotent success, anything else is refused.
pub fn check_same_memory(stored: &Memory, m: &NewMemory) -> Result<(), Error> {
    if same_scope(&stored.scope, &m.scope) && stored.text == m.text {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "memory '{}' already exists with another scope or text; give a new id to store a different fact",
            m.id
        )))
    }
}

/// A write of `m` into the cluster it names (`id`, which the guest chose by its centroid):
/// `found` is that cluster's scope and vector model as the store reads them now. A cluster
/// that is gone or changed since the guest looked refuses the write like a lost race.
pub fn check_named_cluster(
    id: u64,
    found: Option<(&Scope, &str)>,
    m: &NewMemory,
) -> Result<(), Error> {
    match found {
        Some((scope, model)) if same_scope(scope, &m.scope) && model == m.model => Ok(()),
        _ => Err(Error::Conflict(format!(
            "cluster {id} changed under the write (it is gone or holds other vectors); write again"
        ))),
    }
}

/// A cluster's vector sum after `m` joins it (`sum` is the sum before; a new cluster's is
/// empty). A vector of another length is refused.
pub fn joined_sum(cluster: u64, mut sum: Vec<f32>, m: &NewMemory) -> Result<Vec<f32>, Error> {
    if sum.is_empty() {
        sum = vec![0.0; m.vector.len()];
    }
    if sum.len() != m.vector.len() {
        return Err(Error::InvalidInput(format!(
            "a vector of {} values does not match cluster {cluster}'s {}",
            m.vector.len(),
            sum.len()
        )));
    }
    add_into(&mut sum, &m.vector, 1.0);
    Ok(sum)
}

/// A cluster's vector sum after a member leaves: `left` members stay; the member's vector is
/// taken out when it was made by the cluster's model (after a re-embedding it was already
/// replaced), and an empty cluster's sum is zero.
pub fn left_sum(
    mut sum: Vec<f32>,
    left: u32,
    cluster_model: &str,
    member_model: &str,
    vector: &[f32],
) -> Vec<f32> {
    if left == 0 {
        sum.iter_mut().for_each(|x| *x = 0.0);
    } else if cluster_model == member_model {
        add_into(&mut sum, vector, -1.0);
    }
    sum
}

/// A cluster's vector sum after its members were re-embedded: the sum of the vectors that
/// reached a member of the cluster.
pub fn sum_of<'a>(vectors: impl IntoIterator<Item = &'a [f32]>) -> Vec<f32> {
    let mut sum: Vec<f32> = Vec::new();
    for v in vectors {
        if sum.is_empty() {
            sum = vec![0.0; v.len()];
        }
        add_into(&mut sum, v, 1.0);
    }
    sum
}

/// A cluster's centroid: the mean of its members' vectors.
pub fn centroid(sum: &[f32], members: u32) -> Vec<f32> {
    sum.iter().map(|x| x / members.max(1) as f32).collect()
}

/// Add (`sign` 1) or subtract (`sign` -1) `v` into a vector sum.
fn add_into(sum: &mut [f32], v: &[f32], sign: f32) {
    for (s, x) in sum.iter_mut().zip(v) {
        *s += sign * x;
    }
}

/// The character trigrams of `text` lowercased: a session search for `q` looks only at
/// sessions holding every trigram of `q` (a text that contains `q` holds them all).
pub fn trigrams(text: &str) -> std::collections::BTreeSet<String> {
    let chars: Vec<char> = text.to_lowercase().chars().collect();
    chars.windows(3).map(|w| w.iter().collect()).collect()
}

/// What a session search matches a session on: its id as its tenant sees it, and every string
/// in its label (JSON `{"title", "project"}`; a label that is not JSON counts as one string).
pub fn searchable(id: &str, label: Option<&str>) -> Vec<String> {
    fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut out = vec![id.to_string()];
    if let Some(l) = label {
        match serde_json::from_str::<serde_json::Value>(l) {
            Ok(v) => strings(&v, &mut out),
            Err(_) => out.push(l.to_string()),
        }
    }
    out
}

/// A session's trigrams as its tenant's search index keeps them: keyed hashes, so the index
/// says nothing of sealed names without the tenant's key (`key`: derived from the tenant's
/// data key when there is a master key, else a fixed one — names are stored plain then).
pub fn gram_hashes<'a>(
    key: &[u8],
    texts: impl IntoIterator<Item = &'a str>,
) -> std::collections::BTreeSet<i64> {
    texts
        .into_iter()
        .flat_map(trigrams)
        .map(|g| gram_hash(key, &g))
        .collect()
}

/// One trigram's keyed hash: the first 8 bytes of HMAC-SHA-256.
pub fn gram_hash(key: &[u8], gram: &str) -> i64 {
    use hmac::Mac;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    m.update(gram.as_bytes());
    let d = m.finalize().into_bytes();
    i64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// The key of a tenant's session search index: from its lexical key (derived from its first
/// data key, see `RecallStore::lexical_key`), or a fixed one without a master key.
pub fn grams_key(lexical: Option<&[u8]>) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::new()
        .chain_update(b"abridge session search grams v1\0")
        .chain_update(lexical.unwrap_or_default())
        .finalize()
        .to_vec()
}

/// How many of a query's trigram hashes a search looks up (the rarest first): enough to make
/// the candidates few; every candidate is checked against the whole query anyway.
pub const QUERY_GRAMS: usize = 6;

/// Postings a search counts of one trigram, at most: enough to tell the rare from the common.
pub const GRAM_COUNT_CAP: u32 = 1024;

/// The trigram hashes a search looks up, rarest first, from `(postings, hash)` pairs (counted
/// up to [`GRAM_COUNT_CAP`]): `None` when one has no posting (nothing can match).
pub fn rarest_grams(mut counted: Vec<(i64, i64)>) -> Option<Vec<i64>> {
    if counted.iter().any(|(n, _)| *n == 0) {
        return None;
    }
    counted.sort_unstable();
    counted.truncate(QUERY_GRAMS);
    Some(counted.into_iter().map(|(_, g)| g).collect())
}

/// A `seq` bound as SQL compares it (a signed 64-bit column).
pub fn seq_arg(seq: u64) -> i64 {
    seq.min(i64::MAX as u64) as i64
}

/// The order of `top-members`: importance (highest first), then oldest, then id (the SQL
/// stores' `ORDER BY importance DESC, created_ms, id`).
pub fn rank_members(v: &mut [Memory]) {
    v.sort_by(|a, b| {
        b.importance
            .total_cmp(&a.importance)
            .then(a.created_ms.cmp(&b.created_ms))
            .then(a.id.cmp(&b.id))
    });
}

/// Whether a cluster summary write may land: the summary it replaces is the one it expects
/// (`current_hash`, the stored summary's member hash), and the cluster's membership version
/// (`version`, `None` for a cluster that is gone) is the one the guest read the members at. A
/// change since then means the write is for an old set, and it is refused like a lost race.
pub fn summary_write_allowed(
    current_hash: Option<&str>,
    w: &ClusterSummaryWrite,
    version: Option<u64>,
) -> bool {
    current_hash == w.expect.as_deref() && version == Some(w.version)
}

/// The summary row a write leaves: `current` is the row it replaces (its id and creation time
/// stay), `new_id` the id a first summary of the cluster takes.
pub fn summary_written(
    current: Option<(u64, u64)>,
    new_id: impl FnOnce() -> u64,
    w: &ClusterSummaryWrite,
) -> ClusterSummary {
    let (id, created_ms) = current.unwrap_or_else(|| (new_id(), w.now_ms));
    ClusterSummary {
        id,
        cluster: w.cluster,
        text: w.text.clone(),
        member_hash: w.member_hash.clone(),
        covered_seq: w.covered_seq,
        covered: w.covered,
        importance: w.importance,
        tokens: w.tokens,
        model: w.model.clone(),
        calls: w.calls,
        prompt_tokens: w.prompt_tokens,
        output_tokens: w.output_tokens,
        created_ms,
        updated_ms: w.now_ms,
    }
}

// ---- Recall -----------------------------------------------------------------------------

/// Keeps the `limit` best hits seen: higher similarity first, ties by id.
pub struct TopK {
    limit: usize,
    hits: Vec<Hit>,
}

impl TopK {
    /// Empty, keeping `limit`.
    pub fn new(limit: usize) -> TopK {
        TopK {
            limit,
            hits: Vec::new(),
        }
    }

    /// Offer a hit, made only when it may enter.
    pub fn offer(&mut self, similarity: f32, make: impl FnOnce(f32) -> Hit) {
        if self.limit == 0 {
            return;
        }
        if self.hits.len() >= self.limit
            && self
                .hits
                .last()
                .is_some_and(|worst| similarity <= worst.similarity)
        {
            return;
        }
        let h = make(similarity);
        let at = self.hits.partition_point(|x| {
            x.similarity > similarity || (x.similarity == similarity && x.id < h.id)
        });
        self.hits.insert(at, h);
        self.hits.truncate(self.limit);
    }

    /// The hits, best first.
    pub fn into_hits(self) -> Vec<Hit> {
        self.hits
    }
}

/// A search's answer being assembled: the `limit` best memories, then the `limit` best
/// cluster summaries, each ranked by cosine similarity to the query (the guest's own cosine,
/// so a store ranks exactly as the component compares).
pub struct Ranking {
    memories: TopK,
    summaries: TopK,
}

impl Ranking {
    /// Empty, keeping `limit` of each kind.
    pub fn new(limit: u32) -> Ranking {
        Ranking {
            memories: TopK::new(limit as usize),
            summaries: TopK::new(limit as usize),
        }
    }

    /// Offer a memory by its stored vector. The text may be filled later, for the hits kept
    /// only ([`Ranking::into_hits`] keeps the order).
    pub fn memory(
        &mut self,
        query: &[f32],
        vector: &[f32],
        make: impl FnOnce() -> (String, String, f32, u64),
    ) {
        self.memory_at(cosine(query, vector), make);
    }

    /// Offer a memory whose similarity was measured elsewhere (an ANN index).
    pub fn memory_at(
        &mut self,
        similarity: f32,
        make: impl FnOnce() -> (String, String, f32, u64),
    ) {
        self.memories.offer(similarity, |s| {
            let (id, text, importance, cluster) = make();
            Hit {
                kind: HitKind::Memory,
                id,
                text,
                similarity: s,
                importance,
                cluster,
                covered_seq: 0,
                covered: 0,
                superseded_by: None,
                superseded_ms: 0,
            }
        });
    }

    /// Offer a cluster summary by its stored vector.
    pub fn summary(&mut self, query: &[f32], vector: &[f32], make: impl FnOnce() -> SummaryHit) {
        self.summaries.offer(cosine(query, vector), |s| {
            let h = make();
            Hit {
                kind: HitKind::Summary,
                id: h.id.to_string(),
                text: h.text,
                similarity: s,
                importance: h.importance,
                cluster: h.cluster,
                covered_seq: h.covered_seq,
                covered: h.covered,
                superseded_by: None,
                superseded_ms: 0,
            }
        });
    }

    /// The memories kept, best first, then the summaries kept, best first.
    pub fn into_hits(self) -> (Vec<Hit>, Vec<Hit>) {
        (self.memories.into_hits(), self.summaries.into_hits())
    }
}

/// What a summary hit shows (see [`Ranking::summary`]).
pub struct SummaryHit {
    /// The summary's id.
    pub id: u64,
    /// Its text (may be filled later, for the hits kept only).
    pub text: String,
    /// Its importance.
    pub importance: f32,
    /// The cluster it summarizes.
    pub cluster: u64,
    /// The newest member it covers.
    pub covered_seq: u64,
    /// How many members it covers.
    pub covered: u32,
}

/// The smallest string above every string that starts with `prefix` (`None`: no bound, for
/// an empty prefix or one of only `char::MAX`): a key range `[prefix, bound)` holds exactly
/// the keys with that prefix, in byte order (UTF-8 orders as code points do).
pub fn prefix_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // The next scalar value (skipping the surrogate gap).
        let next = match last as u32 {
            0xD7FF => Some('\u{E000}'),
            c => char::from_u32(c + 1),
        };
        if let Some(n) = next {
            chars.push(n);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Cosine similarity (0 for mismatched or zero vectors), summed in f64: every step is exactly
/// rounded, so it equals the guest's bit for bit (`tests/golden/cosine`, checked by the
/// guest's, this crate's and the JS host's tests).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (dot, na, nb) = a
        .iter()
        .zip(b)
        .fold((0f64, 0f64, 0f64), |(d, p, q), (x, y)| {
            let (x, y) = (f64::from(*x), f64::from(*y));
            (d + x * y, p + x * x, q + y * y)
        });
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        (dot / (na.sqrt() * nb.sqrt())) as f32
    }
}

/// The tables both databases keep: a database holding a table neither this list nor its own
/// kind's names belongs to another program, and is refused rather than migrated.
pub(crate) const TABLES: &[&str] = &[
    "sessions",
    "episodes",
    "summaries",
    "calibration",
    "partials",
    "jobs",
    "sources",
    "failure_markers",
    "watched_files",
    "source_marks",
    "session_modes",
    "tokens",
    "events",
    "clusters",
    "memories",
    "cluster_summaries",
    "data_keys",
    "usage",
    "usage_days",
    "session_focus",
    "session_pins",
    "session_labels",
    "session_grams",
    "episode_terms",
    "search_totals",
];

/// `Err` with the first five foreign tables (and ", …" when there are more) when `present`
/// holds a table that is neither in [`TABLES`] nor in `own` (the database kind's own).
pub(crate) fn refuse_foreign(
    present: &[String],
    own: &[&str],
) -> Result<(), (String, &'static str)> {
    let foreign: Vec<&str> = present
        .iter()
        .map(String::as_str)
        .filter(|t| !TABLES.contains(t) && !own.contains(t))
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    let shown = foreign
        .iter()
        .take(5)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    Err((shown, if foreign.len() > 5 { ", …" } else { "" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_that_holds_a_query_holds_every_trigram_of_it() {
        let key = grams_key(Some(b"tenant key"));
        let texts = searchable(
            "Deploy-Notes",
            Some(r#"{"title":"Überblick: \"Q3\" plan","project":"web"}"#),
        );
        assert_eq!(texts, ["Deploy-Notes", "web", "Überblick: \"Q3\" plan"]);
        let held = gram_hashes(&key, texts.iter().map(String::as_str));
        for q in ["deploy", "LOY-n", "überb", "\"q3\"", "web"] {
            assert!(
                gram_hashes(&key, [q]).is_subset(&held),
                "{q} is in the texts, so are its trigrams"
            );
        }
        assert!(!gram_hashes(&key, ["xyz"]).is_subset(&held));
        assert!(
            gram_hashes(&key, ["ab"]).is_empty(),
            "under three characters: no trigram"
        );
        // Another tenant's key gives other hashes: the index says nothing across tenants.
        let other = grams_key(Some(b"another key"));
        assert!(gram_hashes(&other, ["deploy"]).is_disjoint(&held));
        assert_ne!(grams_key(None), key);
        // A label that is not JSON is searched as it stands.
        assert_eq!(searchable("s", Some("plain")), ["s", "plain"]);
        // A session without a name is searched on its id.
        assert_eq!(searchable("notes", None), ["notes"]);
        // A search looks up the rarest trigrams, and none when one has no posting.
        let counted: Vec<(i64, i64)> = (0..9).map(|g| (100 - g, g)).collect();
        assert_eq!(rarest_grams(counted), Some(vec![8, 7, 6, 5, 4, 3]));
        assert_eq!(rarest_grams(vec![(3, 1), (0, 2)]), None);
    }

    #[test]
    fn job_ids_order_by_time_and_hide_counts() {
        let a = new_job_id(1_764_000_000_000, None);
        let b = new_job_id(1_764_000_000_001, Some(a));
        assert!(a < b);
        assert!(b < 1 << 53);
        assert_eq!(a >> 10, 1_764_000_000_000);
        // Queued in the same millisecond, or under a clock that stands still: still in order.
        let c = new_job_id(1_764_000_000_001, Some(b));
        assert!(c > b && c - b <= 1024);
        let many: std::collections::BTreeSet<u64> =
            (0..64).map(|_| new_job_id(5, None) & 0x3ff).collect();
        assert!(many.len() > 16, "the low bits are random");
    }

    fn scope() -> Scope {
        Scope {
            user: "u".into(),
            project: "p".into(),
            environment: "e".into(),
            kind: "fact".into(),
            key: "k".into(),
        }
    }

    fn new_memory(v: Vec<f32>) -> NewMemory {
        NewMemory {
            id: "m".into(),
            scope: scope(),
            text: "t".into(),
            importance: 0.5,
            tokens: 1,
            created_ms: 0,
            model: "emb".into(),
            vector: v,
            cluster: None,
            fact_key: String::new(),
            replaces: None,
        }
    }

    #[test]
    fn a_cluster_sum_joins_leaves_and_refuses_another_length() {
        let m = new_memory(vec![1.0, 2.0]);
        let s = joined_sum(1, Vec::new(), &m).unwrap();
        assert_eq!(s, vec![1.0, 2.0]);
        let s = joined_sum(1, s, &m).unwrap();
        assert_eq!(centroid(&s, 2), vec![1.0, 2.0]);
        let e = joined_sum(1, s.clone(), &new_memory(vec![1.0])).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(m) if m.contains("does not match cluster 1")));
        assert_eq!(
            left_sum(s.clone(), 1, "emb", "emb", &[1.0, 2.0]),
            vec![1.0, 2.0]
        );
        assert_eq!(left_sum(s.clone(), 1, "new", "emb", &[1.0, 2.0]), s);
        assert_eq!(left_sum(s, 0, "emb", "emb", &[9.0, 9.0]), vec![0.0, 0.0]);
        assert_eq!(
            sum_of([&[1.0f32, 1.0][..], &[2.0, 3.0][..]]),
            vec![3.0, 4.0]
        );
    }

    #[test]
    fn a_named_cluster_must_still_hold_the_scope_and_model() {
        let m = new_memory(vec![1.0]);
        let other = Scope {
            key: "other".into(),
            ..scope()
        };
        assert!(check_named_cluster(3, Some((&scope(), "emb")), &m).is_ok());
        for found in [None, Some((&other, "emb")), Some((&scope(), "old"))] {
            let e = check_named_cluster(3, found, &m).unwrap_err();
            assert!(matches!(e, Error::Conflict(m) if m.contains("cluster 3 changed")));
        }
    }

    fn row(id: u64, first: u64, last: u64, level: u32, into: Option<u64>) -> SummaryRow {
        SummaryRow {
            id,
            first_episode: first,
            last_episode: last,
            content: String::new(),
            tokens: 0,
            prompt_tokens: 0,
            output_tokens: 0,
            model: String::new(),
            created_ms: 0,
            updated_ms: 0,
            skipped: Vec::new(),
            level,
            compacted_into: into,
            ledger: Vec::new(),
            ledger_dropped: 0,
        }
    }

    #[test]
    fn a_pop_drops_every_row_ending_at_the_episode_and_reopens_what_they_folded() {
        // 1-4, 5-8 folded into 9 (1-8); 9 and 10 (9-12) folded into 11 (1-12); 12 is 13-20.
        let history = vec![
            row(1, 1, 4, 0, Some(3)),
            row(2, 5, 8, 0, Some(3)),
            row(3, 1, 8, 1, Some(5)),
            row(4, 9, 12, 0, Some(5)),
            row(5, 1, 12, 2, None),
            row(6, 13, 20, 0, None),
        ];
        assert_eq!(
            pop_plan(&history, 20),
            PopPlan {
                drop: vec![6],
                reopen: vec![]
            }
        );
        // The compaction 5 and the row 4 both end at 12: both go; 3 becomes active (1-8).
        let history: Vec<SummaryRow> = history.into_iter().filter(|r| r.id != 6).collect();
        assert_eq!(
            pop_plan(&history, 12),
            PopPlan {
                drop: vec![4, 5],
                reopen: vec![3]
            }
        );
        assert_eq!(pop_plan(&[], 3), PopPlan::default());
        // A row ending before the episode stays as it is.
        assert_eq!(pop_plan(&[row(1, 1, 4, 0, None)], 5), PopPlan::default());
        let (sql, binds) = pop_sql(PopStep::Pin, Dialect::Postgres);
        assert!(binds && sql.ends_with("episode = $2"), "{sql}");
        assert!(!pop_sql(PopStep::SummaryEvents, Dialect::Sqlite).1);
    }

    #[test]
    fn the_reset_cascade_is_the_same_statement_list_in_both_dialects() {
        let lite: Vec<String> = RESET_CASCADE
            .iter()
            .map(|s| reset_sql(*s, Dialect::Sqlite))
            .collect();
        let pg: Vec<String> = RESET_CASCADE
            .iter()
            .map(|s| reset_sql(*s, Dialect::Postgres))
            .collect();
        assert_eq!(lite.len(), pg.len());
        assert_eq!(lite[2], "DELETE FROM summaries WHERE session = ?1");
        assert_eq!(pg[2], "DELETE FROM summaries WHERE session = $1");
        assert!(lite.last().unwrap().contains("FROM sessions WHERE id"));
        let (sql, args) = filter_sql(
            Dialect::Postgres,
            "acme",
            &MemoryFilter {
                user: Some("ann".into()),
                project: None,
                environment: None,
                kind: Some("fact".into()),
                key: None,
                exact: false,
            },
            "c.",
        );
        assert_eq!(sql, " AND c.\"user\" = $2 AND c.kind = $3");
        assert_eq!(args, vec!["acme", "ann", "fact"]);
    }

    #[test]
    fn a_prefix_range_holds_exactly_the_keys_with_the_prefix() {
        assert_eq!(prefix_bound("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_bound("a\u{1f}").as_deref(), Some("a\u{20}"));
        assert_eq!(prefix_bound("x\u{D7FF}").as_deref(), Some("x\u{E000}"));
        assert_eq!(prefix_bound("é\u{10FFFF}").as_deref(), Some("ê"));
        assert_eq!(prefix_bound(""), None);
        let bound = prefix_bound("ab").unwrap();
        for k in ["ab", "ab\u{10FFFF}\u{10FFFF}", "abz"] {
            assert!(k >= "ab" && k < bound.as_str(), "{k}");
        }
        for k in ["aa", "ac", "b"] {
            assert!(!(k >= "ab" && k < bound.as_str()), "{k}");
        }
    }
}
