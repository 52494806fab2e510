//! Opening the model backend that settings ask for, once for every front end: the command
//! line, `abridge serve` and embedders all call [`open`], so "auto" falls back the same way,
//! a missing model is named the same way, and Ollama's OpenAI-compatible API (which cannot set
//! the context window) is refused the same way everywhere.

use std::sync::Arc;
use std::time::Duration;

use crate::types::{Config, Engine, Error, Rendering};
use crate::{LlmBackend, NoModel, Ollama, OpenAi, RetryPolicy, redact_url};

/// Which backend the settings ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Ollama if it answers, else the extractive summarizer (announced in a note).
    Auto,
    /// Ollama's native API, required to answer and to have the model.
    Ollama,
    /// An OpenAI-compatible server.
    Openai,
    /// Sentence selection, no model.
    Extractive,
}

/// What opening a backend needs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The backend asked for.
    pub choice: Choice,
    /// The model's name (checked against Ollama's list).
    pub model: String,
    /// Ollama's base URL.
    pub ollama_url: String,
    /// The OpenAI-compatible base URL (ending in `/v1`).
    pub openai_base_url: String,
    /// The OpenAI-compatible server's API key.
    pub openai_api_key: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Retries of Ollama requests.
    pub retry: RetryPolicy,
}

/// An opened backend: its client, the engine it implies and its name for output.
#[derive(Clone)]
pub struct Opened {
    /// The client ([`NoModel`] for the extractive engine).
    pub llm: Arc<dyn LlmBackend>,
    /// The engine the summaries are made with.
    pub engine: Engine,
    /// `ollama`, `openai`, `extractive` (or `none`, see [`Opened::none`]).
    pub name: &'static str,
    /// What the caller should tell its user (a fallback taken, a key sent in clear).
    pub notes: Vec<String>,
}

impl Opened {
    /// No model: for work that only reads or administers.
    pub fn none() -> Opened {
        Opened {
            llm: Arc::new(NoModel),
            engine: Engine::Extractive,
            name: "none",
            notes: Vec::new(),
        }
    }

    fn extractive(notes: Vec<String>) -> Opened {
        Opened {
            llm: Arc::new(NoModel),
            engine: Engine::Extractive,
            name: "extractive",
            notes,
        }
    }

    /// The engine configuration for this backend: `base` with the engine it implies, and
    /// chat rendering for an OpenAI-compatible server (it has no raw-prompt endpoint).
    pub fn config(&self, base: &Config) -> Config {
        let mut c = base.clone();
        c.engine = self.engine;
        if self.name == "openai" {
            c.rendering = Rendering::Chat;
        }
        c
    }

    /// The model name summaries record: the configured model, or `extractive`.
    pub fn model_name(&self, cfg: &Config) -> String {
        if self.engine == Engine::Extractive {
            "extractive".to_string()
        } else {
            cfg.model.clone()
        }
    }
}

/// Open the backend `s` asks for. Errors say how to fix them; an `InvalidInput` error is a
/// setting to change, any other a model server that does not serve.
pub async fn open(s: &Settings) -> Result<Opened, Error> {
    let ollama = || Ollama::new(&s.ollama_url, s.timeout).map(|o| o.with_retry(s.retry));
    let checked = |o: Ollama| async move {
        o.probe().await?;
        if !o.has_model(&s.model).await? {
            return Err(Error::ModelNotFound(format!(
                "model '{}' is not available on the Ollama server at {} — run 'ollama pull {}', pick another with --model/EXTRACTION_MODEL, or pass --backend extractive",
                s.model,
                redact_url(&s.ollama_url),
                s.model
            )));
        }
        Ok(Opened {
            llm: Arc::new(o),
            engine: Engine::Llm,
            name: "ollama",
            notes: Vec::new(),
        })
    };
    match s.choice {
        Choice::Extractive => Ok(Opened::extractive(Vec::new())),
        Choice::Ollama => checked(ollama()?).await,
        Choice::Openai => {
            let o = OpenAi::new(&s.openai_base_url, s.openai_api_key.clone(), s.timeout)?;
            if let Some(version) = o.ollama_behind().await {
                let root = s.openai_base_url.trim_end_matches("/v1");
                return Err(Error::InvalidInput(format!(
                    "{} is Ollama {version}'s OpenAI-compatible API, which cannot set the context window (num_ctx): Ollama would silently cut every prompt to its default window and the summaries would skip the real content — use --backend ollama --url {}",
                    redact_url(&s.openai_base_url),
                    redact_url(root)
                )));
            }
            let mut notes = Vec::new();
            if s.openai_api_key.is_some() && o.key_in_clear() {
                notes.push(format!(
                    "warning: the API key is sent in clear text to {} (plain http to another machine) — use an https:// URL",
                    redact_url(&s.openai_base_url)
                ));
            }
            Ok(Opened {
                llm: Arc::new(o),
                engine: Engine::Llm,
                name: "openai",
                notes,
            })
        }
        Choice::Auto => {
            let o = ollama()?;
            match o.probe().await {
                Ok(_) => checked(o).await,
                Err(Error::Unreachable(_)) | Err(Error::Timeout(_)) => {
                    Ok(Opened::extractive(vec![format!(
                        "Ollama at {} is not reachable, so the extractive summarizer (sentence selection, no model) is used — start Ollama with 'ollama serve', or pass --backend ollama to require it",
                        redact_url(&s.ollama_url)
                    )]))
                }
                Err(e) => Err(e),
            }
        }
    }
}
