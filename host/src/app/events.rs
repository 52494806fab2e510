//! Events: job state changes, progress, summaries written and failures recorded, on one
//! broadcast channel with a bounded backlog per tenant.
//!
//! Every event belongs to one tenant and carries that tenant's own sequence number, so a
//! subscriber that reconnects with the last number it saw (SSE `Last-Event-ID`) gets what it
//! missed, as long as the backlog still holds it. The CLI's progress display and the server's
//! event streams are both subscribers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::tenant::Tenant;

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

struct Backlog {
    next: BTreeMap<Tenant, u64>,
    kept: BTreeMap<Tenant, VecDeque<Event>>,
}

/// The event bus.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    backlog: Arc<Mutex<Backlog>>,
    keep: usize,
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

impl EventBus {
    /// A bus keeping the last `keep` events per tenant.
    pub fn new(keep: usize) -> Self {
        let (tx, _) = broadcast::channel(4096);
        EventBus {
            tx,
            backlog: Arc::new(Mutex::new(Backlog {
                next: BTreeMap::new(),
                kept: BTreeMap::new(),
            })),
            keep: keep.max(1),
        }
    }

    /// Publish an event for `tenant`; returns its id.
    pub fn publish(
        &self,
        tenant: &Tenant,
        kind: &str,
        at_ms: u64,
        session: Option<&str>,
        job: Option<u64>,
        data: serde_json::Value,
    ) -> u64 {
        let mut b = self.backlog.lock().expect("event backlog lock");
        let n = b.next.entry(tenant.clone()).or_insert(0);
        *n += 1;
        let ev = Event {
            id: *n,
            kind: kind.into(),
            at_ms,
            session: session.map(str::to_string),
            job,
            data,
            tenant: tenant.clone(),
        };
        let kept = b.kept.entry(tenant.clone()).or_default();
        kept.push_back(ev.clone());
        while kept.len() > self.keep {
            kept.pop_front();
        }
        // Sent under the lock, so a subscriber that took the backlog under it sees every
        // later event live, none twice and none lost between the two.
        let _ = self.tx.send(ev.clone());
        ev.id
    }

    /// Subscribe to `tenant`'s events: with `Some(after)`, first the retained ones with a
    /// larger id (`Some(0)`: all retained); with `None`, only events from now on.
    pub fn subscribe(&self, tenant: &Tenant, after: Option<u64>) -> Subscription {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reconnecting_subscriber_misses_nothing_retained_and_sees_only_its_tenant() {
        let bus = EventBus::new(3);
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        for i in 0..5 {
            bus.publish(
                &a,
                "job.queued",
                i,
                Some("s"),
                Some(i),
                serde_json::json!({}),
            );
        }
        bus.publish(
            &b,
            "job.queued",
            9,
            Some("s"),
            Some(9),
            serde_json::json!({}),
        );
        let s = bus.subscribe(&a, Some(3));
        assert_eq!(
            s.missed.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert_eq!(s.gap_before, None);
        let s = bus.subscribe(&a, Some(0));
        assert_eq!(s.missed.len(), 3);
        assert_eq!(s.gap_before, Some(3));
        let mut live = bus.subscribe(&a, None).live;
        bus.publish(&b, "x", 0, None, None, serde_json::json!({}));
        bus.publish(&a, "y", 0, None, None, serde_json::json!({}));
        assert_eq!(live.recv().await.unwrap().tenant, b);
        let e = live.recv().await.unwrap();
        assert_eq!((e.tenant, e.id), (a.clone(), 6));
        let ids: Vec<u64> = bus
            .subscribe(&a, Some(5))
            .missed
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, vec![6]);
    }
}
