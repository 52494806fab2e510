//! `abridge:engine/log`: the embedder's log sink, and progress for the call's control.

use super::HostState;
use crate::bindings::abridge::engine::log::{Host, Level};
use crate::bindings::abridge::engine::types::PlanReport;

impl Host for HostState {
    async fn write(&mut self, level: Level, message: String) {
        (self.log)(level, &message);
    }

    async fn progress(&mut self, level: u32, done: u32, total: u32) {
        if let Some(c) = &self.control {
            c.stage(level, done, total);
        }
    }

    async fn planned(&mut self, report: PlanReport) {
        if let Some(c) = &self.control {
            c.planned(report);
        }
    }
}
