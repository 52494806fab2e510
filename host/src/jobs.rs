//! Durable summarization jobs in the SQLite database: queued → running → succeeded | failed |
//! cancelled, with progress, attempts, the last error, timestamps and a lease.
//!
//! A job brings one session's summaries up to a coverage target (its last episode id). The
//! idempotency key `session@target` admits one active (queued or running) job at a time, so the
//! same work never runs twice at once, whoever asks. A running job holds a lease that its worker
//! renews; when the worker dies (its process is gone, or the lease ran out) another worker takes
//! the job over, and the partial-summary cache makes the new attempt ask the model only for what
//! is missing.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{OptionalExtension, params};
use serde_json::json;

use crate::clock::{Clock, SystemClock};
use crate::control::{CallControl, Observer, Progress};
use crate::runtime::{Abridge, CallError};
use crate::store::SqliteStore;
use crate::tenant::Tenant;
use crate::types::{Config, Error, Outcome};

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// A worker holds its lease.
    Running,
    /// Every episode up to the target is covered.
    Succeeded,
    /// The last attempt failed (see `error`); nothing was written by it.
    Failed,
    /// Cancelled by a user; nothing was written by the cancelled attempt.
    Cancelled,
}

impl JobState {
    /// The name stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> JobState {
        match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "cancelled" => JobState::Cancelled,
            _ => JobState::Failed,
        }
    }

    /// Whether the job may still run (queued or running).
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running)
    }
}

/// One job row.
#[derive(Clone, Debug)]
pub struct Job {
    /// Row id.
    pub id: u64,
    /// The session it summarizes.
    pub session: String,
    /// The last episode id it must cover.
    pub target: u64,
    /// State.
    pub state: JobState,
    /// The engine configuration it runs with (recorded so a resumed job asks the same
    /// questions, which the partial cache answers).
    pub config: Config,
    /// A user asked to cancel it while it ran.
    pub cancel_requested: bool,
    /// Progress: the stage (0 map, 1.. reduce levels), answers in hand, answers needed.
    pub level: u32,
    /// Answers of the stage in hand.
    pub done: u32,
    /// Answers the stage needs.
    pub total: u32,
    /// Model calls the plan expected in all.
    pub calls_planned: u32,
    /// Model answers received over all attempts.
    pub answers: u64,
    /// Attempts started.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: Option<String>,
    /// Who holds the lease (`host:pid`).
    pub lease_owner: Option<String>,
    /// Until when, ms since the epoch.
    pub lease_until_ms: Option<u64>,
    /// Timestamps, ms since the epoch.
    pub created_ms: u64,
    /// When the first attempt started.
    pub started_ms: Option<u64>,
    /// Last change.
    pub updated_ms: u64,
    /// When it reached a final state.
    pub finished_ms: Option<u64>,
}

impl Job {
    /// The job as JSON (for `abridge jobs --json`).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "id": self.id, "session": self.session, "target": self.target,
            "state": self.state.as_str(), "cancel_requested": self.cancel_requested,
            "level": self.level, "done": self.done, "total": self.total,
            "calls_planned": self.calls_planned, "answers": self.answers,
            "attempts": self.attempts, "error": self.error,
            "lease_owner": self.lease_owner, "lease_until_ms": self.lease_until_ms,
            "created_ms": self.created_ms, "started_ms": self.started_ms,
            "updated_ms": self.updated_ms, "finished_ms": self.finished_ms,
            "model": self.config.model, "context_length": self.config.context_length,
        })
    }
}

/// The outcome of trying to take a job.
#[derive(Debug)]
pub enum Claim {
    /// The job is ours to run (attempts counted, lease taken).
    Taken(Job),
    /// Another live worker holds it.
    Busy(Job),
    /// It already reached a final state.
    Finished(Job),
}

/// What a heartbeat learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beat {
    /// Keep going.
    Go,
    /// A user asked to cancel the job.
    Cancel,
    /// Another worker took the job over (this one's lease ran out).
    Lost,
}

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

const COLS: &str = "id, session, target, state, config, cancel_requested, level, done, total, calls_planned, answers, attempts, error, lease_owner, lease_until_ms, created_ms, started_ms, updated_ms, finished_ms";

