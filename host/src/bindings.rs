//! The one place `bindgen!` runs: host-side types and traits for the `abridge:engine` world.
//!
//! Imports and exports are async so the LLM import can await HTTP without blocking a thread.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "engine",
    imports: { default: async },
    exports: { default: async },
});
