//! End-to-end tests: the real `abridge` binary against the project's own Ollama-compatible
//! test server on a free loopback port, with a real SQLite file.

mod agents;
mod app;
mod backfill;
mod bad_input;
mod console;
mod drift;
mod embed;
mod engine_api;
mod facts;
mod golden_chains;
mod golden_transcripts;
mod harness;
mod hostile;
mod hostile_web;
mod hosts;
mod ingest;
mod jobs;
mod mcp;
mod memories;
mod model_output;
mod newcomer;
mod plugin;
mod postgres;
mod python;
mod readme;
mod real_data;
mod sandbox;
mod scale;
pub(crate) mod serve;
mod summarize;
mod tls;
mod watch;
mod wit_version;
