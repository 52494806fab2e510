//! Summaries as durable jobs: running or joining one, and `abridge jobs`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, Subcommand};

use abridge::jobs::{Claim, Job, JobState, Jobs};
use abridge::types::{Config, describe};
use abridge::{Abridge, CallError, Progress, SqliteStore};

use super::progress::{JobProgress, Mode, duration_text, utc_text};
use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct JobsArgs {
    #[command(subcommand)]
    cmd: Option<JobsCmd>,
    /// Print JSON (one array)
    #[arg(long)]
    json: bool,
    /// How many of the newest jobs to list
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

#[derive(Subcommand, Debug)]
enum JobsCmd {
    /// Print one job in full.
    Show {
        /// Job id
        id: u64,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Cancel a job: a queued one at once, a running one within a second (it writes nothing;
    /// answers already received stay cached for a later run).
    Cancel {
        /// Job id
        id: u64,
    },
    /// Run every job that is queued or whose worker died (after a crash or kill), oldest first.
    Run {
        /// Print one JSON object per job
        #[arg(long)]
        json: bool,
    },
}

pub fn storage(e: abridge::types::Error) -> Failure {
    Failure::new(Exit::Storage, anyhow!(describe(&e)))
}

pub fn open_jobs(s: &Settings, db: Arc<SqliteStore>) -> Jobs {
    Jobs::new(db, s.job_lease)
}

/// Receives a job's label and its progress.
pub type LabelledObserver = Arc<dyn Fn(&str, &Progress) + Send + Sync>;

/// Where a job's progress goes.
#[derive(Clone)]
pub enum Show {
    /// Its own bar or lines (see [`Mode`]).
    Own(Mode),
    /// To a caller's display (e.g. backfill's overall bar), with the job's label.
    Into(LabelledObserver),
}

/// Bring `session` up to `target` through its job: take the job if no live worker holds it
/// (resuming after a crash), else wait for the worker that does.
pub async fn run_or_join(
    s: &Settings,
    engine: &Abridge,
    jobs: &Jobs,
    (session, target): (&str, u64),
    cfg: &Config,
    show: Show,
) -> Result<Job, Failure> {
    let (job, created) = jobs.enqueue(session, target, cfg).map_err(storage)?;
    if !created {
        super::commands::note(
            s,
            &format!(
                "job {} for session {session} up to episode {target} is already {}; joining it",
                job.id,
                job.state.as_str()
            ),
        );
    }
    let mut waiting = false;
    loop {
        match jobs.claim(job.id).map_err(storage)? {
            Claim::Taken(job) => return run_taken(s, engine, jobs, job, show).await,
            Claim::Busy(other) => {
                if !waiting {
                    waiting = true;
                    super::commands::note(
                        s,
                        &format!(
                            "job {} is being run by {}; waiting for it",
                            other.id,
                            other.lease_owner.as_deref().unwrap_or("another worker")
                        ),
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Claim::Finished(job) => return finished(job),
        }
    }
}

/// A job in a final state as a result.
fn finished(job: Job) -> Result<Job, Failure> {
    match job.state {
        JobState::Succeeded => Ok(job),
        JobState::Cancelled => Err(Failure::new(
            Exit::Model,
            anyhow!(
                "job {} was cancelled; nothing was written by it — rerun to start again (cached partial summaries are reused)",
                job.id
            ),
        )),
        _ => Err(Failure::new(
            Exit::Model,
            anyhow!(
                "job {} failed: {}",
                job.id,
                job.error.as_deref().unwrap_or("no reason recorded")
            ),
        )),
    }
}

/// Run a job this worker holds, with progress.
async fn run_taken(
    s: &Settings,
    engine: &Abridge,
    jobs: &Jobs,
    job: Job,
    show: Show,
) -> Result<Job, Failure> {
    if job.attempts > 1 {
        super::commands::note(
            s,
            &format!(
                "resuming job {} for session {} (attempt {}); cached partial summaries are reused",
                job.id, job.session, job.attempts
            ),
        );
    }
    let plan = engine.plan(&job.session, &job.config).await?;
    jobs.set_planned(job.id, plan.calls).map_err(storage)?;
    let label = format!("job {} (session {})", job.id, job.session);
    let mode = match &show {
        Show::Own(m) => *m,
        Show::Into(_) => Mode::Off,
    };
    let view = Arc::new(JobProgress::new(mode, label.clone(), plan.levels.clone()));
    let watch: abridge::control::Observer = match show {
        Show::Own(_) => {
            let v = view.clone();
            Arc::new(move |p: &Progress| v.update(p))
        }
        Show::Into(f) => Arc::new(move |p: &Progress| f(&label, p)),
    };
    let result = jobs.run(engine, &job, Some(watch)).await;
    view.finish();
    match result {
        Ok(_) => {
            let j = jobs
                .get(job.id)
                .map_err(storage)?
                .ok_or_else(|| Failure::new(Exit::Storage, anyhow!("job {} vanished", job.id)))?;
            if plan.path == abridge::types::PlanPath::MapReduce && mode != Mode::Off {
                eprintln!(
                    "abridge: job {}: {} chunks merged in {} reduce level(s) with {} model answers in {}",
                    j.id,
                    plan.chunks,
                    j.level,
                    j.answers,
                    duration_text(view.elapsed())
                );
            }
            Ok(j)
        }
        Err(CallError::Cancelled) => {
            let now = jobs.get(job.id).map_err(storage)?;
            match now {
                Some(j) if j.state == JobState::Cancelled => finished(j),
                _ => Err(Failure::new(
                    Exit::Model,
                    anyhow!(
                        "job {} was taken over by another worker (this one missed its lease); it continues there",
                        job.id
                    ),
                )),
            }
        }
        Err(e) => {
            let f = Failure::from(e);
            Err(Failure::new(
                f.exit,
                anyhow!(
                    "{:#} — the episodes are stored, earlier summaries are unchanged and answers received are cached; rerun (or 'abridge jobs run') to retry",
                    f.error
                ),
            ))
        }
    }
}

fn row(j: &Job) -> String {
    let progress = match j.state {
        JobState::Running | JobState::Failed | JobState::Cancelled if j.total > 0 => {
            let stage = if j.level == 0 {
                "map".to_string()
            } else {
                format!("reduce {}", j.level)
            };
            format!("{stage} {}/{}", j.done, j.total)
        }
        _ => String::new(),
    };
    let when = j.finished_ms.or(j.started_ms).unwrap_or(j.created_ms);
    let took = match (j.started_ms, j.finished_ms) {
        (Some(a), Some(b)) => duration_text(Duration::from_millis(b.saturating_sub(a))),
        _ => String::new(),
    };
    format!(
        "{:>5}  {:<10} {:<24} {:>8}  {:>3}  {:<16} {:>7}  {}{}",
        j.id,
        j.state.as_str(),
        truncate(&j.session, 24),
        j.target,
        j.attempts,
        progress,
        took,
        utc_text(when),
        j.error
            .as_deref()
            .map(|e| format!("  {}", truncate(e, 60)))
            .unwrap_or_default()
    )
}

/// A job in full, one field per line.
fn show(j: &Job) -> String {
    let t = |ms: Option<u64>| ms.map_or_else(|| "-".to_string(), utc_text);
    let stage = if j.level == 0 {
        "map".to_string()
    } else {
        format!("reduce level {}", j.level)
    };
    let mut out = format!(
        "job {}\n  session:   {}\n  target:    episode {}\n  state:     {}{}\n  model:     {} ({}-token context)\n  progress:  {stage}, {}/{} answers; {} model answers in all, {} calls planned\n  attempts:  {}\n  created:   {}\n  started:   {}\n  updated:   {}\n  finished:  {}\n",
        j.id,
        j.session,
        j.target,
        j.state.as_str(),
        if j.cancel_requested && j.state == JobState::Running {
            " (cancel requested)"
        } else {
            ""
        },
        j.config.model,
        j.config.context_length,
        j.done,
        j.total,
        j.answers,
        j.calls_planned,
        j.attempts,
        utc_text(j.created_ms),
        t(j.started_ms),
        utc_text(j.updated_ms),
        t(j.finished_ms),
    );
    if let Some(owner) = &j.lease_owner {
        out.push_str(&format!(
            "  lease:     {owner} until {}\n",
            t(j.lease_until_ms)
        ));
    }
    if let Some(e) = &j.error {
        out.push_str(&format!("  error:     {e}\n"));
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

pub async fn jobs(s: &Settings, a: JobsArgs) -> Result<(), Failure> {
    let db = Arc::new(SqliteStore::open(&s.db).map_err(storage)?);
    let jobs = open_jobs(s, db.clone());
    match a.cmd {
        None => {
            let list = jobs.list(a.limit).map_err(storage)?;
            if a.json {
                let v: Vec<_> = list.iter().map(Job::to_json).collect();
                println!("{}", serde_json::Value::from(v));
            } else if list.is_empty() {
                println!("no jobs in {}", s.db.display());
            } else {
                println!(
                    "{:>5}  {:<10} {:<24} {:>8}  {:>3}  {:<16} {:>7}  when (UTC)",
                    "id", "state", "session", "target", "try", "progress", "took"
                );
                for j in &list {
                    println!("{}", row(j));
                }
            }
            Ok(())
        }
        Some(JobsCmd::Show { id, json }) => {
            let j = jobs
                .get(id)
                .map_err(storage)?
                .ok_or_else(|| no_job(s, id))?;
            if json {
                println!("{}", j.to_json());
            } else {
                print!("{}", show(&j));
            }
            Ok(())
        }
        Some(JobsCmd::Cancel { id }) => {
            let j = jobs
                .cancel(id)
                .map_err(storage)?
                .ok_or_else(|| no_job(s, id))?;
            match j.state {
                JobState::Cancelled if j.started_ms.is_none() => {
                    println!("job {id} cancelled (it had not started)")
                }
                JobState::Running => println!(
                    "job {id}: cancel requested; its worker ({}) stops within a second and writes nothing",
                    j.lease_owner.as_deref().unwrap_or("unknown")
                ),
                state => {
                    return Err(Failure::new(
                        Exit::Input,
                        anyhow!("job {id} is already {}; nothing to cancel", state.as_str()),
                    ));
                }
            }
            Ok(())
        }
        Some(JobsCmd::Run { json }) => {
            let runnable = jobs.runnable().map_err(storage)?;
            if runnable.is_empty() {
                super::commands::note(s, "no queued or interrupted jobs");
                return Ok(());
            }
            let backend = super::commands::choose_backend(s).await?;
            let engine = super::commands::build(s, db.clone(), backend.llm.clone())?;
            let mode = Mode::detect(json, s.quiet);
            let mut failed = 0;
            for j in runnable {
                let r = match jobs.claim(j.id).map_err(storage)? {
                    Claim::Taken(j) => run_taken(s, &engine, &jobs, j, Show::Own(mode)).await,
                    Claim::Busy(j) => {
                        super::commands::note(s, &format!("job {} is running elsewhere", j.id));
                        continue;
                    }
                    Claim::Finished(j) => finished(j),
                };
                match r {
                    Ok(j) => {
                        if json {
                            println!("{}", j.to_json());
                        } else {
                            println!(
                                "job {}: succeeded (session {}, up to episode {})",
                                j.id, j.session, j.target
                            );
                        }
                    }
                    Err(f) => {
                        failed += 1;
                        eprintln!("abridge: job {}: {:#}", j.id, f.error);
                        if json && let Some(j) = jobs.get(j.id).map_err(storage)? {
                            println!("{}", j.to_json());
                        }
                    }
                }
            }
            if failed > 0 {
                return Err(Failure::new(
                    Exit::Model,
                    anyhow!("{failed} job(s) did not succeed; see 'abridge jobs'"),
                ));
            }
            Ok(())
        }
    }
}

fn no_job(s: &Settings, id: u64) -> Failure {
    Failure::new(
        Exit::Input,
        anyhow!(
            "no job {id} in {} — list them with 'abridge jobs'",
            s.db.display()
        ),
    )
}
