//! abridge's engine host: runs the sandboxed summarization engine (a WebAssembly component)
//! with wasmtime and supplies what it imports — a language model, a store and the clock —
//! through traits ([`LlmBackend`], [`Store`], [`RecallStore`], [`Embedder`], [`Clock`]).
//!
//! This is what an embedder depends on: [`Abridge::builder`] plus an implementation of each
//! trait (the `abridge-store` and `abridge-backend` crates have ready ones). Nothing here
//! serves HTTP, parses a command line or speaks PostgreSQL.
#![deny(missing_docs)]

mod adaptive;
pub mod bindings;
pub mod clock;
pub mod control;
pub mod defaults;
pub mod embedder;
mod imports;
pub mod llm;
pub mod runtime;
pub mod sandbox;
pub mod store;
pub mod text;
pub mod types;

pub use adaptive::Adaptive;
pub use clock::{Clock, ManualClock, SystemClock};
pub use control::{CallControl, Cancelled, PlanObserver, Progress};
pub use embedder::{Embedder, Vectors};
pub use imports::RecallBinding;
pub use llm::{LlmBackend, NoModel};
pub use runtime::{Abridge, AbridgeBuilder, BuiltPrompt, CallError, ComponentSource, Runtime};
pub use store::{ClusterRow, RecallStore, Store, Unsettled, UsageDay};

/// Tokens a message costs beyond its content when a conversation is sent (its role and
/// framing): the guest's `plan::MESSAGE_COST`, which a context's `full_tokens` counts. A
/// session's size as the app reports it counts it too, so both say one size (an e2e test,
/// `newcomer::a_sessions_history_is_one_size`, holds them equal).
pub const MESSAGE_COST: u64 = 3;
