//! Per-tenant guards: a request-rate bucket, and model requests in flight bounded per tenant
//! and overall, so one tenant cannot starve the others. Also the model figures `/metrics`
//! reports.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::backend::LlmBackend;
use crate::types::{Error, Request, Response};

/// Limits (0 means unlimited where noted).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests per second per tenant, with a burst of twice that (0: unlimited).
    pub requests_per_sec: u32,
    /// Jobs one tenant may have running at once.
    pub jobs_per_tenant: usize,
    /// Most messages one request may post (0: unlimited).
    pub messages_per_request: u64,
    /// Most messages one uploaded transcript may hold (0: unlimited).
    pub episodes_per_upload: u64,
    /// Most conversations one uploaded transcript may hold (0: unlimited).
    pub conversations_per_upload: usize,
    /// Jobs one tenant may have queued; past it, work that would queue another is refused
    /// with a retry time (0: unlimited).
    pub queued_per_tenant: usize,
    /// Model requests one tenant may have in flight.
    pub model_per_tenant: usize,
    /// Model requests in flight overall.
    pub model_total: usize,
    /// Cluster summaries one tenant may have running at once.
    pub cluster_jobs_per_tenant: usize,
    /// The periodic sweeper leaves a tenant alone this long after sweeping it (ms).
    pub sweep_cooldown_ms: u64,
    /// Monthly model budget per tenant for cluster summaries (`None`: none).
    pub ceiling: Option<Ceiling>,
    /// How long finished jobs (and their events) are kept.
    pub job_retention: Duration,
    /// How many finished jobs each tenant keeps at most (its newest).
    pub job_retention_count: u32,
}

/// The finished-job retention every process applies unless told otherwise: a week, and each
/// tenant's newest 1,000.
pub const JOB_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// See [`JOB_RETENTION`].
pub const JOB_RETENTION_COUNT: u32 = 1_000;

/// A monthly budget per tenant, in tokens, money, or both (whichever is reached first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceiling {
    /// Most prompt plus output tokens per month.
    pub tokens: Option<u64>,
    /// Most money per month, in the currency of the prices.
    pub cost: Option<f64>,
    /// Price of a million prompt tokens.
    pub price_input: f64,
    /// Price of a million output tokens.
    pub price_output: f64,
}

impl Ceiling {
    /// What `prompt` and `output` tokens cost.
    pub fn cost_of(&self, prompt: u64, output: u64) -> f64 {
        (prompt as f64 * self.price_input + output as f64 * self.price_output) / 1_000_000.0
    }

    /// Whether a month's usage has reached the ceiling: `(spent, limit, unit)` when it has.
    pub fn exhausted(&self, prompt: u64, output: u64) -> Option<(f64, f64, &'static str)> {
        if let Some(t) = self.tokens
            && prompt + output >= t
        {
            return Some(((prompt + output) as f64, t as f64, "tokens"));
        }
        if let Some(c) = self.cost {
            let spent = self.cost_of(prompt, output);
            if spent >= c {
                return Some((spent, c, "money"));
            }
        }
        None
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests_per_sec: 0,
            jobs_per_tenant: 2,
            queued_per_tenant: 100,
            messages_per_request: 10_000,
            episodes_per_upload: 100_000,
            conversations_per_upload: 1_000,
            model_per_tenant: 4,
            model_total: 8,
            cluster_jobs_per_tenant: 3,
            // The server's default sweep interval: a tenant is swept at most that often.
            sweep_cooldown_ms: 120_000,
            ceiling: None,
            job_retention: JOB_RETENTION,
            job_retention_count: JOB_RETENTION_COUNT,
        }
    }
}

