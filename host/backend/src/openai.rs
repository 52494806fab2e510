//! OpenAI-compatible servers (`/v1/chat/completions`): vLLM, llama.cpp, LM Studio, Ollama's
//! `/v1`, hosted APIs reached over plain HTTP or a local TLS proxy.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::ollama::snippet;
use super::{Attempt, LlmBackend, RetryPolicy, transport_attempt};
use crate::types::{Error, Prompt, Request, Response};

/// An OpenAI-compatible server.
pub struct OpenAi {
    http: reqwest::Client,
    base: String,
    /// `base` with any credentials redacted: the only form shown.
    shown: String,
    key: Option<String>,
    retry: RetryPolicy,
}

const HINT: &str = "check OPENAI_BASE_URL, or pass --backend ollama|extractive";

impl OpenAi {
    /// A client for `base` (ending in `/v1`), with an optional API key sent as a bearer token.
    pub fn new(base: &str, key: Option<String>, timeout: Duration) -> Result<Self, Error> {
        let (http, base, shown) = super::server_client(base, "OPENAI_BASE_URL", timeout, |b| b)?;
        Ok(OpenAi {
            http,
            base,
            shown,
            key,
            retry: RetryPolicy::default(),
        })
    }

    /// The version of the Ollama server this `/v1` endpoint belongs to, if it is one: Ollama's
    /// OpenAI-compatible API cannot take `num_ctx`, so it silently truncates prompts to its
    /// default window (see ../shared/docs/ollama-api.md §7). Probes `GET <root>/api/version`
    /// (2 s limit); anything but Ollama's answer is `None`.
    pub async fn ollama_behind(&self) -> Option<String> {
        let root = self.base.strip_suffix("/v1")?;
        let resp = self
            .http
            .get(format!("{root}/api/version"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let text = super::read_capped(resp, 64 << 10).await.ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        v.get("version")?.as_str().map(str::to_string)
    }

    /// Whether a key would travel unencrypted to another machine: plain http to a host that is
    /// not loopback.
    pub fn key_in_clear(&self) -> bool {
        reqwest::Url::parse(&self.base)
            .is_ok_and(|u| u.scheme() == "http" && !super::is_loopback(&u))
    }

    /// Retry transient failures with this policy (default: 3 attempts, 500 ms doubling).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// One attempt at a request, classified for the retry policy.
    async fn attempt(&self, req: &Request, body: &Value) -> Attempt {
        const SERVER: &str = "the OpenAI-compatible server";
        let url = format!("{}/chat/completions", self.shown);
        let mut call = self
            .http
            .post(format!("{}/chat/completions", self.base))
            .json(body);
        if let Some(k) = &self.key {
            call = call.bearer_auth(k);
        }
        let resp = match call.send().await {
            Ok(r) => r,
            Err(e) => return transport_attempt(SERVER, &self.base, e, HINT),
        };
        let status = resp.status();
        let text = match super::read_capped(resp, super::MAX_RESPONSE_BYTES).await {
            Ok(t) => t,
            Err(Some(e)) => return transport_attempt(SERVER, &self.base, e, HINT),
            Err(None) => return Attempt::Done(Err(super::oversized(&url))),
        };
        let v: Option<Value> = serde_json::from_str(&text).ok();
        if !status.is_success() {
            let msg = v
                .as_ref()
                .and_then(|v| v.pointer("/error/message").or_else(|| v.get("error")))
                .and_then(Value::as_str)
                .map_or_else(|| snippet(&text), str::to_string);
            let fail = |e| Attempt::Done(Err(e));
            return match status.as_u16() {
                401 | 403 => fail(Error::Server(format!(
                    "{url} refused the credentials ({msg}); set OPENAI_API_KEY"
                ))),
                404 => fail(Error::ModelNotFound(format!(
                    "model '{}' is not available at {} ({msg}); pick another with --model",
                    req.model, self.shown
                ))),
                400 | 413 if super::is_context_overflow(&msg) => fail(Error::ContextOverflow(msg)),
                code @ (429 | 500..=599) => {
                    Attempt::Retry(Error::Server(format!("HTTP {code} from {url}: {msg}")))
                }
                code => fail(Error::Server(format!("HTTP {code} from {url}: {msg}"))),
            };
        }
        let Some(v) = v else {
            return Attempt::Retry(Error::Server(format!(
                "{url} answered with something that is not JSON ({})",
                snippet(&text)
            )));
        };
        let Some(choice) = v.pointer("/choices/0") else {
            return Attempt::Retry(Error::Server(format!("{url} answered without choices")));
        };
        let content = choice
            .pointer("/message/content")
            .and_then(Value::as_str)
            .unwrap_or("");
        let finish = super::finish_reason(choice.get("finish_reason").and_then(Value::as_str));
        let count = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_u64)
                .map(|n| n.min(u32::MAX as u64) as u32)
        };
        Attempt::Done(Ok(Response {
            text: content.to_string(),
            finish_reason: finish,
            prompt_tokens: count("/usage/prompt_tokens"),
            output_tokens: count("/usage/completion_tokens"),
            server_ms: None,
        }))
    }
}

