//! The Ollama native API (`/api/chat`, `/api/generate` with `raw: true`).
//!
//! Every request sends `num_ctx` and `truncate: false`, so an over-long prompt is refused
//! rather than silently cut (see ../shared/docs/ollama-api.md §6).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Attempt, LlmBackend, RetryPolicy, transport_attempt, transport_error};
use crate::types::{Error, Prompt, Request, Response};

/// An Ollama server.
pub struct Ollama {
    http: reqwest::Client,
    base: String,
    /// `base` with any credentials redacted: the only form shown.
    shown: String,
    retry: RetryPolicy,
}

const HINT: &str =
    "start it with 'ollama serve', set EXTRACTION_URL/--url, or pass --backend extractive";

impl Ollama {
    /// A client for the server at `base` (e.g. `http://localhost:11434`); each generation may
    /// take up to `timeout`.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, Error> {
        // A local server: never route it through a proxy.
        let (http, base, shown) =
            super::server_client(base, "EXTRACTION_URL/--url", timeout, |b| b.no_proxy())?;
        Ok(Ollama {
            http,
            base,
            shown,
            retry: RetryPolicy::default(),
        })
    }

    /// Retry transient failures with this policy (default: 3 attempts, 500 ms doubling).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The server's base URL, credentials redacted.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Check the server answers (`GET /api/version`, 2 s limit); returns its version.
    pub async fn probe(&self) -> Result<String, Error> {
        let url = format!("{}/api/version", self.base);
        let resp = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map_err(|e| transport_error("Ollama", &self.base, e, HINT))?;
        let v: Value = resp.json().await.map_err(|_| {
            Error::Server(format!("{} answered /api/version with something that is not Ollama's JSON; check EXTRACTION_URL/--url", self.shown))
        })?;
        Ok(v.get("version")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    /// Whether `model` is pulled (`GET /api/tags`; `name` and `name:latest` both match).
    pub async fn has_model(&self, model: &str) -> Result<bool, Error> {
        let url = format!("{}/api/tags", self.base);
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| transport_error("Ollama", &self.base, e, HINT))?;
        let v: Value = resp.json().await.map_err(|_| {
            Error::Server(format!(
                "{} answered /api/tags with something that is not JSON",
                self.shown
            ))
        })?;
        let want_latest = format!("{model}:latest");
        Ok(v.get("models").and_then(Value::as_array).is_some_and(|ms| {
            ms.iter()
                .filter_map(|m| m.get("name").and_then(Value::as_str))
                .any(|n| n == model || n == want_latest)
        }))
    }
}

/// The error for a model that is not pulled.
pub(crate) fn not_pulled(model: &str) -> Error {
    Error::ModelNotFound(format!(
        "model '{model}' is not available on the Ollama server — run 'ollama pull {model}', pick another with --model/EXTRACTION_MODEL, or pass --backend extractive"
    ))
}

impl Ollama {
    /// One attempt at a request, classified for the retry policy.
    async fn attempt(&self, req: &Request, path: &str, body: &Value) -> Attempt {
        let url = format!("{}{path}", self.shown);
        let resp = match self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => return transport_attempt("Ollama", &self.base, e, HINT),
        };
        let status = resp.status();
        let text = match super::read_capped(resp, super::MAX_RESPONSE_BYTES).await {
            Ok(t) => t,
            Err(Some(e)) => return transport_attempt("Ollama", &self.base, e, HINT),
            Err(None) => return Attempt::Done(Err(super::oversized(&url))),
        };
        let v: Option<Value> = serde_json::from_str(&text).ok();
        let err_msg = v
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .map(str::to_string);
        if !status.is_success() {
            let msg = err_msg.unwrap_or_else(|| snippet(&text));
            return super::status_attempt(status.as_u16(), &url, msg, || not_pulled(&req.model));
        }
        let Some(v) = v else {
            return Attempt::Retry(Error::Server(format!(
                "{url} answered with something that is not JSON ({}); is it really an Ollama server?",
                snippet(&text)
            )));
        };
        if let Some(msg) = err_msg {
            if super::is_context_overflow(&msg) {
                return Attempt::Done(Err(Error::ContextOverflow(msg)));
            }
            return Attempt::Retry(Error::Server(format!("{url}: {msg}")));
        }
        let Some(content) = v
            .pointer("/message/content")
            .or_else(|| v.get("response"))
            .and_then(Value::as_str)
        else {
            return Attempt::Retry(Error::Server(format!(
                "{url} answered without a message; is it really an Ollama server?"
            )));
        };
        let finish = super::finish_reason(v.get("done_reason").and_then(Value::as_str));
        let count = |k: &str| {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|n| n.min(u32::MAX as u64) as u32)
        };
        Attempt::Done(Ok(Response {
            text: content.to_string(),
            finish_reason: finish,
            prompt_tokens: count("prompt_eval_count"),
            output_tokens: count("eval_count"),
            // Nanoseconds in Ollama's answer.
            server_ms: v
                .get("total_duration")
                .and_then(Value::as_u64)
                .map(|ns| (ns / 1_000_000).min(u32::MAX as u64) as u32),
        }))
    }
}

#[async_trait]
impl LlmBackend for Ollama {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let mut options = json!({
            "num_ctx": req.context_length,
            "num_predict": req.max_output_tokens,
            "temperature": req.temperature,
        });
        if !req.stop.is_empty() {
            options["stop"] = json!(req.stop);
        }
        if let Some(seed) = req.seed {
            options["seed"] = json!(seed);
        }
        let (path, body) = match &req.prompt {
            Prompt::Chat(ms) => {
                let messages: Vec<Value> = ms
                    .iter()
                    .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
                    .collect();
                (
                    "/api/chat",
                    json!({"model": req.model, "messages": messages, "stream": false, "truncate": false, "options": options}),
                )
            }
            Prompt::Raw(p) => (
                "/api/generate",
                json!({"model": req.model, "prompt": p, "raw": true, "stream": false, "truncate": false, "options": options}),
            ),
        };
        self.retry.run(|| self.attempt(&req, path, &body)).await
    }

    fn name(&self) -> &str {
        "ollama"
    }

    async fn ready(&self) -> Result<(), Error> {
        self.probe().await.map(drop)
    }
}

/// The start of a response body, for error messages.
pub(crate) fn snippet(text: &str) -> String {
    let t: String = text.chars().take(120).collect();
    if t.len() < text.len() {
        format!("{t}…")
    } else {
        t
    }
}
