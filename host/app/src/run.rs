//! Running one job in this process, the one way both front ends use: the worker pool runs the
//! jobs it claims through [`Scoped::execute`], and a command-line run brings a session up to
//! date through [`Scoped::run_or_join`]. Everything that happens is published as events, so
//! the server's event streams and the CLI's progress display are two subscribers.

use crate::JobView;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{AppError, AppResult, ErrorKind, Scoped, SessionConfig, SummaryView, What};
use crate::control::{CallControl, Progress};
use crate::jobs::{Claim, Job, JobState};
use crate::runtime::CallError;
use crate::types::PlanReport;

/// How a job that this process ran or waited for ended, when it did not succeed.
fn unsuccessful(job: &Job) -> AppError {
    match job.state {
        JobState::Cancelled => AppError::new(
            ErrorKind::Model,
            format!(
                "job {} was cancelled; nothing was written by it — rerun to start again (cached partial summaries are reused)",
                job.id
            ),
        ),
        _ => AppError::new(
            ErrorKind::Model,
            format!(
                "job {} failed: {}",
                job.id,
                job.error.as_deref().unwrap_or("no reason recorded")
            ),
        ),
    }
}

impl Scoped {
    /// Bring `session` up to episode `target` through its job, here: take the job when no
    /// live worker holds it (one a dead process held resumes from its cached answers), else
    /// wait for the worker that does. Events tell what happens (`job.joined` when the job
    /// already existed, `job.waiting` while another worker holds it, then `job.running` with
    /// the plan, `job.progress`, `summary.written` and the end); subscribe first to see them.
    /// A job that does not succeed is an error that says why.
    pub async fn run_or_join(
        &self,
        session: &str,
        target: u64,
        cfg: &SessionConfig,
    ) -> AppResult<Job> {
        self.run_or_join_until(session, target, cfg, None)
            .await
            .map(|j| j.expect("without a stop signal a run always ends"))
    }