fn job_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    let opt_u64 = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|x| x as u64))
    };
    Ok(Job {
        id: r.get::<_, i64>(0)? as u64,
        session: r.get(1)?,
        target: r.get::<_, i64>(2)? as u64,
        state: JobState::parse(&r.get::<_, String>(3)?),
        config: crate::types::config_from_json(
            &serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
        ),
        cancel_requested: r.get::<_, i64>(5)? != 0,
        level: r.get(6)?,
        done: r.get(7)?,
        total: r.get(8)?,
        calls_planned: r.get(9)?,
        answers: r.get::<_, i64>(10)? as u64,
        attempts: r.get(11)?,
        error: r.get(12)?,
        lease_owner: r.get(13)?,
        lease_until_ms: opt_u64(14)?,
        created_ms: r.get::<_, i64>(15)? as u64,
        started_ms: opt_u64(16)?,
        updated_ms: r.get::<_, i64>(17)? as u64,
        finished_ms: opt_u64(18)?,
    })
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

/// The job table of a SQLite database.
#[derive(Clone)]
pub struct Jobs {
    db: Arc<SqliteStore>,
    owner: String,
    lease: Duration,
    clock: Arc<dyn Clock>,
}

impl Jobs {
    /// Jobs in `db`, worked by this process, with leases of `lease`.
    pub fn new(db: Arc<SqliteStore>, lease: Duration) -> Self {
        Jobs {
            db,
            owner: owner_name(),
            lease,
            clock: Arc::new(SystemClock),
        }
    }

    /// The same jobs with timestamps and leases read from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The newest jobs of one tenant with `id < before` (all when `None`), newest first, at
    /// most `limit`.
    pub fn list_for(
        &self,
        tenant: &Tenant,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Job>, Error> {
        // Keys of tenant T sort from "T\x1f" up to "T\x20"; local keys hold no U+001F.
        let before = before.map_or(i64::MAX, |b| b as i64);
        let (lo, hi) = (tenant.key(""), format!("{}\u{20}", tenant.name()));
        let rows: Vec<Job> = self.db.with(|c| {
            let sql = |scope: &str| {
                format!(
                    "SELECT {COLS} FROM jobs WHERE id < ?1 AND {scope} ORDER BY id DESC LIMIT ?2"
                )
            };
            let limit = i64::from(limit);
            let rows = if tenant.is_local() {
                let mut st = c
                    .prepare(&sql("instr(session, char(31)) = 0"))
                    .map_err(db_err)?;
                st.query_map(params![before, limit], job_from)
                    .map_err(db_err)?
                    .collect::<Result<_, _>>()
            } else {
                let mut st = c
                    .prepare(&sql("session >= ?3 AND session < ?4"))
                    .map_err(db_err)?;
                st.query_map(params![before, limit, lo, hi], job_from)
                    .map_err(db_err)?
                    .collect::<Result<_, _>>()
            };
            rows.map_err(db_err)
        })?;
        Ok(rows)
    }

    /// Counts of jobs by state (for metrics).
    pub fn counts(&self) -> Result<Vec<(String, u64)>, Error> {
        self.db.with(|c| {
            let mut st = c
                .prepare("SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")
                .map_err(db_err)?;
            st.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })
    }

    /// The active (queued or running) job of a session, if any.
    pub fn active_for(&self, session: &str) -> Result<Option<Job>, Error> {
        self.db.with(|c| {
            c.query_row(
                &format!(
                    "SELECT {COLS} FROM jobs WHERE session = ?1 AND state IN ('queued','running') ORDER BY id DESC LIMIT 1"
                ),
                [session],
                job_from,
            )
            .optional()
            .map_err(db_err)
        })
    }

    /// This worker's lease owner name.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// One job.
    pub fn get(&self, id: u64) -> Result<Option<Job>, Error> {
        self.db.with(|c| {
            c.query_row(
                &format!("SELECT {COLS} FROM jobs WHERE id = ?1"),
                [id as i64],
                job_from,
            )
            .optional()
            .map_err(db_err)
        })
    }

    /// The newest `limit` jobs, newest first.
    pub fn list(&self, limit: u32) -> Result<Vec<Job>, Error> {
        self.db.with(|c| {
            let mut st = c
                .prepare(&format!(
                    "SELECT {COLS} FROM jobs ORDER BY id DESC LIMIT ?1"
                ))
                .map_err(db_err)?;
            st.query_map([i64::from(limit)], job_from)
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)
        })
    }

