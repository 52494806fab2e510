//! Embedding backends: texts in, one vector per text out, stamped with the model that made
//! them (vectors of different models are never compared; a model change re-embeds).
//!
//! Ollama's `/api/embed` (batched, `truncate: false` with `num_ctx`, so an over-long input is
//! refused rather than silently cut) and an OpenAI-compatible `/v1/embeddings`. An input the
//! server refuses is named in the error, never dropped: a batch refused as too long is asked
//! again one input at a time to find which. Every answer is checked: one vector per input, one
//! dimension, finite numbers.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Attempt, RetryPolicy, transport_attempt};
use crate::types::Error;
pub use abridge_engine::embedder::{Embedder, Vectors};

/// Check an answer: one vector per input, one dimension, finite numbers. Returns the
/// dimension.
pub fn validate(model: &str, inputs: usize, vectors: &[Vec<f32>]) -> Result<usize, Error> {
    if vectors.len() != inputs {
        return Err(Error::Server(format!(
            "the embedding model {model} answered {} vector(s) for {inputs} input(s)",
            vectors.len()
        )));
    }
    let dim = vectors.first().map_or(0, Vec::len);
    if inputs > 0 && dim == 0 {
        return Err(Error::Server(format!(
            "the embedding model {model} answered empty vectors"
        )));
    }
    if let Some(i) = vectors.iter().position(|v| v.len() != dim) {
        return Err(Error::Server(format!(
            "the embedding model {model} answered vectors of different lengths ({dim} and {} at input {})",
            vectors[i].len(),
            i + 1
        )));
    }
    if let Some(i) = vectors
        .iter()
        .position(|v| v.iter().any(|x| !x.is_finite()))
    {
        return Err(Error::Server(format!(
            "the embedding model {model} answered a vector with a non-finite number for input {}",
            i + 1
        )));
    }
    Ok(dim)
}

/// Which API a [`ServerEmbedder`] speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedApi {
    /// Ollama's `/api/embed`.
    Ollama,
    /// An OpenAI-compatible `/v1/embeddings` (base ending in `/v1`).
    OpenAi,
}

/// An embedding model on a server.
pub struct ServerEmbedder {
    api: EmbedApi,
    http: reqwest::Client,
    base: String,
    shown: String,
    key: Option<String>,
    model: String,
    num_ctx: u32,
    batch: usize,
    retry: RetryPolicy,
}

impl ServerEmbedder {
    /// A client for `model` at `base`, sending at most `batch` texts per request and (Ollama)
    /// a context of `num_ctx` tokens per input.
    pub fn new(
        api: EmbedApi,
        base: &str,
        key: Option<String>,
        model: &str,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let what = match api {
            EmbedApi::Ollama => "the embedding server URL",
            EmbedApi::OpenAi => "OPENAI_BASE_URL",
        };
        let (http, base, shown) = super::server_client(base, what, timeout, |b| match api {
            EmbedApi::Ollama => b.no_proxy(),
            EmbedApi::OpenAi => b,
        })?;
        Ok(ServerEmbedder {
            api,
            http,
            base,
            shown,
            key,
            model: model.to_string(),
            num_ctx: 8192,
            batch: 64,
            retry: RetryPolicy::default(),
        })
    }

    /// Texts per request (at least 1).
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// The context each input may fill (Ollama's `num_ctx`).
    pub fn with_num_ctx(mut self, num_ctx: u32) -> Self {
        self.num_ctx = num_ctx.max(1);
        self
    }

