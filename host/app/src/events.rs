//! Events: job state changes, progress, summaries written and failures recorded, on one
//! broadcast channel with a bounded backlog per tenant.
//!
//! Every event belongs to one tenant and carries that tenant's own sequence number, so a
//! subscriber that reconnects with the last number it saw (SSE `Last-Event-ID`) gets what it
//! missed, as long as the backlog still holds it. The backlog is kept in the store
//! ([`EventStore`]), so numbers keep increasing and nothing retained is lost across a
//! restart. The CLI's progress display and the server's event streams are both subscribers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::LogFn;
use crate::store::{EventRow, EventStore};
use crate::tenant::Tenant;
use crate::types::Level;

/// One event.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Event {
    /// The tenant's sequence number (1, 2, …), the SSE event id.
    pub id: u64,
    /// `job.queued`, `job.running`, `job.progress`, `job.succeeded`, `job.failed`,
    /// `job.cancelled`, `summary.written` or `failure.recorded`.
    pub kind: String,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The session it concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The job it concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<u64>,
    /// Kind-specific fields (job state, progress stage and counts, the summary row).
    pub data: serde_json::Value,
    /// The owning tenant (never sent to clients).
    #[serde(skip)]
    pub tenant: Tenant,
}

/// What an event says, typed: every event the app publishes is one of these, serialized once
/// into the [`Event`]'s `kind` and `data` (the names and fields the HTTP API's event streams
/// and the store carry), and read back with [`Event::what`] by every subscriber instead of
/// picking fields out of JSON.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[serde(tag = "kind", content = "data")]
pub enum What {
    /// A job was queued (or, `released`, given back to the queue at shutdown).
    #[serde(rename = "job.queued")]
    JobQueued {
        /// `queued`.
        state: String,
        /// The episode the job brings the summary up to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<u64>,
        /// Given back by a worker that shut down.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        released: Option<bool>,
    },
    /// A run joined the session's active job.
    #[serde(rename = "job.joined")]
    JobJoined {
        /// The job's state.
        state: String,
        /// Its target episode.
        target: u64,
    },
    /// Another worker runs the job; this one waits for it.
    #[serde(rename = "job.waiting")]
    JobWaiting {
        /// `running`.
        state: String,
        /// The worker holding it.
        owner: Option<String>,
    },
    /// A worker started the job.
    #[serde(rename = "job.running")]
    JobRunning {
        /// `running`.
        state: String,
        /// The attempt (from 1).
        attempt: u32,
        /// The target episode.
        target: u64,
        /// Whether an earlier attempt ran (its cached answers are reused).
        resumed: bool,
        /// The worker.
        worker: String,
        /// Reduce calls per level, when the plan is a map-reduce.
        levels: Option<Vec<u32>>,
        /// Map chunks.
        chunks: Option<u32>,
        /// Whether the plan is a map-reduce.
        map_reduce: Option<bool>,
    },
    /// Progress of a running job.
    #[serde(rename = "job.progress")]
    JobProgress {
        /// `map` or `reduce`.
        stage: String,
        /// 0 for map, then the reduce level.
        level: u32,
        /// Calls done at this level.
        done: u32,
        /// Calls at this level.
        total: u32,
        /// Model answers received in all.
        answers: u64,
    },
    /// A summary row was written or extended.
    #[serde(rename = "summary.written")]
    SummaryWritten(crate::SummaryView),
    /// The job succeeded.
    #[serde(rename = "job.succeeded")]
    JobSucceeded {
        /// `succeeded`.
        state: String,
        /// The newest row written.
        summary: Option<u64>,
        /// The episode it covers up to.
        covered: Option<u64>,
        /// Summary passes made.
        passes: u32,
        /// The highest reduce level reached.
        level: Option<u32>,
        /// Model answers received.
        answers: Option<u64>,
    },
    /// The job was cancelled.
    #[serde(rename = "job.cancelled")]
    JobCancelled {
        /// `cancelled`.
        state: String,
    },
    /// A failed refresh was recorded (the session backs off).
    #[serde(rename = "failure.recorded")]
    FailureRecorded {
        /// Failures in a row.
        failures: u32,
        /// The last error.
        error: String,
    },
    /// The job failed.
    #[serde(rename = "job.failed")]
    JobFailed {
        /// `failed`.
        state: String,
        /// Why.
        error: String,
    },
    /// The session was reset.
    #[serde(rename = "session.reset")]
    SessionReset {},
    /// The session's newest message was removed (and the summary rows that covered it).
    #[serde(rename = "message.removed")]
    MessageRemoved {
        /// Its id (the next message takes it again).
        message: u64,
        /// Summary rows deleted with it.
        dropped: Vec<u64>,
    },
    /// A memory was stored.
    #[serde(rename = "memory.written")]
    MemoryWritten {
        /// Its id.
        id: String,
        /// Its cluster.
        cluster: u64,
        /// The cluster's members now.
        members: u32,
        /// Whether the cluster is due for a summary.
        due: bool,
    },
    /// A memory was deleted.
    #[serde(rename = "memory.deleted")]
    MemoryDeleted {
        /// Its id.
        id: String,
        /// Its cluster.
        cluster: u64,
        /// Whether the cluster's summary went with it.
        summary_deleted: bool,
    },
    /// A cluster was summarized.
    #[serde(rename = "cluster.summarized")]
    ClusterSummarized {
        /// The cluster.
        cluster: u64,
        /// `created`, `updated`, `deleted`, …
        action: String,
        /// The summary's id.
        summary: Option<u64>,
        /// How many memories it covers (`GET /v1/summaries/{id}/sources` lists them).
        covered: Option<u32>,
        /// Model calls.
        calls: u32,
        /// Prompt tokens.
        prompt_tokens: u32,
    },
    /// A cluster summary failed.
    #[serde(rename = "cluster.failed")]
    ClusterFailed {
        /// The cluster.
        cluster: u64,
        /// Why.
        error: String,
    },
}

