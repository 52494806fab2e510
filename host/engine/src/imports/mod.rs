//! The host side of the guest's imports: one module per WIT interface, each an
//! `impl <interface>::Host for HostState` that forwards to the embedder's traits.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::clock::Clock;
use crate::llm::LlmBackend;
use crate::store::Store;
use crate::types::Level;

mod clock;
mod llm;
mod log;
mod memory_store;
mod store;

pub use memory_store::RecallBinding;

/// Receives the guest's log lines.
pub type LogSink = Arc<dyn Fn(Level, &str) + Send + Sync>;

/// Per-instance host state: what the guest's imports reach, and an empty WASI context (the
/// guest is granted no files, network, environment, clocks or randomness).
pub struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) llm: Arc<dyn LlmBackend>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) log: LogSink,
    pub(crate) batch_concurrency: usize,
    /// Requests in flight, learned from the server; shared by every call of one engine.
    pub(crate) adaptive: Arc<std::sync::Mutex<crate::adaptive::Adaptive>>,
    pub(crate) lockstep: bool,
    pub(crate) control: Option<Arc<crate::control::CallControl>>,
    pub(crate) limits: wasmtime::StoreLimits,
    pub(crate) recall: Option<RecallBinding>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wasmtime_wasi_io::IoView for HostState {
    fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

impl crate::bindings::abridge::engine::types::Host for HostState {}