    /// The job for (`session`, `target`): the active one if there is one, else a new queued
    /// job. Returns the job and whether it was created.
    pub fn enqueue(&self, session: &str, target: u64, cfg: &Config) -> Result<(Job, bool), Error> {
        let key = format!("{session}@{target}");
        let now = self.now_ms() as i64;
        self.db.with(|c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let active = tx
                .query_row(
                    &format!(
                        "SELECT {COLS} FROM jobs WHERE key = ?1 AND state IN ('queued','running')"
                    ),
                    [&key],
                    job_from,
                )
                .optional()
                .map_err(db_err)?;
            if let Some(job) = active {
                return Ok((job, false));
            }
            tx.execute(
                "INSERT INTO jobs (session, target, key, state, config, created_ms, updated_ms) VALUES (?1, ?2, ?3, 'queued', ?4, ?5, ?5)",
                params![session, target as i64, key, crate::types::config_to_json(cfg).to_string(), now],
            )
            .map_err(db_err)?;
            let id = tx.last_insert_rowid();
            let job = tx
                .query_row(&format!("SELECT {COLS} FROM jobs WHERE id = ?1"), [id], job_from)
                .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok((job, true))
        })
    }

    /// Take job `id` if it is queued, or running under a lease that expired or whose owner is
    /// gone. Another job of the same session running under a live lease makes it busy too.
    pub fn claim(&self, id: u64) -> Result<Claim, Error> {
        let now = self.now_ms();
        let until = now + self.lease.as_millis() as u64;
        self.db.with(|c| {
            let tx = c
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let job = tx
                .query_row(&format!("SELECT {COLS} FROM jobs WHERE id = ?1"), [id as i64], job_from)
                .map_err(db_err)?;
            if !job.state.is_active() {
                return Ok(Claim::Finished(job));
            }
            let live = |j: &Job| {
                j.state == JobState::Running
                    && j.lease_owner.as_deref() != Some(self.owner.as_str())
                    && j.lease_until_ms.is_some_and(|u| u > now)
                    && !j.lease_owner.as_deref().is_some_and(owner_is_dead)
            };
            if live(&job) {
                return Ok(Claim::Busy(job));
            }
            let mut st = tx
                .prepare(&format!(
                    "SELECT {COLS} FROM jobs WHERE session = ?1 AND id != ?2 AND state = 'running'"
                ))
                .map_err(db_err)?;
            let others: Vec<Job> = st
                .query_map(params![job.session, id as i64], job_from)
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)?;
            drop(st);
            if others.iter().any(live) {
                return Ok(Claim::Busy(job));
            }
            tx.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = ?2, lease_until_ms = ?3, started_ms = COALESCE(started_ms, ?4), updated_ms = ?4, error = NULL WHERE id = ?1",
                params![id as i64, self.owner, until as i64, now as i64],
            )
            .map_err(db_err)?;
            let job = tx
                .query_row(&format!("SELECT {COLS} FROM jobs WHERE id = ?1"), [id as i64], job_from)
                .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(Claim::Taken(job))
        })
    }

    /// Renew the lease and record progress.
    pub fn heartbeat(&self, id: u64, p: &Progress, answers: u64) -> Result<Beat, Error> {
        let now = self.now_ms();
        let until = now + self.lease.as_millis() as u64;
        self.db.with(|c| {
            let n = c
                .execute(
                    "UPDATE jobs SET lease_until_ms = ?3, level = ?4, done = ?5, total = ?6, answers = ?7, updated_ms = ?8 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
                    params![id as i64, self.owner, until as i64, p.level, p.done, p.total, answers as i64, now as i64],
                )
                .map_err(db_err)?;
            if n == 0 {
                return Ok(Beat::Lost);
            }
            let cancel = c
                .query_row(
                    "SELECT cancel_requested FROM jobs WHERE id = ?1",
                    [id as i64],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(db_err)?;
            Ok(if cancel != 0 { Beat::Cancel } else { Beat::Go })
        })
    }

    /// Record the plan's expected call count.
    pub fn set_planned(&self, id: u64, calls: u32) -> Result<(), Error> {
        self.db.with(|c| {
            c.execute(
                "UPDATE jobs SET calls_planned = ?2 WHERE id = ?1",
                params![id as i64, calls],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    /// Put a job in a final state and release its lease.
    pub fn finish(&self, id: u64, state: JobState, error: Option<&str>) -> Result<(), Error> {
        let now = self.now_ms() as i64;
        self.db.with(|c| {
            c.execute(
                "UPDATE jobs SET state = ?2, error = ?3, lease_owner = NULL, lease_until_ms = NULL, updated_ms = ?4, finished_ms = ?4 WHERE id = ?1",
                params![id as i64, state.as_str(), error, now],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    /// Cancel a job: a queued one at once, a running one by asking its worker (which stops
    /// within a second and writes nothing). Returns the job as it now stands.
    pub fn cancel(&self, id: u64) -> Result<Option<Job>, Error> {
        let now = self.now_ms() as i64;
        self.db.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'cancelled', error = 'cancelled before it ran', updated_ms = ?2, finished_ms = ?2 WHERE id = ?1 AND state = 'queued'",
                params![id as i64, now],
            )
            .map_err(db_err)?;
            c.execute(
                "UPDATE jobs SET cancel_requested = 1, updated_ms = ?2 WHERE id = ?1 AND state = 'running'",
                params![id as i64, now],
            )
            .map_err(db_err)?;
            Ok(())
        })?;
        self.get(id)
    }

    /// Give a running job this worker holds back to the queue (a shutdown that could not wait
    /// for it): the next worker resumes it, reusing the answers already cached.
    pub fn release(&self, id: u64) -> Result<bool, Error> {
        let now = self.now_ms() as i64;
        self.db.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_until_ms = NULL, updated_ms = ?3 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
                params![id as i64, self.owner, now],
            )
            .map(|n| n > 0)
            .map_err(db_err)
        })
    }

    /// Jobs a worker could take now: queued ones, and running ones whose worker is gone.
    pub fn runnable(&self) -> Result<Vec<Job>, Error> {
        let now = self.now_ms();
        let jobs: Vec<Job> = self.db.with(|c| {
            let mut st = c
                .prepare(&format!(
                    "SELECT {COLS} FROM jobs WHERE state IN ('queued','running') ORDER BY id"
                ))
                .map_err(db_err)?;
            st.query_map([], job_from)
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)
        })?;
        Ok(jobs
            .into_iter()
            .filter(|j| {
                j.state == JobState::Queued
                    || j.lease_until_ms.is_none_or(|u| u <= now)
                    || j.lease_owner.as_deref().is_some_and(owner_is_dead)
            })
            .collect())
    }

    /// Whether a job of `session` is running under a live lease (a trigger then leaves the
    /// work to it).
    pub fn session_busy(&self, session: &str) -> Result<bool, Error> {
        let now = self.now_ms() as i64;
        self.db.with(|c| {
            let owners: Vec<String> = {
                let mut st = c
                    .prepare(
                        "SELECT lease_owner FROM jobs WHERE session = ?1 AND state = 'running' AND lease_until_ms > ?2",
                    )
                    .map_err(db_err)?;
                st.query_map(params![session, now], |r| r.get::<_, String>(0))
                    .map_err(db_err)?
                    .collect::<Result<_, _>>()
                    .map_err(db_err)?
            };
            Ok(owners.iter().any(|o| !owner_is_dead(o)))
        })
    }

    /// Run a job this worker has taken: summarize its session with a heartbeat that renews the
    /// lease, records progress and watches for cancellation. `watch` sees each progress
    /// change. The job ends succeeded, failed (with the error) or cancelled.
    pub async fn run(
        &self,
        engine: &Abridge,
        job: &Job,
        watch: Option<Observer>,
    ) -> Result<Outcome, CallError> {
        let control = Arc::new(match watch {
            Some(w) => CallControl::observed(w),
            None => CallControl::new(),
        });
        let prior = job.answers;
        let call = engine.summarize_now_with(&job.session, &job.config, Some(control.clone()));
        tokio::pin!(call);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let mut last_beat = Instant::now();
        let beat_every = (self.lease / 3).min(Duration::from_secs(1));
        let mut lost = false;
        let result = loop {
            tokio::select! {
                r = &mut call => break r,
                _ = tick.tick() => {
                    let p = control.progress();
                    if last_beat.elapsed() >= beat_every {
                        last_beat = Instant::now();
                        match self.heartbeat(job.id, &p, prior + p.answers) {
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
        let _ = self.heartbeat(job.id, &p, prior + p.answers);
        let (state, error) = match &result {
            Ok(_) => (JobState::Succeeded, None),
            Err(CallError::Cancelled) => (JobState::Cancelled, Some(result_text(&result))),
            Err(_) => (JobState::Failed, Some(result_text(&result))),
        };
        self.finish(job.id, state, error.as_deref())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(db: &Arc<SqliteStore>, owner: &str, lease_ms: u64) -> Jobs {
        Jobs {
            db: db.clone(),
            owner: owner.into(),
            lease: Duration::from_millis(lease_ms),
            clock: Arc::new(SystemClock),
        }
    }

    fn taken(c: Claim) -> Job {
        match c {
            Claim::Taken(j) => j,
            other => panic!("not taken: {other:?}"),
        }
    }

    #[test]
    fn a_tenant_lists_only_its_own_jobs() {
        let db = Arc::new(SqliteStore::in_memory().unwrap());
        let j = jobs(&db, "here:1", 60_000);
        let (a, b, local) = (
            Tenant::new("a").unwrap(),
            Tenant::new("ab").unwrap(),
            Tenant::local(),
        );
        let cfg = Config::default();
        let ids: Vec<u64> = [a.key("s"), b.key("s"), local.key("s"), a.key("t")]
            .iter()
            .map(|k| j.enqueue(k, 1, &cfg).unwrap().0.id)
            .collect();
        let listed = |t: &Tenant, before| -> Vec<u64> {
            j.list_for(t, before, 10)
                .unwrap()
                .iter()
                .map(|x| x.id)
                .collect()
        };
        assert_eq!(listed(&a, None), vec![ids[3], ids[0]]);
        assert_eq!(listed(&a, Some(ids[3])), vec![ids[0]]);
        assert_eq!(listed(&b, None), vec![ids[1]]);
        assert_eq!(listed(&local, None), vec![ids[2]]);
    }

    #[test]
    fn one_active_job_per_key_and_leases_pass_on_when_a_worker_is_gone() {
        let db = Arc::new(SqliteStore::in_memory().unwrap());
        let a = jobs(&db, "elsewhere:1", 60_000);
        let cfg = Config {
            model: "m".into(),
            context_length: 1024,
            ..Config::default()
        };
        let (j, new) = a.enqueue("s", 10, &cfg).unwrap();
        assert!(new);
        let (again, new) = a.enqueue("s", 10, &cfg).unwrap();
        assert!(!new && again.id == j.id);
        assert_eq!(again.config.context_length, 1024, "config round-trips");
        let j = taken(a.claim(j.id).unwrap());
        assert_eq!((j.state, j.attempts), (JobState::Running, 1));

        // A live lease on another host keeps the job, and any other job of the session, busy.
        let b = jobs(&db, "here:2", 60_000);
        assert!(matches!(b.claim(j.id).unwrap(), Claim::Busy(_)));
        let (k, _) = b.enqueue("s", 12, &cfg).unwrap();
        assert!(matches!(b.claim(k.id).unwrap(), Claim::Busy(_)));
        assert!(b.session_busy("s").unwrap() && !b.session_busy("t").unwrap());

        // A lease that ran out passes to the next worker; the old one learns it lost it.
        let short = jobs(&db, "elsewhere:1", 1);
        assert_eq!(
            short.heartbeat(j.id, &Progress::default(), 0).unwrap(),
            Beat::Go
        );
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(b.runnable().unwrap().len(), 2);
        let j = taken(b.claim(j.id).unwrap());
        assert_eq!(j.attempts, 2);
        assert_eq!(
            a.heartbeat(j.id, &Progress::default(), 0).unwrap(),
            Beat::Lost
        );

        // A worker process on this host that no longer exists holds no lease.
        let dead = format!("{}:{}", host_name(), u32::MAX - 1);
        assert!(owner_is_dead(&dead) && !owner_is_dead(&owner_name()));
        b.finish(j.id, JobState::Succeeded, None).unwrap();
        let d = jobs(&db, &dead, 60_000);
        taken(d.claim(k.id).unwrap());
        assert!(taken(b.claim(k.id).unwrap()).attempts == 2);

        // Cancelling: queued at once, running by request.
        let (q, _) = b.enqueue("u", 1, &cfg).unwrap();
        assert_eq!(b.cancel(q.id).unwrap().unwrap().state, JobState::Cancelled);
        let r = b.cancel(k.id).unwrap().unwrap();
        assert!(r.state == JobState::Running && r.cancel_requested);
        assert_eq!(
            b.heartbeat(k.id, &Progress::default(), 0).unwrap(),
            Beat::Cancel
        );
        assert!(matches!(b.claim(j.id).unwrap(), Claim::Finished(_)));
        // A finished key may be asked for again: a new job.
        assert!(b.enqueue("s", 10, &cfg).unwrap().1);
    }
}