impl What {
    /// A job queued to bring its session up to `target`.
    pub fn queued(target: u64) -> What {
        What::JobQueued {
            state: "queued".into(),
            target: Some(target),
            released: None,
        }
    }

    /// A job cancelled.
    pub fn cancelled() -> What {
        What::JobCancelled {
            state: "cancelled".into(),
        }
    }

    /// Whether the event ends its job (it succeeded, failed or was cancelled).
    pub fn ends_job(&self) -> bool {
        matches!(
            self,
            What::JobSucceeded { .. } | What::JobFailed { .. } | What::JobCancelled { .. }
        )
    }

    /// The event's kind and data, as the wire and the store carry them.
    pub fn encode(&self) -> (String, serde_json::Value) {
        let mut v = serde_json::to_value(self).expect("an event serializes");
        let kind = v["kind"]
            .as_str()
            .expect("every event has a kind")
            .to_string();
        let data = v
            .get_mut("data")
            .map(serde_json::Value::take)
            .unwrap_or_else(|| serde_json::json!({}));
        (kind, data)
    }
}

impl Event {
    /// What the event says, typed (`None` for a kind this build does not know).
    pub fn what(&self) -> Option<What> {
        serde_json::from_value(serde_json::json!({"kind": self.kind, "data": self.data})).ok()
    }
}

struct Backlog {
    /// Each tenant's newest id.
    last: BTreeMap<Tenant, u64>,
    kept: BTreeMap<Tenant, VecDeque<Event>>,
    /// Tenants whose retained events were read from the store (each on first need: a
    /// subscriber, or an event to write), so a start reads no tenant's log.
    loaded: std::collections::BTreeSet<Tenant>,
}

impl Backlog {
    /// Take in `tenant`'s retained events read from the store, beside any this process sent
    /// meanwhile (once: a second load finds it done).
    fn take_loaded(&mut self, tenant: &Tenant, rows: Vec<Event>, keep: usize) {
        if !self.loaded.insert(tenant.clone()) {
            return;
        }
        let kept = self.kept.entry(tenant.clone()).or_default();
        let mut all: Vec<Event> = rows;
        all.extend(kept.drain(..));
        all.sort_by_key(|e| e.id);
        all.dedup_by_key(|e| e.id);
        let skip = all.len().saturating_sub(keep);
        kept.extend(all.into_iter().skip(skip));
        if let Some(newest) = kept.back().map(|e| e.id) {
            let last = self.last.entry(tenant.clone()).or_default();
            *last = (*last).max(newest);
        }
    }
}

