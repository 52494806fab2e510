//! The worker pool: runs queued jobs from the durable job table, at most N at once and at most
//! the tenant's share per tenant, publishing their state, progress and results as events.
//! Jobs a dead process held (its lease ran out, or its pid is gone) are taken over and resume
//! from the cached answers. On shutdown running jobs get a grace period to finish; the rest are
//! released back to the queue for the next start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use super::{App, Scoped};
use crate::control::Progress;
use crate::jobs::{Claim, Job, JobState};
use crate::runtime::CallError;
use crate::tenant::Tenant;

type Running = Arc<Mutex<BTreeMap<u64, Tenant>>>;

/// A running worker pool.
pub struct Workers {
    app: App,
    running: Running,
    stop: watch::Sender<bool>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    scheduler: JoinHandle<()>,
}

impl App {
    /// Start `n` workers.
    pub fn start_workers(&self, n: usize) -> Workers {
        let running: Running = Arc::default();
        let (stop, stop_rx) = watch::channel(false);
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let scheduler = tokio::spawn(schedule(
            self.clone(),
            n.max(1),
            running.clone(),
            stop_rx,
            tasks.clone(),
        ));
        Workers {
            app: self.clone(),
            running,
            stop,
            tasks,
            scheduler,
        }
    }
}

impl Workers {
    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.running.lock().expect("running lock").len()
    }

    /// Stop taking jobs; wait up to `grace` for running ones to end, then release the rest to
    /// the queue (nothing they did is lost: answers received are cached).
    pub async fn shutdown(self, grace: Duration) -> usize {
        self.app.drain();
        let deadline = tokio::time::Instant::now() + grace;
        while self.running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let released = self.running();
        let _ = self.stop.send(true);
        let _ = self.scheduler.await;
        let tasks: Vec<_> = std::mem::take(&mut *self.tasks.lock().expect("tasks lock"));
        for t in tasks {
            let _ = t.await;
        }
        released
    }
}

async fn schedule(
    app: App,
    n: usize,
    running: Running,
    stop: watch::Receiver<bool>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
) {
    let slots = Arc::new(Semaphore::new(n));
    let per_tenant = app.config().limits.jobs_per_tenant.max(1);
    loop {
        if app.draining() {
            return;
        }
        let runnable = match app.jobs().runnable() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %crate::types::describe(&e), "cannot read the job queue");
                Vec::new()
            }
        };
        for job in runnable {
            let tenant = Tenant::of_key(&job.session);
            {
                let r = running.lock().expect("running lock");
                if r.contains_key(&job.id)
                    || r.values().filter(|t| **t == tenant).count() >= per_tenant
                {
                    continue;
                }
            }
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                break;
            };
            let job = match app.jobs().claim(job.id) {
                Ok(Claim::Taken(j)) => j,
                _ => continue,
            };
            running
                .lock()
                .expect("running lock")
                .insert(job.id, tenant.clone());
            let (app2, running2, stop2) = (app.clone(), running.clone(), stop.clone());
            let t = tokio::spawn(async move {
                let id = job.id;
                run_one(app2.tenant(&tenant), job, stop2).await;
                running2.lock().expect("running lock").remove(&id);
                drop(permit);
                app2.inner.wake.notify_one();
            });
            let mut ts = tasks.lock().expect("tasks lock");
            ts.retain(|t| !t.is_finished());
            ts.push(t);
        }
        // Woken by a new job or a finished one; the timer picks up jobs other processes queued
        // and leases that ran out.
        tokio::select! {
            _ = app.inner.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

async fn run_one(scoped: Scoped, job: Job, mut stop: watch::Receiver<bool>) {
    let app = scoped.app.clone();
    let tenant = scoped.tenant.clone();
    let Some(session) = tenant.session_of(&job.session).map(str::to_string) else {
        return;
    };
    let publish = {
        let (app, tenant, session) = (app.clone(), tenant.clone(), session.clone());
        move |kind: &str, data: serde_json::Value| {
            app.events().publish(
                &tenant,
                kind,
                app.now_ms(),
                Some(&session),
                Some(job.id),
                data,
            );
        }
    };
    publish(
        "job.running",
        json!({"state": "running", "attempt": job.attempts, "target": job.target}),
    );
    tracing::info!(job = job.id, tenant = %tenant, session = %session, attempt = job.attempts, "job running");
    let engine = scoped.engine().clone();
    if let Ok(plan) = engine.plan(&session, &job.config).await {
        let _ = app.jobs().set_planned(job.id, plan.calls);
    }
    let mut scoped_job = job.clone();
    scoped_job.session = session.clone();
    let observer: crate::control::Observer = {
        let publish = publish.clone();
        Arc::new(move |p: &Progress| {
            publish(
                "job.progress",
                json!({
                    "stage": if p.level == 0 { "map" } else { "reduce" },
                    "level": p.level, "done": p.done, "total": p.total, "answers": p.answers,
                }),
            );
        })
    };
    let result = tokio::select! {
        r = app.jobs().run(&engine, &scoped_job, Some(observer)) => Some(r),
        _ = stop.wait_for(|s| *s) => None,
    };
    let Some(result) = result else {
        // Shutdown ran out of grace: give the job back; the next start resumes it.
        let _ = app.jobs().release(job.id);
        publish("job.queued", json!({"state": "queued", "released": true}));
        tracing::info!(job = job.id, "job released to the queue at shutdown");
        return;
    };
    match result {
        Ok(outcome) => {
            let rows: Vec<_> = outcome
                .written
                .iter()
                .map(super::SummaryView::from)
                .collect();
            for r in &rows {
                publish("summary.written", json!(r));
            }
            publish(
                "job.succeeded",
                json!({
                    "state": "succeeded",
                    "summary": rows.last().map(|r| r.id),
                    "covered": rows.last().map(|r| r.last_episode),
                    "passes": outcome.passes,
                }),
            );
            tracing::info!(job = job.id, passes = outcome.passes, "job succeeded");
        }
        Err(CallError::Cancelled) => {
            let state = app.jobs().get(job.id).ok().flatten().map(|j| j.state);
            if state == Some(JobState::Cancelled) {
                publish("job.cancelled", json!({"state": "cancelled"}));
            }
        }
        Err(e) => {
            let reason = format!("{e:#}");
            tracing::warn!(job = job.id, error = %reason, "job failed");
            if let Ok(Some(m)) = engine.store().failure(&session).await {
                publish(
                    "failure.recorded",
                    json!({"failures": m.failures, "error": m.last_error}),
                );
            }
            publish("job.failed", json!({"state": "failed", "error": reason}));
        }
    }
}
