//! `abridge:engine/clock`: the embedder's [`crate::clock::Clock`].

use super::HostState;
use crate::bindings::abridge::engine::clock::Host;

impl Host for HostState {
    async fn now_ms(&mut self) -> u64 {
        self.clock.now_ms()
    }
}