/// Read `tenant`'s retained events into `backlog` unless they are there (the store keeps at
/// most `keep` per tenant, so this is one bounded read, once per tenant and process). A read
/// that fails is logged; the tenant's events still flow, and the next need tries again.
async fn ensure_loaded(
    backlog: &Mutex<Backlog>,
    store: &dyn EventStore,
    tenant: &Tenant,
    keep: usize,
    log: &LogFn,
) {
    if backlog
        .lock()
        .expect("event backlog lock")
        .loaded
        .contains(tenant)
    {
        return;
    }
    match store.events_after(tenant.name(), 0, keep).await {
        Ok(rows) => {
            let events: Vec<Event> = rows.into_iter().filter_map(from_row).collect();
            backlog
                .lock()
                .expect("event backlog lock")
                .take_loaded(tenant, events, keep);
        }
        Err(e) => log(
            Level::Warn,
            &format!("cannot read the retained events of tenant {tenant} ({e})"),
        ),
    }
}

/// What the writer is asked to do, in order.
enum Msg {
    Event(Event),
    /// Called once everything sent before it is written and sent.
    Flush(Box<dyn FnOnce() + Send>),
}

/// The event bus.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    backlog: Arc<Mutex<Backlog>>,
    queue: mpsc::UnboundedSender<Msg>,
    store: Arc<dyn EventStore>,
    keep: usize,
    log: LogFn,
}

/// A subscription: what was missed, then live events.
pub struct Subscription {
    /// Events after the requested id that the backlog still held, oldest first.
    pub missed: Vec<Event>,
    /// Live events (of every tenant; filter with [`Event::tenant`]).
    pub live: broadcast::Receiver<Event>,
    /// The first id the backlog held, when the requested id was older (events were lost).
    pub gap_before: Option<u64>,
}

fn to_row(e: &Event) -> EventRow {
    EventRow::new(
        &e.tenant,
        &e.kind,
        e.at_ms,
        e.session.as_deref(),
        e.job,
        e.data.to_string(),
    )
}

fn from_row(r: EventRow) -> Option<Event> {
    let tenant = Tenant::new(&r.tenant).ok()?;
    let session = match &r.session_key {
        Some(_) => Some(r.session(&tenant)?.to_string()),
        None => None,
    };
    Some(Event {
        id: r.id,
        kind: r.kind,
        at_ms: r.at_ms,
        session,
        job: r.job,
        data: serde_json::from_str(&r.data).unwrap_or(serde_json::Value::Null),
        tenant,
    })
}

impl EventBus {
    /// A bus keeping each tenant's newest `keep` events in `store` (and in memory, for
    /// reconnecting subscribers). It starts from what `store` holds, so ids keep increasing
    /// across restarts. Events are written by a thread of its own, in batches, then sent to
    /// subscribers in id order; a failed write is logged and the event still sent.
    pub fn new(keep: usize, store: Arc<dyn EventStore>, log: LogFn) -> Self {
        let keep = keep.max(1);
        let (tx, _) = broadcast::channel(4096);
        let (queue, rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(Mutex::new(Backlog {
            last: BTreeMap::new(),
            kept: BTreeMap::new(),
            loaded: Default::default(),
        }));
        let writer = Writer {
            tx: tx.clone(),
            backlog: backlog.clone(),
            store: store.clone(),
            keep,
            log: log.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("abridge-events".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime builds");
                rt.block_on(writer.run(rx));
            });
        if let Err(e) = spawned {
            panic!("cannot start the event writer thread: {e}");
        }
        EventBus {
            tx,
            backlog,
            queue,
            store,
            keep,
            log,
        }
    }

    /// Publish an event for `tenant`. It gets its id when written, and reaches subscribers
    /// then (see [`EventBus::flush`]).
    pub fn publish(
        &self,
        tenant: &Tenant,
        what: &What,
        at_ms: u64,
        session: Option<&str>,
        job: Option<u64>,
    ) {
        let (kind, data) = what.encode();
        let ev = Event {
            id: 0,
            kind,
            at_ms,
            session: session.map(str::to_string),
            job,
            data,
            tenant: tenant.clone(),
        };
        let _ = self.queue.send(Msg::Event(ev));
    }

    /// Wait until every event published before this call is written and sent.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        let done = Box::new(move || {
            let _ = tx.send(());
        });
        if self.queue.send(Msg::Flush(done)).is_ok() {
            let _ = rx.await;
        }
    }

    /// [`EventBus::flush`] for a caller that cannot wait asynchronously (the app being
    /// dropped as a command ends), waiting at most `limit`.
    pub fn flush_blocking(&self, limit: std::time::Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Box::new(move || {
            let _ = tx.send(());
        });
        if self.queue.send(Msg::Flush(done)).is_ok() {
            let _ = rx.recv_timeout(limit);
        }
    }

    /// Drop a session's events (of `kind` only, with `Some`) from what is kept in memory,
    /// after writing those still queued, so the store's delete that follows (a reset, or a pop
    /// dropping `summary.written`, whose text may quote the removed message) reaches them too.
    pub async fn forget_session(&self, tenant: &Tenant, session: &str, kind: Option<&str>) {
        self.flush().await;
        let mut b = self.backlog.lock().expect("event backlog lock");
        if let Some(kept) = b.kept.get_mut(tenant) {
            kept.retain(|e| {
                e.session.as_deref() != Some(session) || kind.is_some_and(|k| e.kind != k)
            });
        }
    }

    /// Subscribe to `tenant`'s events: with `Some(after)`, first the retained ones with a
    /// larger id (`Some(0)`: all retained); with `None`, only events from now on.
    pub async fn subscribe(&self, tenant: &Tenant, after: Option<u64>) -> Subscription {
        // The tenant's retained events are read from the store on its first subscriber.
        if after.is_some() {
            ensure_loaded(&self.backlog, &*self.store, tenant, self.keep, &self.log).await;
        }
        let b = self.backlog.lock().expect("event backlog lock");
        let live = self.tx.subscribe();
        let (mut missed, mut gap_before) = (Vec::new(), None);
        if let Some(after) = after
            && let Some(kept) = b.kept.get(tenant)
        {
            missed = kept.iter().filter(|e| e.id > after).cloned().collect();
            if let Some(first) = kept.front()
                && first.id > after + 1
            {
                gap_before = Some(first.id);
            }
        }
        Subscription {
            missed,
            live,
            gap_before,
        }
    }
}

