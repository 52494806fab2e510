//! Watching and steering one long engine call from outside it: live progress, and
//! cancellation.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::types::PlanReport;

/// Where a call stands. `level` 0 is the map phase, 1 and up the reduce levels; `done` of
/// `total` answers of that stage are in hand (cached ones count); `answers` counts every model
/// answer received during the call, across stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Stage: 0 map, 1.. reduce levels.
    pub level: u32,
    /// Answers of this stage in hand.
    pub done: u32,
    /// Answers this stage needs.
    pub total: u32,
    /// Model answers received so far in the call (not counting cached ones).
    pub answers: u64,
}

/// Sees every progress change of a call, as it happens.
pub type Observer = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Sees each plan a call reports: once before its first model call, again if it re-plans.
pub type PlanObserver = Arc<dyn Fn(&PlanReport) + Send + Sync>;

/// Shared between the caller and a running call (see [`crate::Abridge::summarize_now_with`]).
#[derive(Default)]
pub struct CallControl {
    level: AtomicU32,
    done: AtomicU32,
    total: AtomicU32,
    answers: AtomicU64,
    cancelled: AtomicBool,
    observer: Option<Observer>,
    plan: Mutex<Option<PlanReport>>,
    plan_observer: Option<PlanObserver>,
}

/// The error a cancelled call traps with.
#[derive(Debug, thiserror::Error)]
#[error("the call was cancelled")]
pub struct Cancelled;

impl CallControl {
    /// A fresh control: no progress, not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh control whose progress changes are passed to `observer` as they happen (from
    /// the call's task; keep it quick).
    pub fn observed(observer: Observer) -> Self {
        CallControl {
            observer: Some(observer),
            ..Self::default()
        }
    }

    /// The same control, whose call's plans are passed to `observer` as they are reported.
    pub fn on_plan(mut self, observer: PlanObserver) -> Self {
        self.plan_observer = Some(observer);
        self
    }

    /// The plan the call reported last (`None` before it planned).
    pub fn plan(&self) -> Option<PlanReport> {
        self.plan.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The guest's plan, before its first model call or after a re-plan.
    pub(crate) fn planned(&self, report: PlanReport) {
        if let Some(o) = &self.plan_observer {
            o(&report);
        }
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
    }

    fn notify(&self) {
        if let Some(o) = &self.observer {
            o(&self.progress());
        }
    }

    /// The latest progress.
    pub fn progress(&self) -> Progress {
        Progress {
            level: self.level.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            answers: self.answers.load(Ordering::Relaxed),
        }
    }

    /// Ask the call to stop: in-flight model requests are dropped, the guest traps, and
    /// nothing is written (answers already received stay cached).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Resolves once the call is cancelled (checked every 50 ms).
    pub(crate) async fn cancelled(&self) {
        while !self.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The guest's report at a stage boundary or after a batch.
    pub(crate) fn stage(&self, level: u32, done: u32, total: u32) {
        self.level.store(level, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.done.store(done.min(total), Ordering::Relaxed);
        self.notify();
    }

    /// One model answer arrived.
    pub(crate) fn answered(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let _ = self
            .done
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                (d < total).then_some(d + 1)
            });
        self.notify();
    }
}