    /// [`Scoped::run_or_join`] that stops when `stop` turns true: a job running here goes
    /// back to the queue (answers received stay cached), a wait for another worker ends, and
    /// the answer is `Ok(None)`.
    pub async fn run_or_join_until(
        &self,
        session: &str,
        target: u64,
        cfg: &SessionConfig,
        stop: Option<watch::Receiver<bool>>,
    ) -> AppResult<Option<Job>> {
        let jobs = &self.app.inner.jobs;
        let (job, created) = jobs.enqueue(&*self.tables, session, target, cfg).await?;
        if created {
            self.publish(What::queued(target), Some(session), Some(job.id));
        } else {
            self.publish(
                What::JobJoined {
                    state: job.state.as_str().to_string(),
                    target: job.target,
                },
                Some(session),
                Some(job.id),
            );
        }
        let stopped = |s: &Option<watch::Receiver<bool>>| s.as_ref().is_some_and(|s| *s.borrow());
        let mut waiting = false;
        loop {
            if stopped(&stop) {
                return Ok(None);
            }
            match jobs.claim(job.id).await? {
                Claim::Taken(job) => {
                    return match self.execute(job, stop).await {
                        Some(r) => r.map(Some),
                        None => Ok(None),
                    };
                }
                Claim::Busy(other) => {
                    if !waiting {
                        waiting = true;
                        self.publish(
                            What::JobWaiting {
                                state: "running".into(),
                                owner: other.lease_owner.clone(),
                            },
                            Some(session),
                            Some(other.id),
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Claim::Finished(job) if job.state == JobState::Succeeded => return Ok(Some(job)),
                Claim::Finished(job) => return Err(unsuccessful(&job)),
            }
        }
    }

    /// Run job `id` here unless a live worker holds it (`Ok(None)` then); a job that already
    /// ended is returned as it stands, or as the error that ended it.
    pub async fn run_job(&self, id: u64) -> AppResult<Option<JobView>> {
        self.job(id).await?;
        match self.app.inner.jobs.claim(id).await? {
            Claim::Taken(job) => self
                .execute(job, None)
                .await
                .expect("without a stop signal a run always ends")
                .map(|j| Some(self.job_view(&j))),
            Claim::Busy(_) => Ok(None),
            Claim::Finished(job) if job.state == JobState::Succeeded => {
                Ok(Some(self.job_view(&job)))
            }
            Claim::Finished(job) => Err(unsuccessful(&job)),
        }
    }

    /// Run a job this process has claimed, publishing its state, progress and result; the
    /// job as stored at the end, or why it did not succeed. `None` when `stop` turned true
    /// first: the job was released to the queue (answers received stay cached).
    pub(crate) async fn execute(
        &self,
        job: Job,
        stop: Option<watch::Receiver<bool>>,
    ) -> Option<AppResult<Job>> {
        let app = &self.app;
        if job.tenant != self.tenant {
            return Some(Err(AppError::not_found(format!("no job {}", job.id))));
        }
        let session = job.session.clone();
        let publish = {
            let (me, session) = (self.clone(), session.clone());
            move |what: What| me.publish(what, Some(&session), Some(job.id))
        };
        let engine = self.engine().clone();
        // `job.running` carries the plan the guest reports before its first model call (the
        // call plans once); a call that ends before planning still says it ran.
        let running = {
            let (publish, job) = (publish.clone(), job.clone());
            let worker = app.jobs().owner().to_string();
            let said = Arc::new(std::sync::atomic::AtomicBool::new(false));
            move |plan: Option<&PlanReport>| {
                if said.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                publish(What::JobRunning {
                    state: "running".into(),
                    attempt: job.attempts,
                    target: job.target,
                    resumed: job.attempts > 1,
                    worker: worker.clone(),
                    levels: plan.map(|p| p.levels.clone()),
                    chunks: plan.map(|p| p.chunks),
                    map_reduce: plan.map(|p| p.path == crate::types::PlanPath::MapReduce),
                });
            }
        };
        tracing::info!(job = job.id, tenant = %self.tenant, session = %session, attempt = job.attempts, "job running");
        let observer: crate::control::Observer = {
            let publish = publish.clone();
            Arc::new(move |p: &Progress| {
                publish(What::JobProgress {
                    stage: if p.level == 0 { "map" } else { "reduce" }.into(),
                    level: p.level,
                    done: p.done,
                    total: p.total,
                    answers: p.answers,
                });
            })
        };
        let control = CallControl::observed(observer).on_plan({
            let running = running.clone();
            Arc::new(move |p: &PlanReport| running(Some(p)))
        });
        let run = app.jobs().run(&engine, &job, control);
        let result = match stop {
            Some(mut stop) => tokio::select! {
                r = run => Some(r),
                _ = stop.wait_for(|s| *s) => None,
            },
            None => Some(run.await),
        };
        running(None);
        let Some(result) = result else {
            // Shutdown ran out of grace: give the job back; the next start resumes it.
            let _ = app.jobs().release(job.id).await;
            publish(What::JobQueued {
                state: "queued".into(),
                target: None,
                released: Some(true),
            });
            tracing::info!(job = job.id, "job released to the queue at shutdown");
            return None;
        };
        Some(match result {
            Ok(outcome) => {
                let rows: Vec<_> = outcome.written.iter().map(SummaryView::from).collect();
                for r in &rows {
                    publish(What::SummaryWritten(r.clone()));
                }
                let stored = app.jobs().get(job.id).await.ok().flatten();
                publish(What::JobSucceeded {
                    state: "succeeded".into(),
                    summary: rows.last().map(|r| r.id),
                    covered: rows.last().map(|r| r.last_episode),
                    passes: outcome.passes,
                    level: stored.as_ref().map(|j| j.level),
                    answers: stored.as_ref().map(|j| j.answers),
                });
                tracing::info!(job = job.id, passes = outcome.passes, "job succeeded");
                stored.ok_or_else(|| AppError::storage(format!("job {} vanished", job.id)))
            }
            Err(CallError::Cancelled) => match app.jobs().get(job.id).await.ok().flatten() {
                Some(j) if j.state == JobState::Cancelled => {
                    publish(What::cancelled());
                    Err(unsuccessful(&j))
                }
                _ => Err(AppError::new(
                    ErrorKind::Model,
                    format!(
                        "job {} was taken over by another worker (this one missed its lease); it continues there",
                        job.id
                    ),
                )),
            },
            Err(e) => {
                let reason = format!("{e:#}");
                tracing::warn!(job = job.id, error = %reason, "job failed");
                if let Ok(Some(m)) = engine.store().failure(&session).await {
                    publish(What::FailureRecorded {
                        failures: m.failures,
                        error: m.last_error,
                    });
                }
                publish(What::JobFailed {
                    state: "failed".into(),
                    error: reason.clone(),
                });
                Err(AppError::from(e).hint(
                    "the episodes are stored, earlier summaries are unchanged and answers received are cached; run the job again to retry",
                ))
            }
        })
    }
}