/// The bus's writer: loads what the store retains, then writes and sends events in order.
struct Writer {
    tx: broadcast::Sender<Event>,
    backlog: Arc<Mutex<Backlog>>,
    store: Arc<dyn EventStore>,
    keep: usize,
    log: LogFn,
}

impl Writer {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        // Nothing is read at start: a tenant's retained events are read when it first needs
        // them (a subscriber, or an event to write), so starting costs the same whatever the
        // log holds.
        let mut failing = false;
        // A store other processes write to (PostgreSQL shared by several instances): what
        // they write is read back, on their notification or at the latest every second.
        let shared = self.store.events_shared();
        let mut signal = if shared {
            self.store.event_signal().await
        } else {
            None
        };
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            let first = tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => break,
                },
                t = async {
                    match signal.as_mut() {
                        Some(s) => s.recv().await,
                        None => std::future::pending().await,
                    }
                }, if shared => {
                    match t {
                        Some(t) if !t.is_empty() => self.catch_up(Some(t)).await,
                        Some(_) => self.catch_up(None).await,
                        None => signal = None,
                    }
                    continue;
                }
                _ = tick.tick(), if shared => {
                    self.catch_up(None).await;
                    continue;
                }
            };
            // Take what else is waiting, so a burst is one write per tenant.
            let mut batch = vec![first];
            while batch.len() < 512
                && let Ok(m) = rx.try_recv()
            {
                batch.push(m);
            }
            // Each tenant's events, in the order they were published.
            let mut by_tenant: BTreeMap<Tenant, Vec<Event>> = BTreeMap::new();
            let mut flushes = Vec::new();
            for m in batch {
                match m {
                    Msg::Event(e) => by_tenant.entry(e.tenant.clone()).or_default().push(e),
                    Msg::Flush(done) => flushes.push(done),
                }
            }
            for (t, mut mine) in by_tenant {
                ensure_loaded(&self.backlog, &*self.store, &t, self.keep, &self.log).await;
                let rows: Vec<EventRow> = mine.iter().map(to_row).collect();
                let floor = self
                    .backlog
                    .lock()
                    .expect("event backlog lock")
                    .last
                    .get(&t)
                    .copied()
                    .unwrap_or(0);
                let first = match self
                    .store
                    .append_events(t.name(), floor, &rows, self.keep)
                    .await
                {
                    Ok(first) => {
                        failing = false;
                        first
                    }
                    Err(e) => {
                        if !failing {
                            (self.log)(
                                Level::Warn,
                                &format!(
                                    "cannot store events ({e}); they are sent but not kept across a restart"
                                ),
                            );
                        }
                        failing = true;
                        floor + 1
                    }
                };
                // Another instance wrote between what this one delivered and its own:
                // theirs first, so every subscriber sees the tenant's events in order.
                if shared && first > floor + 1 {
                    self.deliver_stored(&t, floor, first - 1).await;
                }
                let mut b = self.backlog.lock().expect("event backlog lock");
                for (i, ev) in mine.iter_mut().enumerate() {
                    ev.id = first + i as u64;
                }
                let last = first + mine.len() as u64 - 1;
                b.last.insert(t.clone(), last);
                let kept = b.kept.entry(t).or_default();
                for ev in mine {
                    kept.push_back(ev.clone());
                    // Sent under the lock, so a subscriber that took the backlog under it
                    // sees every later event live, none twice and none lost between the two.
                    let _ = self.tx.send(ev);
                }
                while kept.len() > self.keep {
                    kept.pop_front();
                }
            }
            for done in flushes {
                done();
            }
        }
    }
}

