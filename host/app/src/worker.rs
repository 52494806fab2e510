//! The worker pool: runs queued jobs from the durable job table, at most N at once and at most
//! the tenant's share per tenant, publishing their state, progress and results as events.
//! Jobs a dead process held (its lease ran out, or its pid is gone) are taken over and resume
//! from the cached answers. On shutdown running jobs get a grace period to finish; the rest are
//! released back to the queue for the next start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use super::App;
use crate::jobs::Claim;
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
    // When each tenant last had a job started here (a counter): tenants take turns.
    let mut served: BTreeMap<Tenant, u64> = BTreeMap::new();
    let mut turn = 0u64;
    loop {
        if app.draining() {
            return;
        }
        // Each tenant's next few jobs (a tenant never starts more than its cap here), not
        // the whole queue: a poll's cost does not grow with a flooding tenant's backlog.
        let runnable = match app
            .jobs()
            .runnable(Some(u32::try_from(per_tenant).unwrap_or(u32::MAX)))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %crate::types::describe(&e), "cannot read the job queue");
                Vec::new()
            }
        };
        for job in crate::jobs::fair_order(runnable, &served) {
            let tenant = job.tenant.clone();
            // This process's own count first (no store call when it alone is at the cap);
            // the claim then counts every process's.
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
            // The tenant's cap holds across every instance sharing the store.
            let job = match app
                .jobs()
                .claim_capped(job.id, Some((&tenant, per_tenant)))
                .await
            {
                Ok(Claim::Taken(j)) => j,
                _ => continue,
            };
            turn += 1;
            served.insert(tenant.clone(), turn);
            running
                .lock()
                .expect("running lock")
                .insert(job.id, tenant.clone());
            let (app2, running2, stop2) = (app.clone(), running.clone(), stop.clone());
            let t = tokio::spawn(async move {
                let id = job.id;
                // The outcome is published as events; the job table holds it.
                let _ = app2.tenant(&tenant).execute(job, Some(stop2)).await;
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
