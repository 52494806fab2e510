//! Summaries as durable jobs: running or joining one, and `abridge jobs`.

use anyhow::anyhow;
use clap::{Args, Subcommand};

use std::time::Duration;

use abridge_app::{ErrorKind, JobView};

use super::app::{Show, shown};
use super::progress::{Mode, duration_text, utc_text};
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

fn row(j: &JobView, id_width: usize) -> String {
    let p = &j.progress;
    let progress = match j.state.as_str() {
        "running" | "failed" | "cancelled" if p.total > 0 => {
            let stage = if p.level == 0 {
                "map".to_string()
            } else {
                format!("reduce {}", p.level)
            };
            format!("{stage} {}/{}", p.done, p.total)
        }
        _ => String::new(),
    };
    let when = j.finished_ms.or(j.started_ms).unwrap_or(j.created_ms);
    let took = match (j.started_ms, j.finished_ms) {
        (Some(a), Some(b)) => duration_text(Duration::from_millis(b.saturating_sub(a))),
        _ => String::new(),
    };
    format!(
        "{:>id_width$}  {:<10} {:<24} {:>8}  {:>3}  {:<16} {:>7}  {}{}",
        j.id,
        j.state,
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
fn show(j: &JobView) -> String {
    let t = |ms: Option<u64>| ms.map_or_else(|| "-".to_string(), utc_text);
    let p = &j.progress;
    let stage = if p.level == 0 {
        "map".to_string()
    } else {
        format!("reduce level {}", p.level)
    };
    let mut out = format!(
        "job {}\n  session:   {}\n  target:    episode {}\n  state:     {}{}\n  model:     {}\n  progress:  {stage}, {}/{} answers; {} model answers in all, {} calls planned\n  attempts:  {}\n  created:   {}\n  started:   {}\n  updated:   {}\n  finished:  {}\n",
        j.id,
        j.session,
        j.target,
        j.state,
        if j.cancel_requested {
            " (cancel requested)"
        } else {
            ""
        },
        if j.model == "extractive" {
            "none (extractive: sentence selection)".to_string()
        } else {
            format!("{} ({}-token context)", j.model, j.context_length)
        },
        p.done,
        p.total,
        j.answers,
        j.calls_planned,
        j.attempts,
        utc_text(j.created_ms),
        t(j.started_ms),
        utc_text(j.updated_ms),
        t(j.finished_ms),
    );
    if let Some(l) = &j.lease {
        out.push_str(&format!(
            "  lease:     {} until {}\n",
            l.worker,
            t(l.until_ms)
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
    let local = super::app::local(s, None)?;
    let json_of = |j: &JobView| serde_json::to_value(j).expect("a job serializes");
    match a.cmd {
        None => {
            let list = local.list_jobs(None, a.limit).await?;
            if a.json {
                let v: Vec<_> = list.iter().map(json_of).collect();
                println!("{}", serde_json::Value::from(v));
            } else if list.is_empty() {
                println!("no jobs in {}", abridge_app::db::shown(&s.db));
            } else {
                // The id column as wide as the widest id.
                let w = list
                    .iter()
                    .map(|j| j.id.to_string().len())
                    .max()
                    .unwrap_or(2)
                    .max(2);
                println!(
                    "{:>w$}  {:<10} {:<24} {:>8}  {:>3}  {:<16} {:>7}  when (UTC)",
                    "id", "state", "session", "target", "try", "progress", "took"
                );
                for j in &list {
                    println!("{}", row(j, w));
                }
            }
            Ok(())
        }
        Some(JobsCmd::Show { id, json }) => {
            let j = local.job(id).await.map_err(|e| known(s, id, e))?;
            if json {
                println!("{}", json_of(&j));
            } else {
                print!("{}", show(&j));
            }
            Ok(())
        }
        Some(JobsCmd::Cancel { id }) => {
            let j = local.cancel_job(id).await.map_err(|e| match e.kind {
                // Nothing to cancel is the caller's mistake, not the database's.
                ErrorKind::Conflict => {
                    Failure::new(Exit::Input, anyhow!("{}; nothing to cancel", e.message))
                }
                _ => known(s, id, e),
            })?;
            match j.state.as_str() {
                "cancelled" => println!("job {id} cancelled (it had not started)"),
                _ => println!(
                    "job {id}: cancel requested; its worker ({}) stops within a second and writes nothing",
                    j.lease.as_ref().map_or("unknown", |l| l.worker.as_str())
                ),
            }
            Ok(())
        }
        Some(JobsCmd::Run { json }) => {
            // Every runnable job (an explicit run of the queue).
            let runnable = local.runnable_jobs().await?;
            if runnable.is_empty() {
                super::commands::note(s, "no queued or interrupted jobs");
                return Ok(());
            }
            let backend = super::commands::choose_backend(s).await?;
            let local = super::app::local(s, Some(&backend))?;
            let mode = Mode::detect(json, s.quiet);
            let mut failed = 0;
            for j in runnable {
                let run = local.run_job(j.id);
                match shown(s, &local, Some(&j.session), Show::Own(mode), run).await {
                    Ok(None) => {
                        super::commands::note(s, &format!("job {} is running elsewhere", j.id));
                    }
                    Ok(Some(j)) => {
                        if json {
                            println!("{}", json_of(&j));
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
                        if json && let Ok(j) = local.job(j.id).await {
                            println!("{}", json_of(&j));
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

/// An app error about job `id`, a missing job said with the database and how to list them.
fn known(s: &Settings, id: u64, e: abridge_app::AppError) -> Failure {
    if e.kind != ErrorKind::NotFound {
        return e.into();
    }
    Failure::new(
        Exit::Input,
        anyhow!(
            "no job {id} in {} — list them with 'abridge jobs'",
            abridge_app::db::shown(&s.db)
        ),
    )
}