impl Writer {
    /// Deliver what other processes stored: for `tenant`, or for every tenant whose newest
    /// stored event is past what was delivered.
    async fn catch_up(&self, tenant: Option<String>) {
        let heads: Vec<(String, u64)> = match tenant {
            Some(t) => vec![(t, u64::MAX)],
            None => match self.store.event_heads().await {
                Ok(h) => h,
                Err(_) => return,
            },
        };
        for (name, head) in heads {
            let Ok(t) = Tenant::new(&name) else { continue };
            // A tenant no one here has needed yet: its first need reads the store.
            if !self
                .backlog
                .lock()
                .expect("event backlog lock")
                .loaded
                .contains(&t)
            {
                continue;
            }
            let last = self.delivered(&t);
            if head > last {
                self.deliver_stored(&t, last, head).await;
            }
        }
    }

    fn delivered(&self, t: &Tenant) -> u64 {
        self.backlog
            .lock()
            .expect("event backlog lock")
            .last
            .get(t)
            .copied()
            .unwrap_or(0)
    }

    /// Read `tenant`'s stored events after `after` up to `upto` and deliver them in order
    /// (none twice: what was delivered already is skipped).
    async fn deliver_stored(&self, t: &Tenant, after: u64, upto: u64) {
        let mut after = after;
        loop {
            let rows = match self.store.events_after(t.name(), after, 512).await {
                Ok(r) => r,
                Err(_) => return,
            };
            let full = rows.len() == 512;
            let mut b = self.backlog.lock().expect("event backlog lock");
            for ev in rows.into_iter().filter_map(from_row) {
                after = after.max(ev.id);
                if ev.id > upto || ev.id <= b.last.get(t).copied().unwrap_or(0) {
                    continue;
                }
                b.last.insert(t.clone(), ev.id);
                let kept = b.kept.entry(t.clone()).or_default();
                kept.push_back(ev.clone());
                while kept.len() > self.keep {
                    kept.pop_front();
                }
                // Sent under the lock (see `run`).
                let _ = self.tx.send(ev);
            }
            if !full || after >= upto {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    fn bus(keep: usize, store: Arc<dyn EventStore>) -> EventBus {
        EventBus::new(keep, store, Arc::new(|_, _| {}))
    }

    #[test]
    fn events_are_serialized_once_and_read_back_typed() {
        let (kind, data) = What::queued(7).encode();
        assert_eq!(kind, "job.queued");
        assert_eq!(data, serde_json::json!({"state": "queued", "target": 7}));
        let (kind, data) = What::SessionReset {}.encode();
        assert_eq!(
            (kind.as_str(), data),
            ("session.reset", serde_json::json!({}))
        );
        let ev = Event {
            id: 1,
            kind: "job.progress".into(),
            at_ms: 0,
            session: None,
            job: Some(3),
            data: serde_json::json!({"stage": "map", "level": 0, "done": 2, "total": 5, "answers": 2}),
            tenant: Tenant::local(),
        };
        assert!(matches!(
            ev.what(),
            Some(What::JobProgress {
                done: 2,
                total: 5,
                ..
            })
        ));
        let unknown = Event {
            kind: "from.a.newer.build".into(),
            ..ev
        };
        assert!(unknown.what().is_none());
    }

    #[tokio::test]
    async fn a_reconnecting_subscriber_misses_nothing_retained_and_sees_only_its_tenant() {
        let bus = bus(3, Arc::new(SqliteStore::in_memory().unwrap()));
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        for i in 0..5 {
            bus.publish(&a, &What::queued(1), i, Some("s"), Some(i));
        }
        bus.publish(&b, &What::queued(1), 9, Some("s"), Some(9));
        bus.flush().await;
        let s = bus.subscribe(&a, Some(3)).await;
        assert_eq!(
            s.missed.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert_eq!(s.gap_before, None);
        let s = bus.subscribe(&a, Some(0)).await;
        assert_eq!(s.missed.len(), 3);
        assert_eq!(s.gap_before, Some(3));
        let mut live = bus.subscribe(&a, None).await.live;
        bus.publish(&b, &What::SessionReset {}, 0, None, None);
        bus.flush().await;
        bus.publish(&a, &What::SessionReset {}, 0, None, None);
        assert_eq!(live.recv().await.unwrap().tenant, b);
        let e = live.recv().await.unwrap();
        assert_eq!((e.tenant, e.id), (a.clone(), 6));
        let ids: Vec<u64> = bus
            .subscribe(&a, Some(5))
            .await
            .missed
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, vec![6]);
    }

    /// Starting reads no tenant's log: each tenant's retained events are read on its first
    /// need (a subscriber asking for them, or an event to write), once.
    #[tokio::test]
    async fn a_start_reads_no_log_and_each_tenant_is_read_on_first_need() {
        let store: Arc<dyn EventStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        let first = bus(10, store.clone());
        for t in [&a, &b] {
            for i in 0..4 {
                first.publish(t, &What::queued(1), i, Some("s"), Some(i));
            }
        }
        first.flush().await;
        let again = bus(10, store.clone());
        again.flush().await;
        let loaded = |bus: &EventBus| bus.backlog.lock().unwrap().loaded.clone();
        assert!(loaded(&again).is_empty());
        let s = again.subscribe(&a, Some(0)).await;
        assert_eq!(
            s.missed.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert_eq!(
            loaded(&again).into_iter().collect::<Vec<_>>(),
            vec![a.clone()]
        );
        // b's first event here continues its ids, and its log is read then.
        let mut live = again.subscribe(&b, None).await.live;
        again.publish(&b, &What::SessionReset {}, 9, None, None);
        again.flush().await;
        assert_eq!(live.recv().await.unwrap().id, 5);
        assert!(loaded(&again).contains(&b));
        let s = again.subscribe(&b, Some(3)).await;
        assert_eq!(
            s.missed.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![4, 5]
        );
    }

    #[tokio::test]
    async fn ids_and_the_retained_events_survive_a_restart_and_a_reset_forgets_a_session() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let a = Tenant::new("acme").unwrap();
        {
            let store = Arc::new(SqliteStore::open(&path).unwrap());
            let bus = bus(4, store);
            for (i, s) in ["s", "t", "s", "t", "s", "t"].iter().enumerate() {
                bus.publish(&a, &What::queued(i as u64), i as u64, Some(s), None);
            }
            bus.publish(&Tenant::local(), &What::queued(1), 7, Some("s"), None);
            bus.flush().await;
        }
        // Reopened: the newest four of acme's six are retained; ids go on from 6.
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        let bus = bus(4, store.clone());
        let s = bus.subscribe(&a, Some(0)).await;
        let got: Vec<(u64, Option<String>, serde_json::Value)> = s
            .missed
            .iter()
            .map(|e| (e.id, e.session.clone(), e.data["target"].clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (3, Some("s".into()), 2.into()),
                (4, Some("t".into()), 3.into()),
                (5, Some("s".into()), 4.into()),
                (6, Some("t".into()), 5.into()),
            ]
        );
        assert_eq!(s.gap_before, Some(3));
        let mut live = s.live;
        bus.publish(&a, &What::cancelled(), 9, Some("s"), None);
        assert_eq!(live.recv().await.unwrap().id, 7);
        // The local tenant's log is its own.
        assert_eq!(
            bus.subscribe(&Tenant::local(), Some(0)).await.missed[0].id,
            1
        );
        // A session reset takes its events from the store and from memory.
        let scoped = crate::store::AppStore::for_tenant(&*store, &a);
        scoped.reset_session("s").await.unwrap();
        bus.forget_session(&a, "s", None).await;
        let left: Vec<u64> = bus
            .subscribe(&a, Some(0))
            .await
            .missed
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(left, vec![4, 6]);
        let rows = store.recent_events(10).await.unwrap();
        assert!(rows.iter().all(|r| r.session(&a) != Some("s")));
    }
}
