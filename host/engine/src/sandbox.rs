//! The guest's sandbox: what it may reach and how much it may use.
//!
//! The linker provides only `wasi:io` and `wasi:cli`, which Rust's std imports even in a
//! guest that does no I/O, over a `WasiCtx` that grants nothing: no arguments, no
//! environment, no working directory, stdin empty and stdout/stderr discarded. Clocks,
//! randomness, the filesystem and sockets are not linked at all, so a component that imports
//! them fails to instantiate. Each call gets a fresh instance with a linear-memory cap and a
//! fuel budget (instructions executed, so time spent waiting for the model is not counted).

use wasmtime::component::Linker;
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi::cli::{WasiCli, WasiCliView};
use wasmtime_wasi::p2::bindings::cli;

use crate::imports::HostState;

/// Default cap on a call's guest linear memory: 256 MiB.
pub const DEFAULT_MEMORY_LIMIT: usize = 256 << 20;

/// Default fuel per call (about one unit per WebAssembly instruction): 200 billion, minutes
/// of guest work, far above any real call (a summary pass over 3,000 tokens takes well under
/// 10 million) but a hard stop for a runaway loop.
pub const DEFAULT_FUEL: u64 = 200_000_000_000;

/// Tokens of a session per additional per-call budget, for the calls that work through its
/// episodes (catching up, planning): such a call gets `fuel × (1 + tokens / this)`. At the
/// default budget that is 16,000 units per token. Measured: folding takes up to ~8,000 units
/// per token (the extractive summarizer), map-reduce ~4,000, so a 256 MiB transcript (~60
/// million tokens) is summarized in one call. A tighter `fuel` stays proportionally tight.
pub const TOKENS_PER_BUDGET: u64 = 12_500_000;

/// A context that grants the guest nothing.
pub fn empty_ctx() -> WasiCtx {
    WasiCtx::builder().build()
}

/// Link `wasi:io` and `wasi:cli` only.
pub fn add_wasi_to_linker(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi_io::add_to_linker_async(l)?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, <HostState as WasiCliView>::cli)?;
    Ok(())
}

/// Interface prefixes the guest may import.
pub const ALLOWED_IMPORTS: &[&str] = &["abridge:engine/", "wasi:io/", "wasi:cli/"];
