//! How many model requests to keep in flight, learned from the server.
//!
//! A single-slot Ollama (its common setting) queues what it cannot run, and the per-call
//! timeout counts queue time: six requests in flight against one slot time out while still
//! queued. So the limit adapts, additive increase and multiplicative decrease: it halves on a
//! timeout, and on queueing; it grows by one after a run of answers with no sign of queueing,
//! up to the configured maximum.
//!
//! Queueing is measured, not guessed, when the server says how long it worked on a request
//! (Ollama's `total_duration`): the rest of the call's time was spent waiting. Without that,
//! the median of recent latencies far above the fastest seen stands for it. Medians keep a
//! single slow answer (a heavy tail) from cutting the limit.

use std::collections::VecDeque;
use std::time::Duration;

/// Latencies kept for the median.
const WINDOW: usize = 8;

/// Median over fastest above which requests are queueing.
const QUEUEING: f64 = 1.8;

/// Median over fastest below which there is room for one more.
const ROOM: f64 = 1.3;

/// Median share of a call's time spent queued above which the server is queueing.
const QUEUED_SHARE: f64 = 0.4;

/// Median share below which there is room for one more.
const FREE_SHARE: f64 = 0.15;

/// Answers to wait after a cut for queueing before probing upward again.
const HOLD: usize = 24;

/// The learned limit of requests in flight.
#[derive(Debug)]
pub struct Adaptive {
    max: usize,
    limit: usize,
    fastest: Option<Duration>,
    recent: VecDeque<Duration>,
    /// Recent shares of each call's time spent queued (when the server reports its own time).
    queued: VecDeque<f64>,
    /// Answers since the limit last changed.
    since_change: usize,
    /// Answers to wait before probing upward (after a cut for queueing).
    hold: usize,
}

impl Adaptive {
    /// A limit starting at `max` (a server with many slots loses nothing at the start).
    pub fn new(max: usize) -> Adaptive {
        let max = max.max(1);
        Adaptive {
            max,
            limit: max,
            fastest: None,
            recent: VecDeque::with_capacity(WINDOW),
            queued: VecDeque::with_capacity(WINDOW),
            since_change: 0,
            hold: 0,
        }
    }

    /// Requests that may be in flight now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn set(&mut self, limit: usize) {
        let limit = limit.clamp(1, self.max);
        if limit != self.limit {
            self.limit = limit;
            self.since_change = 0;
            // Latencies seen at the old limit say nothing about the new one.
            self.recent.clear();
            self.queued.clear();
        }
    }

    /// A request timed out (queue time counts): halve.
    pub fn timed_out(&mut self) {
        self.set(self.limit / 2);
    }

    /// A request answered after `latency`, of which the server reports working `server`,
    /// with `in_flight` requests out (itself included).
    pub fn answered(&mut self, latency: Duration, server: Option<Duration>, in_flight: usize) {
        self.since_change += 1;
        self.hold = self.hold.saturating_sub(1);
        let (queueing, room) = match server {
            Some(work) if !latency.is_zero() => {
                let share = latency.saturating_sub(work).as_secs_f64() / latency.as_secs_f64();
                push(&mut self.queued, share);
                match median(&self.queued) {
                    Some(m) => (m > QUEUED_SHARE, m < FREE_SHARE),
                    None => return,
                }
            }
            _ => {
                self.fastest = Some(self.fastest.map_or(latency, |f| f.min(latency)));
                push(&mut self.recent, latency);
                let (Some(fastest), Some(m)) = (self.fastest, median(&self.recent)) else {
                    return;
                };
                if fastest.is_zero() {
                    return;
                }
                let ratio = m.as_secs_f64() / fastest.as_secs_f64();
                (ratio > QUEUEING, ratio < ROOM)
            }
        };
        if queueing && in_flight > 1 {
            self.set(self.limit / 2);
            self.hold = HOLD;
        } else if room && self.hold == 0 && self.since_change >= self.limit * 2 {
            self.set(self.limit + 1);
        }
    }
}

fn push<T>(q: &mut VecDeque<T>, x: T) {
    if q.len() == WINDOW {
        q.pop_front();
    }
    q.push_back(x);
}

/// The median of at least three values.
fn median<T: Copy + PartialOrd>(q: &VecDeque<T>) -> Option<T> {
    if q.len() < 3 {
        return None;
    }
    let mut v: Vec<T> = q.iter().copied().collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Some(v[v.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sliding window of `limit` requests on a server with `slots` slots, each answer
    /// taking `t` of work: in the steady state a request waits for the ones ahead of it.
    fn converge(slots: usize, max: usize, reports: bool) -> usize {
        let mut a = Adaptive::new(max);
        let t = Duration::from_millis(100);
        // The first wave fills the queue: its i-th answer waits for the ones before it.
        for i in 0..max {
            a.answered(t * ((i / slots) as u32 + 1), reports.then_some(t), max);
        }
        for _ in 0..400 {
            let k = a.limit();
            let latency = t * (k.div_ceil(slots) as u32);
            a.answered(latency, reports.then_some(t), k);
        }
        a.limit()
    }

    #[test]
    fn settles_at_the_servers_slots() {
        for reports in [true, false] {
            assert!(
                converge(1, 6, reports) <= 2,
                "{reports}: {}",
                converge(1, 6, reports)
            );
            assert!(
                converge(2, 6, reports) <= 3,
                "{reports}: {}",
                converge(2, 6, reports)
            );
            assert_eq!(converge(8, 6, reports), 6, "{reports}");
        }
    }

    #[test]
    fn a_heavy_tail_does_not_cut_the_limit_and_timeouts_halve_it() {
        let mut a = Adaptive::new(6);
        let t = Duration::from_millis(100);
        for i in 0..70 {
            let work = if i % 7 == 6 { t * 8 } else { t };
            a.answered(work + Duration::from_millis(1), Some(work), 6);
        }
        assert_eq!(a.limit(), 6);
        a.timed_out();
        assert_eq!(a.limit(), 3);
        a.timed_out();
        a.timed_out();
        assert_eq!(a.limit(), 1);
        // Room again: it probes upward.
        for _ in 0..40 {
            a.answered(t, Some(t), 1);
        }
        assert!(a.limit() > 1);
    }
}
