//! The abridge guest: a WebAssembly component with the summarization logic and no I/O.
//!
//! The logic lives in plain modules, free of bindgen types, tested natively with
//! `cargo test -p abridge-guest`. `component.rs` is the thin export shell that implements the
//! generated `Guest` traits on wasm32 only (export names such as `abridge:engine/…` cannot be
//! linked into a native shared library).
#![deny(missing_docs)]

pub mod chunk;
pub mod context;
pub mod dates;
pub mod digest;
pub mod embed;
pub mod engine;
pub mod extractive;
pub mod facts;
pub mod freshness;
pub mod ledger;
pub mod memory;
pub mod plan;
pub mod policy;
pub mod prompt;
pub mod quality;
pub mod search;
pub mod strip;
pub mod tokens;
pub mod transcript;
pub mod types;

#[cfg(target_arch = "wasm32")]
mod component;

#[cfg(test)]
mod golden_tests;