    /// Retry transient failures with this policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    fn server(&self) -> &'static str {
        match self.api {
            EmbedApi::Ollama => "Ollama",
            EmbedApi::OpenAi => "the OpenAI-compatible server",
        }
    }

    /// One request for `texts`, retried per the policy.
    async fn request(&self, texts: &[String]) -> Result<(Vec<Vec<f32>>, Option<u64>), Error> {
        let (path, body) = match self.api {
            EmbedApi::Ollama => (
                "/api/embed",
                json!({"model": self.model, "input": texts, "truncate": false,
                       "options": {"num_ctx": self.num_ctx}}),
            ),
            EmbedApi::OpenAi => (
                "/embeddings",
                json!({"model": self.model, "input": texts, "encoding_format": "float"}),
            ),
        };
        self.retry.run(|| self.attempt(path, &body)).await
    }

    async fn attempt(&self, path: &str, body: &Value) -> Attempt<(Vec<Vec<f32>>, Option<u64>)> {
        const HINT: &str = "check the embedding server's URL, or use the offline embedder";
        let url = format!("{}{path}", self.shown);
        let mut call = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(k) = &self.key {
            call = call.bearer_auth(k);
        }
        let resp = match call.send().await {
            Ok(r) => r,
            Err(e) => return transport_attempt(self.server(), &self.base, e, HINT),
        };
        let status = resp.status();
        let text = match super::read_capped(resp, super::MAX_RESPONSE_BYTES * 8).await {
            Ok(t) => t,
            Err(Some(e)) => return transport_attempt(self.server(), &self.base, e, HINT),
            Err(None) => return Attempt::Done(Err(super::oversized(&url))),
        };
        let v: Option<Value> = serde_json::from_str(&text).ok();
        if !status.is_success() {
            let msg = v
                .as_ref()
                .and_then(|v| {
                    v.get("error")
                        .and_then(|e| e.as_str().or_else(|| e.get("message")?.as_str()))
                })
                .map(str::to_string)
                .unwrap_or_else(|| super::ollama::snippet(&text));
            if matches!(status.as_u16(), 401 | 403) {
                let fix = match self.api {
                    EmbedApi::OpenAi => "set OPENAI_API_KEY",
                    EmbedApi::Ollama => "check the credentials in the server's URL",
                };
                return Attempt::Done(Err(Error::Server(format!(
                    "{url} refused the credentials ({msg}); {fix}"
                ))));
            }
            return super::status_attempt(status.as_u16(), &url, msg, || {
                Error::ModelNotFound(format!(
                    "the embedding model '{}' is not available at {} — pull it ('ollama pull {}') or choose another",
                    self.model, self.shown, self.model
                ))
            });
        }
        let Some(v) = v else {
            return Attempt::Retry(Error::Server(format!(
                "{url} answered with something that is not JSON ({})",
                super::ollama::snippet(&text)
            )));
        };
        let floats = |x: &Value| -> Option<Vec<f32>> {
            x.as_array()?
                .iter()
                .map(|n| n.as_f64().map(|f| f as f32))
                .collect()
        };
        let (vectors, tokens) = match self.api {
            EmbedApi::Ollama => (
                v.get("embeddings")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(floats).collect::<Option<Vec<_>>>()),
                v.get("prompt_eval_count").and_then(Value::as_u64),
            ),
            EmbedApi::OpenAi => (
                v.get("data").and_then(Value::as_array).and_then(|a| {
                    // Placed by their index, whatever order they come in.
                    let mut out = vec![None; a.len()];
                    for d in a {
                        let i = d.get("index")?.as_u64()? as usize;
                        *out.get_mut(i)? = Some(floats(d.get("embedding")?)?);
                    }
                    out.into_iter().collect::<Option<Vec<_>>>()
                }),
                v.pointer("/usage/prompt_tokens").and_then(Value::as_u64),
            ),
        };
        match vectors {
            Some(vs) => Attempt::Done(Ok((vs, tokens))),
            None => Attempt::Retry(Error::Server(format!(
                "{url} answered without embeddings; is it an embedding model's server?"
            ))),
        }
    }
}

#[async_trait]
impl Embedder for ServerEmbedder {
    fn model(&self) -> String {
        let api = match self.api {
            EmbedApi::Ollama => "ollama",
            EmbedApi::OpenAi => "openai",
        };
        format!("{api}:{}", self.model)
    }

    async fn embed(&self, texts: &[String]) -> Result<Vectors, Error> {
        let mut all = Vec::with_capacity(texts.len());
        let mut tokens = Some(0u64);
        for (b, batch) in texts.chunks(self.batch).enumerate() {
            let got = match self.request(batch).await {
                Err(Error::ContextOverflow(msg)) => {
                    // Which input? Ask again one at a time; the first refused is named.
                    let first = b * self.batch;
                    let mut out = Vec::with_capacity(batch.len());
                    let mut used = Some(0u64);
                    for (i, t) in batch.iter().enumerate() {
                        match self.request(std::slice::from_ref(t)).await {
                            Ok((mut v, n)) => {
                                out.append(&mut v);
                                used = used.zip(n).map(|(a, b)| a + b);
                            }
                            Err(Error::ContextOverflow(_)) => {
                                return Err(Error::ContextOverflow(format!(
                                    "input {} of {} ({} characters) is longer than the embedding model {} takes: {msg}",
                                    first + i + 1,
                                    texts.len(),
                                    t.chars().count(),
                                    self.model
                                )));
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    (out, used)
                }
                other => other?,
            };
            let (mut v, n) = got;
            validate(&self.model(), batch.len(), &v)?;
            all.append(&mut v);
            tokens = tokens.zip(n).map(|(a, b)| a + b);
        }
        Ok(Vectors {
            model: self.model(),
            dim: validate(&self.model(), texts.len(), &all)?,
            vectors: all,
            tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked() {
        assert!(validate("m", 2, &[vec![1.0, 0.0]]).is_err());
        assert!(validate("m", 2, &[vec![1.0, 0.0], vec![1.0]]).is_err());
        assert!(validate("m", 1, &[vec![f32::NAN, 0.0]]).is_err());
        assert!(validate("m", 1, &[vec![]]).is_err());
        assert_eq!(
            validate("m", 2, &[vec![1.0, 0.0], vec![0.0, 1.0]]).unwrap(),
            2
        );
        assert_eq!(validate("m", 0, &[]).unwrap(), 0);
    }
}
