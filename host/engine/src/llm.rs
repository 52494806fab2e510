//! The language model the engine calls, behind one trait ([`LlmBackend`]). The HTTP
//! backends (Ollama, OpenAI-compatible) live in the `abridge-backend` crate.

use async_trait::async_trait;

use crate::types::{Error, Request, Response};

/// A language model the engine can call. Implement it to plug in another server or a
/// scripted model in tests.
#[async_trait]
pub trait LlmBackend: Send + Sync {
    /// Run one request. Errors use the WIT error cases so the guest can act on them.
    async fn generate(&self, req: Request) -> Result<Response, Error>;

    /// A short name for messages and `--json` output (`ollama`, `openai`).
    fn name(&self) -> &str;

    /// Whether the server answers now (for readiness checks); by default assumed.
    async fn ready(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// A backend for the extractive engine, which never calls a model: any call is a bug in the
/// configuration, reported as such.
pub struct NoModel;

#[async_trait]
impl LlmBackend for NoModel {
    async fn generate(&self, _req: Request) -> Result<Response, Error> {
        Err(Error::InvalidInput(
            "no language model is configured; use the extractive engine or pass --backend ollama|openai".into(),
        ))
    }

    fn name(&self) -> &str {
        "none"
    }
}