impl Limits {
    /// No limits: one user's process (the command line), where the model's own concurrency
    /// settings are the only bound.
    pub fn unlimited() -> Self {
        Limits {
            requests_per_sec: 0,
            jobs_per_tenant: usize::MAX,
            queued_per_tenant: 0,
            messages_per_request: 0,
            episodes_per_upload: 0,
            conversations_per_upload: 0,
            model_per_tenant: Semaphore::MAX_PERMITS,
            model_total: Semaphore::MAX_PERMITS,
            cluster_jobs_per_tenant: Semaphore::MAX_PERMITS,
            sweep_cooldown_ms: 0,
            ceiling: None,
            // Not a limit on work: one user's database still forgets old jobs.
            job_retention: JOB_RETENTION,
            job_retention_count: JOB_RETENTION_COUNT,
        }
    }
}

/// A token bucket (refilled from a monotonic clock: it measures rates, not wall time).
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// `rate` per second, holding up to `2 × rate`.
    pub fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Bucket {
            rate,
            burst: rate * 2.0,
            tokens: rate * 2.0,
            at: Instant::now(),
        }
    }

    /// Take one token, or say in how many seconds one will be there.
    pub fn take(&mut self) -> Result<(), u32> {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / self.rate).ceil().max(1.0) as u32)
        }
    }
}

/// Model call figures, shared by every tenant's backend.
#[derive(Default)]
pub struct ModelMetrics {
    /// Calls made.
    pub calls: AtomicU64,
    /// Calls that failed.
    pub failures: AtomicU64,
    /// Prompt tokens the server reported.
    pub prompt_tokens: AtomicU64,
    /// Output tokens the server reported.
    pub output_tokens: AtomicU64,
    /// Summed latency, µs.
    pub latency_us: AtomicU64,
    /// Latency histogram counts for [`LATENCY_BUCKETS_S`] (cumulative when rendered).
    pub buckets: Mutex<[u64; LATENCY_BUCKETS_S.len()]>,
    /// Requests in flight now.
    pub in_flight: AtomicU64,
}

/// Upper bounds (seconds) of the model latency histogram.
pub const LATENCY_BUCKETS_S: [f64; 8] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// Model request slots kept in a store several instances share (see
/// [`crate::store::SlotStore`]): the bounds then hold across instances.
pub struct SharedSlots {
    /// Where the slots are kept.
    pub store: Arc<dyn crate::store::SlotStore>,
    /// This process's lease owner name.
    pub owner: String,
    /// Leases are read from this clock.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// How long a slot lasts unless renewed (the app renews its own every third of it).
    pub lease_ms: u64,
}

impl SharedSlots {
    /// Wait for a slot of `pool` (at most `max` held at once, by every instance together).
    async fn take(&self, pool: &str, max: usize) -> Result<u64, Error> {
        let mut pause = Duration::from_millis(10);
        loop {
            let now = self.clock.now_ms();
            if let Some(id) = self
                .store
                .slot_take(pool, &self.owner, max, now, now + self.lease_ms)
                .await?
            {
                return Ok(id);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// Gives shared slots back when the call ends (or is dropped).
struct Held {
    store: Arc<dyn crate::store::SlotStore>,
    ids: Vec<u64>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let (store, ids) = (self.store.clone(), std::mem::take(&mut self.ids));
        if ids.is_empty() {
            return;
        }
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                for id in ids {
                    let _ = store.slot_release(id).await;
                }
            });
        }
    }
}

/// A backend that waits for a per-tenant and a global slot before each call and records what
/// the call cost.
pub struct Guarded {
    inner: Arc<dyn LlmBackend>,
    tenant: Arc<Semaphore>,
    global: Arc<Semaphore>,
    metrics: Arc<ModelMetrics>,
    /// Slots shared with other instances: the shared slots, the tenant's pool and its bound,
    /// and the overall bound.
    shared: Option<(Arc<SharedSlots>, String, usize, usize)>,
    /// Where each call the model served is counted: the tenant's usage, by day.
    usage: Option<Usage>,
}

/// A tenant's usage ledger, written once per model call.
struct Usage {
    store: Arc<dyn crate::store::RecallStore>,
    tenant: String,
    clock: Arc<dyn crate::clock::Clock>,
}

