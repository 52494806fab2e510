//! The one place `bindgen!` runs: host-side types and traits for the `abridge:engine` world.
//!
//! Imports and exports are async so the LLM import can await HTTP without blocking a thread.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "engine",
    imports: {
        // A cancelled job stops the guest mid-call: these may trap.
        "abridge:engine/llm.generate": async | trappable,
        "abridge:engine/llm.generate-batch": async | trappable,
        default: async,
    },
    exports: { default: async },
});
