//! Durable summarization jobs in the SQLite database: queued → running → succeeded | failed |
//! cancelled, with progress, attempts, the last error, timestamps and a lease.
//!
//! A job brings one session's summaries up to a coverage target (its last episode id). The
//! idempotency key `session@target` admits one active (queued or running) job at a time, so the
//! same work never runs twice at once, whoever asks. A running job holds a lease that its worker
//! renews; when the worker dies (its process is gone, or the lease ran out) another worker takes
//! the job over, and the partial-summary cache makes the new attempt ask the model only for what
//! is missing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};
use crate::control::{CallControl, Progress};
use crate::runtime::{Abridge, CallError};
use crate::store::{AppStore, JobStore, TenantCap};
use crate::tenant::Tenant;
use crate::types::{Config, Error, Outcome};

pub use abridge_store::jobs::{Beat, Claim, Job, JobState};

/// This process's lease owner name: `host:pid`.
pub fn owner_name() -> String {
    format!("{}:{}", host_name(), std::process::id())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether the lease owner is certainly gone: a process on this host that no longer exists.
fn owner_is_dead(owner: &str) -> bool {
    let Some((host, pid)) = owner.rsplit_once(':') else {
        return false;
    };
    host == host_name()
        && pid.parse::<u32>().is_ok_and(|pid| {
            Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
        })
}

/// How often a process applies the finished-job retention (at most; after finishing a job).
const PRUNE_EVERY_MS: u64 = 10 * 60 * 1000;

/// The durable jobs of a store, worked by this process.
#[derive(Clone)]
pub struct Jobs {
    db: Arc<dyn JobStore>,
    owner: String,
    lease: Duration,
    clock: Arc<dyn Clock>,
    retention: (Duration, u32),
    /// When this process last applied the retention (ms; 0: not yet).
    last_prune: Arc<AtomicU64>,
}

impl Jobs {
    /// Jobs in `db`, worked by this process, with leases of `lease`.
    pub fn new(db: Arc<dyn JobStore>, lease: Duration) -> Self {
        Jobs {
            db,
            owner: owner_name(),
            lease,
            clock: Arc::new(SystemClock),
            retention: (
                crate::limits::JOB_RETENTION,
                crate::limits::JOB_RETENTION_COUNT,
            ),
            last_prune: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The same jobs, keeping finished ones for `age` and each tenant's newest `count`.
    pub fn with_retention(mut self, age: Duration, count: u32) -> Self {
        self.retention = (age, count);
        self
    }

    /// Apply the retention now: finished jobs older than it, and each tenant's beyond its
    /// count, go with their events. How many went.
    pub async fn prune(&self) -> Result<u64, Error> {
        let now = self.now_ms();
        self.last_prune.store(now.max(1), Ordering::Relaxed);
        let (age, count) = self.retention;
        self.db
            .jobs_prune(now.saturating_sub(age.as_millis() as u64), count)
            .await
    }

    /// [`Self::prune`] when this process has not for [`PRUNE_EVERY_MS`] (one caller wins).
    async fn prune_if_due(&self) {
        let now = self.now_ms();
        let last = self.last_prune.load(Ordering::Relaxed);
        if last != 0 && now < last.saturating_add(PRUNE_EVERY_MS) {
            return;
        }
        if self
            .last_prune
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        if let Err(e) = self.prune().await {
            tracing::warn!(error = %crate::types::describe(&e), "cannot prune finished jobs");
        }
    }

    /// The same jobs with timestamps and leases read from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The same jobs worked under another lease owner name (tests play several workers).
    pub fn with_owner(mut self, owner: &str) -> Self {
        self.owner = owner.to_string();
        self
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn until_ms(&self) -> u64 {
        self.now_ms() + self.lease.as_millis() as u64
    }

    /// The newest jobs of one tenant with `id < before` (all when `None`), newest first, at
    /// most `limit`.
    pub async fn list_for(
        &self,
        tenant: &dyn AppStore,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Job>, Error> {
        tenant.jobs_list(before, limit).await
    }

    /// Counts of jobs by state (for metrics).
    pub async fn counts(&self) -> Result<Vec<(String, u64)>, Error> {
        self.db.job_counts().await
    }

    /// The active (queued or running) job of a tenant's session, if any.
    pub async fn active_for(
        &self,
        tenant: &dyn AppStore,
        session: &str,
    ) -> Result<Option<Job>, Error> {
        tenant.job_active_for(session).await
    }

    /// How many jobs the tenant has queued, and its queued job of `session`, if any (`""`:
    /// none asked). Two indexed reads, whatever the size of the queue.
    pub async fn queued_of(
        &self,
        tenant: &dyn AppStore,
        session: &str,
    ) -> Result<(usize, Option<Job>), Error> {
        let n = tenant.jobs_queued().await? as usize;
        let mine = if session.is_empty() {
            None
        } else {
            tenant
                .job_active_for(session)
                .await?
                .filter(|j| j.state == JobState::Queued)
        };
        Ok((n, mine))
    }

    /// This worker's lease owner name.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// One job.
    pub async fn get(&self, id: u64) -> Result<Option<Job>, Error> {
        self.db.job_get(id).await
    }

    /// The newest `limit` jobs, newest first.
    pub async fn list(&self, limit: u32) -> Result<Vec<Job>, Error> {
        self.db.jobs_list(None, limit).await
    }

    /// The job for (`session`, `target`): the active one if there is one, else a new queued
    /// job. Returns the job and whether it was created.
    pub async fn enqueue(
        &self,
        tenant: &dyn AppStore,
        session: &str,
        target: u64,
        cfg: &Config,
    ) -> Result<(Job, bool), Error> {
        let config = crate::types::config_to_json(cfg).to_string();
        tenant
            .job_enqueue(session, target, &config, self.now_ms())
            .await
    }

    /// Take job `id` if it is queued, or running under a lease that expired or whose owner is
    /// gone. Another job of the same session running under a live lease makes it busy too.
    pub async fn claim(&self, id: u64) -> Result<Claim, Error> {
        self.claim_capped(id, None).await
    }

    /// [`Jobs::claim`], busy too while the job's tenant runs `cap` jobs (on any worker of
    /// the store, every process sharing it included).
    pub async fn claim_capped(
        &self,
        id: u64,
        cap: Option<(&Tenant, usize)>,
    ) -> Result<Claim, Error> {
        let now = self.now_ms();
        let owner = self.owner.clone();
        let live = move |j: &Job| {
            j.state == JobState::Running
                && j.lease_owner.as_deref() != Some(owner.as_str())
                && j.lease_until_ms.is_some_and(|u| u > now)
                && !j.lease_owner.as_deref().is_some_and(owner_is_dead)
        };
        let cap = cap.map(|(tenant, max)| TenantCap { tenant, max });
        self.db
            .job_claim(id, &self.owner, now, self.until_ms(), &live, cap)
            .await
    }

    /// Renew the lease and record progress.
    pub async fn heartbeat(&self, id: u64, p: &Progress, answers: u64) -> Result<Beat, Error> {
        self.db
            .job_heartbeat(id, &self.owner, self.until_ms(), *p, answers, self.now_ms())
            .await
    }

    /// Record the plan's expected call count.
    pub async fn set_planned(&self, id: u64, calls: u32) -> Result<(), Error> {
        self.db.job_set_planned(id, calls).await
    }

    /// Put a job in a final state and release its lease.
    pub async fn finish(&self, id: u64, state: JobState, error: Option<&str>) -> Result<(), Error> {
        self.db.job_finish(id, state, error, self.now_ms()).await?;
        // Finished jobs do not pile up: the retention runs now and then, after one ends.
        self.prune_if_due().await;
        Ok(())
    }

    /// Cancel a job: a queued one at once, a running one by asking its worker (which stops
    /// within a second and writes nothing). Returns the job as it now stands.
    pub async fn cancel(&self, id: u64) -> Result<Option<Job>, Error> {
        self.db.job_cancel(id, self.now_ms()).await?;
        self.get(id).await
    }

    /// Give a running job this worker holds back to the queue (a shutdown that could not wait
    /// for it): the next worker resumes it, reusing the answers already cached.
    pub async fn release(&self, id: u64) -> Result<bool, Error> {
        self.db.job_release(id, &self.owner, self.now_ms()).await
    }

    /// Jobs a worker could take now, oldest first: queued ones, and running ones whose
    /// worker is gone. With `per_tenant`, only each tenant's oldest that many queued jobs
    /// (what a worker's poll can start; it reads no more of a long queue); `None`: all.
    pub async fn runnable(&self, per_tenant: Option<u32>) -> Result<Vec<Job>, Error> {
        let now = self.now_ms();
        let jobs = match per_tenant {
            Some(n) => self.db.jobs_runnable(n).await?,
            None => self.db.jobs_active().await?,
        };
        Ok(jobs
            .into_iter()
            .filter(|j| {
                j.state == JobState::Queued
                    || j.lease_until_ms.is_none_or(|u| u <= now)
                    || j.lease_owner.as_deref().is_some_and(owner_is_dead)
            })
            .collect())
    }

    /// Whether a job of a tenant's `session` is running under a live lease (a trigger then
    /// leaves the work to it).
    pub async fn session_busy(&self, tenant: &dyn AppStore, session: &str) -> Result<bool, Error> {
        let owners = tenant.job_lease_owners(session, self.now_ms()).await?;
        Ok(owners.iter().any(|o| !owner_is_dead(o)))
    }

    /// Run a job this worker has taken: summarize its session with a heartbeat that renews the
    /// lease, records progress and the call's plan, and watches for cancellation. `control`'s
    /// observers see each progress change and plan. The job ends succeeded, failed (with the
    /// error) or cancelled.
    pub async fn run(
        &self,
        engine: &Abridge,
        job: &Job,
        control: CallControl,
    ) -> Result<Outcome, CallError> {
        let control = Arc::new(control);
        let prior = job.answers;
        // The plan the guest reports is the job's label (its planned calls); recorded here,
        // off the call's task, when it changes.
        let mut recorded = None;
        let record_plan = |recorded: &mut Option<u32>| {
            let calls = control.plan().map(|p| p.calls);
            let new = calls.filter(|_| calls != *recorded);
            *recorded = calls;
            new
        };
        // The job brings its session up to its target: everything for a summarize, what the
        // mode folds for a due refresh (its target is the verdict's fold-upto).
        let call =
            engine.catch_up_with(&job.session, &job.config, job.target, Some(control.clone()));
        tokio::pin!(call);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let mut last_beat = Instant::now();
        let beat_every = (self.lease / 3).min(Duration::from_secs(1));
        let mut lost = false;
        let result = loop {
            tokio::select! {
                r = &mut call => break r,
                _ = tick.tick() => {
                    if let Some(calls) = record_plan(&mut recorded) {
                        let _ = self.set_planned(job.id, calls).await;
                    }
                    let p = control.progress();
                    if last_beat.elapsed() >= beat_every {
                        last_beat = Instant::now();
                        match self.heartbeat(job.id, &p, prior + p.answers).await {
                            Ok(Beat::Cancel) => control.cancel(),
                            // Another worker took the job over: stop without writing.
                            Ok(Beat::Lost) => {
                                lost = true;
                                control.cancel();
                            }
                            // A busy database: the lease is renewed at the next beat.
                            Ok(Beat::Go) | Err(_) => {}
                        }
                    }
                }
            }
        };
        let p = control.progress();
        if lost {
            return result;
        }
        if let Some(calls) = record_plan(&mut recorded) {
            let _ = self.set_planned(job.id, calls).await;
        }
        let _ = self.heartbeat(job.id, &p, prior + p.answers).await;
        let (state, error) = match &result {
            Ok(_) => (JobState::Succeeded, None),
            Err(CallError::Cancelled) => (JobState::Cancelled, Some(result_text(&result))),
            Err(_) => (JobState::Failed, Some(result_text(&result))),
        };
        self.finish(job.id, state, error.as_deref())
            .await
            .map_err(CallError::Engine)?;
        result
    }
}

fn result_text(r: &Result<Outcome, CallError>) -> String {
    match r {
        Ok(_) => String::new(),
        Err(e) => format!("{e:#}"),
    }
}

/// The order a worker tries runnable jobs in: fair between tenants. Each tenant's jobs keep
/// their order (oldest first); tenants take turns, one job each per round, and the tenant
/// served longest ago (or never: `served` has no entry) goes first, so one tenant's flood
/// never stands before another tenant's single job for more than the jobs already running.
pub fn fair_order(jobs: Vec<Job>, served: &BTreeMap<Tenant, u64>) -> Vec<Job> {
    let mut groups: Vec<(Tenant, Vec<Job>)> = Vec::new();
    for j in jobs {
        let t = j.tenant.clone();
        match groups.iter_mut().find(|(g, _)| *g == t) {
            Some((_, v)) => v.push(j),
            None => groups.push((t, vec![j])),
        }
    }
    groups.sort_by_key(|(t, v)| (served.get(t).copied().unwrap_or(0), v[0].id));
    let mut out = Vec::new();
    let mut round = 0;
    loop {
        let before = out.len();
        for (_, v) in &groups {
            if let Some(j) = v.get(round) {
                out.push(j.clone());
            }
        }
        if out.len() == before {
            return out;
        }
        round += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::{AppStore, SqliteStore};

    /// The stores every job test runs against: the same rules whatever keeps the rows.
    fn stores() -> Vec<(&'static str, Arc<dyn AppStore>)> {
        vec![("sqlite", Arc::new(SqliteStore::in_memory().unwrap()))]
    }

    fn jobs(db: &Arc<dyn AppStore>, clock: &Arc<ManualClock>, owner: &str, lease_ms: u64) -> Jobs {
        Jobs::new(db.clone(), Duration::from_millis(lease_ms))
            .with_clock(clock.clone())
            .with_owner(owner)
    }

    #[tokio::test]
    async fn tenants_take_turns_and_the_longest_waiting_goes_first() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let clock = Arc::new(ManualClock::at(1_000));
        let j = jobs(&db, &clock, "w", 60_000);
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        let cfg = Config::default();
        for (t, s) in [(&a, "1"), (&a, "2"), (&a, "3"), (&b, "1")] {
            j.enqueue(&*db.for_tenant(t), s, 1, &cfg).await.unwrap();
        }
        let key = |t: &Tenant, s: &str| {
            if t.is_local() {
                s.to_string()
            } else {
                format!("{}\u{1f}{s}", t.name())
            }
        };
        let order = |served: &BTreeMap<Tenant, u64>, jobs: Vec<Job>| -> Vec<String> {
            fair_order(jobs, served)
                .iter()
                .map(|x| key(&x.tenant, &x.session))
                .collect()
        };
        let all = j.runnable(None).await.unwrap();
        // Never served: the oldest first, then turns.
        assert_eq!(
            order(&BTreeMap::new(), all.clone()),
            vec![key(&a, "1"), key(&b, "1"), key(&a, "2"), key(&a, "3")]
        );
        // A was served last: B goes first.
        let served = BTreeMap::from([(a.clone(), 5)]);
        assert_eq!(order(&served, all)[0], key(&b, "1"));
    }

    fn taken(c: Claim) -> Job {
        match c {
            Claim::Taken(j) => j,
            other => panic!("not taken: {other:?}"),
        }
    }

    /// Finished jobs do not pile up: finishing a job applies the retention, at most once per
    /// ten minutes of the clock, and never touches a queued job.
    #[tokio::test]
    async fn finishing_a_job_now_and_then_prunes_the_old_finished_ones() {
        for (name, db) in stores() {
            let clock = Arc::new(ManualClock::at(1_000));
            let j = jobs(&db, &clock, "w", 60_000).with_retention(Duration::from_secs(3600), 1_000);
            let t = db.for_tenant(&Tenant::local());
            let cfg = Config::default();
            let run = |s: &'static str| {
                let (j, t, cfg) = (j.clone(), t.clone(), cfg.clone());
                async move {
                    let (job, _) = j.enqueue(&*t, s, 1, &cfg).await.unwrap();
                    assert!(matches!(j.claim(job.id).await.unwrap(), Claim::Taken(_)));
                    j.finish(job.id, JobState::Succeeded, None).await.unwrap();
                    job.id
                }
            };
            let old = run("a").await;
            let (waiting, _) = j.enqueue(&*t, "q", 1, &cfg).await.unwrap();
            // Two hours on: the first finish after ten minutes prunes what finished an hour
            // before it.
            clock.advance(2 * 3600 * 1000);
            let new = run("b").await;
            assert!(j.get(old).await.unwrap().is_none(), "{name}");
            assert!(j.get(new).await.unwrap().is_some(), "{name}");
            assert!(j.get(waiting.id).await.unwrap().is_some(), "{name}");
            // Within ten minutes, finishing does not prune again.
            clock.advance(2 * 3600 * 1000);
            let third = run("c").await;
            clock.advance(60_000);
            run("d").await;
            assert!(
                j.get(new).await.unwrap().is_none(),
                "{name}: pruned at the third finish"
            );
            assert!(j.get(third).await.unwrap().is_some(), "{name}");
        }
    }

    #[tokio::test]
    async fn a_tenant_lists_only_its_own_jobs() {
        for (name, db) in stores() {
            let clock = Arc::new(ManualClock::at(1_000));
            let j = jobs(&db, &clock, "here:1", 60_000);
            let (a, b, local) = (
                Tenant::new("a").unwrap(),
                Tenant::new("ab").unwrap(),
                Tenant::local(),
            );
            let cfg = Config::default();
            let mut ids = Vec::new();
            let view = |t: &Tenant| db.for_tenant(t);
            for (t, s) in [(&a, "s"), (&b, "s"), (&local, "s"), (&a, "t")] {
                ids.push(j.enqueue(&*view(t), s, 1, &cfg).await.unwrap().0.id);
            }
            let listed = async |t: &Tenant, before| -> Vec<u64> {
                j.list_for(&*view(t), before, 10)
                    .await
                    .unwrap()
                    .iter()
                    .map(|x| x.id)
                    .collect()
            };
            assert_eq!(listed(&a, None).await, vec![ids[3], ids[0]], "{name}");
            assert_eq!(listed(&a, Some(ids[3])).await, vec![ids[0]], "{name}");
            assert_eq!(listed(&b, None).await, vec![ids[1]], "{name}");
            assert_eq!(listed(&local, None).await, vec![ids[2]], "{name}");
            assert_eq!(j.list(2).await.unwrap().len(), 2, "{name}");
            assert_eq!(
                j.counts().await.unwrap(),
                vec![("queued".to_string(), 4)],
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn one_active_job_per_key_and_leases_pass_on_when_a_worker_is_gone() {
        for (name, db) in stores() {
            let clock = Arc::new(ManualClock::at(1_000));
            let a = jobs(&db, &clock, "elsewhere:1", 60_000);
            let here = db.for_tenant(&Tenant::local());
            let cfg = Config {
                model: "m".into(),
                context_length: 1024,
                ..Config::default()
            };
            let (j, new) = a.enqueue(&*here, "s", 10, &cfg).await.unwrap();
            assert!(new, "{name}");
            let (again, new) = a.enqueue(&*here, "s", 10, &cfg).await.unwrap();
            assert!(!new && again.id == j.id, "{name}");
            assert_eq!(
                again.config.context_length, 1024,
                "{name}: config round-trips"
            );
            let j = taken(a.claim(j.id).await.unwrap());
            assert_eq!((j.state, j.attempts), (JobState::Running, 1), "{name}");
            assert_eq!(
                a.active_for(&*here, "s").await.unwrap().map(|x| x.id),
                Some(j.id)
            );

            // A live lease on another host keeps the job, and any other job of the session,
            // busy.
            let b = jobs(&db, &clock, "here:2", 60_000);
            assert!(
                matches!(b.claim(j.id).await.unwrap(), Claim::Busy(_)),
                "{name}"
            );
            let (k, _) = b.enqueue(&*here, "s", 12, &cfg).await.unwrap();
            assert!(
                matches!(b.claim(k.id).await.unwrap(), Claim::Busy(_)),
                "{name}"
            );
            assert!(b.session_busy(&*here, "s").await.unwrap(), "{name}");
            assert!(!b.session_busy(&*here, "t").await.unwrap(), "{name}");

            // A lease that ran out passes to the next worker; the old one learns it lost it.
            let short = jobs(&db, &clock, "elsewhere:1", 1);
            assert_eq!(
                short
                    .heartbeat(j.id, &Progress::default(), 0)
                    .await
                    .unwrap(),
                Beat::Go,
                "{name}"
            );
            clock.advance(5);
            assert_eq!(b.runnable(None).await.unwrap().len(), 2, "{name}");
            assert_eq!(b.runnable(Some(1)).await.unwrap().len(), 2, "{name}");
            assert!(!b.session_busy(&*here, "s").await.unwrap(), "{name}");
            let j = taken(b.claim(j.id).await.unwrap());
            assert_eq!(j.attempts, 2, "{name}");
            assert_eq!(
                a.heartbeat(j.id, &Progress::default(), 0).await.unwrap(),
                Beat::Lost,
                "{name}"
            );

            // A worker process on this host that no longer exists holds no lease.
            let dead = format!("{}:{}", host_name(), u32::MAX - 1);
            assert!(owner_is_dead(&dead) && !owner_is_dead(&owner_name()));
            b.finish(j.id, JobState::Succeeded, None).await.unwrap();
            let d = jobs(&db, &clock, &dead, 60_000);
            taken(d.claim(k.id).await.unwrap());
            assert!(taken(b.claim(k.id).await.unwrap()).attempts == 2, "{name}");

            // A shutdown gives a running job back to the queue; only its holder can.
            assert!(!a.release(k.id).await.unwrap(), "{name}");
            assert!(b.release(k.id).await.unwrap(), "{name}");
            assert_eq!(b.get(k.id).await.unwrap().unwrap().state, JobState::Queued);
            let k = taken(b.claim(k.id).await.unwrap());
            b.set_planned(k.id, 7).await.unwrap();
            assert_eq!(
                b.get(k.id).await.unwrap().unwrap().calls_planned,
                7,
                "{name}"
            );

            // Cancelling: queued at once, running by request.
            let (q, _) = b.enqueue(&*here, "u", 1, &cfg).await.unwrap();
            let q = b.cancel(q.id).await.unwrap().unwrap();
            assert_eq!(q.state, JobState::Cancelled, "{name}");
            let r = b.cancel(k.id).await.unwrap().unwrap();
            assert!(r.state == JobState::Running && r.cancel_requested, "{name}");
            assert_eq!(
                b.heartbeat(k.id, &Progress::default(), 0).await.unwrap(),
                Beat::Cancel,
                "{name}"
            );
            assert!(
                matches!(b.claim(j.id).await.unwrap(), Claim::Finished(_)),
                "{name}"
            );
            // A finished key may be asked for again: a new job.
            assert!(b.enqueue(&*here, "s", 10, &cfg).await.unwrap().1, "{name}");
        }
    }
}
