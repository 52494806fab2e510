//! `abridge:engine/log`: the embedder's log sink.

use super::HostState;
use crate::bindings::abridge::engine::log::{Host, Level};

impl Host for HostState {
    async fn write(&mut self, level: Level, message: String) {
        (self.log)(level, &message);
    }
}
