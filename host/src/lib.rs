//! abridge's native host: runs the sandboxed summarization engine (a WebAssembly component)
//! with wasmtime and supplies what it imports — a language model over HTTP, a SQLite store,
//! the clock and logging.
//!
//! Embed it with [`Abridge::builder`]; every outside dependency is a trait
//! ([`LlmBackend`], [`Store`], [`Clock`]) you may implement yourself.
#![deny(missing_docs)]

pub mod app;
pub mod backend;
pub mod bindings;
pub mod clock;
pub mod control;
pub mod crypto;
mod imports;
pub mod jobs;
pub mod runtime;
pub mod sandbox;
pub mod server;
pub mod sources;
pub mod store;
pub mod tenant;
pub mod text;
pub mod transcript;
pub mod types;
pub mod walk;

pub use backend::{LlmBackend, NoModel, Ollama, OpenAi};
pub use clock::{Clock, ManualClock, SystemClock};
pub use control::{CallControl, Cancelled, Progress};
pub use runtime::{Abridge, AbridgeBuilder, BuiltPrompt, CallError, ComponentSource, Runtime};
pub use store::{MemoryStore, PgStore, SqliteStore, Store};