#[async_trait]
impl LlmBackend for OpenAi {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let messages: Vec<Value> = match &req.prompt {
            Prompt::Chat(ms) => ms
                .iter()
                .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
                .collect(),
            Prompt::Raw(_) => {
                return Err(Error::InvalidInput(
                    "raw ChatML prompts need the Ollama backend; use --rendering chat with --backend openai".into(),
                ));
            }
        };
        let mut body = json!({
            "model": req.model,
            "messages": messages,
            "temperature": req.temperature,
            "max_tokens": req.max_output_tokens,
            "stream": false,
        });
        if !req.stop.is_empty() {
            body["stop"] = json!(req.stop);
        }
        if let Some(seed) = req.seed {
            body["seed"] = json!(seed);
        }
        self.retry.run(|| self.attempt(&req, &body)).await
    }

    fn name(&self) -> &str {
        "openai"
    }

    /// Reachable and accepting the credentials: `GET /models` (a server without that route
    /// answers 404 and still counts as reachable).
    async fn ready(&self) -> Result<(), Error> {
        let mut call = self
            .http
            .get(format!("{}/models", self.base))
            .timeout(Duration::from_secs(5));
        if let Some(k) = &self.key {
            call = call.bearer_auth(k);
        }
        let resp = call.send().await.map_err(|e| {
            super::transport_error("the OpenAI-compatible server", &self.base, e, HINT)
        })?;
        match resp.status().as_u16() {
            200..=299 | 404 => Ok(()),
            401 | 403 => Err(Error::Server(format!(
                "{}/models refused the credentials; set OPENAI_API_KEY",
                self.shown
            ))),
            code => Err(Error::Server(format!(
                "{}/models answered {code}",
                self.shown
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_clear_is_plain_http_to_another_machine() {
        let t = Duration::from_secs(5);
        let at = |u: &str| OpenAi::new(u, Some("k".into()), t).unwrap().key_in_clear();
        assert!(at("http://models.example.com/v1"));
        assert!(at("http://10.1.2.3:8000/v1"));
        assert!(!at("https://models.example.com/v1"));
        assert!(!at("http://127.0.0.1:8000/v1"));
        assert!(!at("http://localhost:8000/v1"));
        assert!(!at("http://[::1]:8000/v1"));
    }

    #[tokio::test]
    async fn ready_means_reachable_with_a_models_route() {
        let server = abridge_test_llm::TestServer::start_with(abridge_test_llm::Options {
            ollama_api: false,
            ..Default::default()
        });
        let t = Duration::from_secs(5);
        let up = OpenAi::new(&format!("{}/v1", server.url()), None, t).unwrap();
        up.ready().await.unwrap();
        // A closed port: not ready, and the error says where it looked.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let down = OpenAi::new(&format!("http://127.0.0.1:{port}/v1"), None, t).unwrap();
        let e = down.ready().await.unwrap_err();
        assert!(matches!(e, Error::Unreachable(_)), "{e:?}");
    }
}