impl Guarded {
    /// Wrap `inner`.
    pub fn new(
        inner: Arc<dyn LlmBackend>,
        tenant: Arc<Semaphore>,
        global: Arc<Semaphore>,
        metrics: Arc<ModelMetrics>,
    ) -> Self {
        Guarded {
            inner,
            tenant,
            global,
            metrics,
            shared: None,
            usage: None,
        }
    }

    /// Count every call the model serves in `tenant`'s usage in `store` (the day from
    /// `clock`): session summaries, cluster summaries, retries and answers a quality gate then
    /// discards alike — what the model spent, so a monthly ceiling cannot be passed by calls
    /// that did not end in a summary.
    pub fn counting(
        mut self,
        store: Arc<dyn crate::store::RecallStore>,
        tenant: &str,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Self {
        self.usage = Some(Usage {
            store,
            tenant: tenant.to_string(),
            clock,
        });
        self
    }

    /// Also hold one of `tenant_max` slots of `tenant`'s pool and one of `total` overall in
    /// `slots`, shared with every instance on the store.
    pub fn shared(
        mut self,
        slots: Arc<SharedSlots>,
        tenant: &str,
        tenant_max: usize,
        total: usize,
    ) -> Self {
        self.shared = Some((slots, format!("model:{tenant}"), tenant_max, total));
        self
    }
}

#[async_trait]
impl LlmBackend for Guarded {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let closed = || Error::Unreachable("the service is shutting down".into());
        let _t = self.tenant.acquire().await.map_err(|_| closed())?;
        let _g = self.global.acquire().await.map_err(|_| closed())?;
        // Across instances: the tenant's pool, then the overall one (always in that order).
        let _held = match &self.shared {
            Some((slots, pool, tenant_max, total)) => {
                let mut held = Held {
                    store: slots.store.clone(),
                    ids: Vec::new(),
                };
                held.ids.push(slots.take(pool, *tenant_max).await?);
                held.ids.push(slots.take("model:*", *total).await?);
                Some(held)
            }
            None => None,
        };
        let m = &self.metrics;
        m.in_flight.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let r = self.inner.generate(req).await;
        let took = started.elapsed();
        m.in_flight.fetch_sub(1, Ordering::Relaxed);
        m.calls.fetch_add(1, Ordering::Relaxed);
        m.latency_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if let Ok(mut b) = m.buckets.lock()
            && let Some(i) = LATENCY_BUCKETS_S
                .iter()
                .position(|s| took.as_secs_f64() <= *s)
        {
            b[i] += 1;
        }
        match &r {
            Ok(resp) => {
                m.prompt_tokens.fetch_add(
                    u64::from(resp.prompt_tokens.unwrap_or(0)),
                    Ordering::Relaxed,
                );
                m.output_tokens.fetch_add(
                    u64::from(resp.output_tokens.unwrap_or(0)),
                    Ordering::Relaxed,
                );
            }
            Err(_) => {
                m.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        // A call the model served counts, whatever became of its answer; one that never
        // reached it (no connection) does not.
        if let Some(u) = &self.usage
            && !matches!(r, Err(Error::Unreachable(_)))
        {
            let (prompt, output) = match &r {
                Ok(resp) => (
                    u64::from(resp.prompt_tokens.unwrap_or(0)),
                    u64::from(resp.output_tokens.unwrap_or(0)),
                ),
                Err(_) => (0, 0),
            };
            let day = crate::memories::day_of(u.clock.now_ms());
            if let Err(e) = u.store.add_usage(&u.tenant, &day, 1, prompt, output).await {
                tracing::warn!(error = %crate::types::describe(&e), "cannot record model usage");
            }
        }
        r
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn ready(&self) -> Result<(), Error> {
        self.inner.ready().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_says_when() {
        let mut b = Bucket::new(2);
        for _ in 0..4 {
            assert!(b.take().is_ok());
        }
        assert_eq!(b.take(), Err(1));
    }
}
