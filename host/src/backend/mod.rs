//! Language-model backends behind one trait.

use async_trait::async_trait;

use crate::types::{Error, Request, Response};

mod ollama;
mod openai;
mod retry;

pub use ollama::Ollama;
pub use openai::OpenAi;
pub use retry::{Attempt, RetryPolicy};

/// A language model the engine can call. Implement it to plug in another server or a
/// scripted model in tests.
#[async_trait]
pub trait LlmBackend: Send + Sync {
    /// Run one request. Errors use the WIT error cases so the guest can act on them.
    async fn generate(&self, req: Request) -> Result<Response, Error>;

    /// A short name for messages and `--json` output (`ollama`, `openai`).
    fn name(&self) -> &str;
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

/// Map a server's `done_reason` / `finish_reason` (absent means a normal stop).
pub(crate) fn finish_reason(reason: Option<&str>) -> crate::types::FinishReason {
    use crate::types::FinishReason;
    match reason {
        Some("stop") | None => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some(_) => FinishReason::Other,
    }
}

/// A transport failure as an attempt: all of them may pass, so all are retried.
pub(crate) fn transport_attempt(server: &str, url: &str, e: reqwest::Error, hint: &str) -> Attempt {
    Attempt::Retry(transport_error(server, url, e, hint))
}

/// Map a reqwest transport failure to an engine error that says how to fix it.
pub(crate) fn transport_error(server: &str, url: &str, e: reqwest::Error, hint: &str) -> Error {
    if e.is_timeout() {
        Error::Timeout(format!(
            "{server} at {url} did not answer in time; raise --timeout-secs or check the server's load"
        ))
    } else if e.is_connect() {
        Error::Unreachable(format!(
            "{server} at {url} is not reachable ({}) — {hint}",
            root_cause(&e)
        ))
    } else {
        Error::Server(format!("{server} at {url}: {}", root_cause(&e)))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
