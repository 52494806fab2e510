//! Turning texts into vectors, behind one trait ([`Embedder`]); the memory import calls it.
//! The server embedders live in the `abridge-backend` crate.

use async_trait::async_trait;

use crate::types::Error;

/// Vectors for a batch of texts.
#[derive(Clone, Debug, PartialEq)]
pub struct Vectors {
    /// The model that made them, as stamped on stored vectors (`ollama:nomic-embed-text`).
    pub model: String,
    /// Their dimension.
    pub dim: usize,
    /// One per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Input tokens, when the server says.
    pub tokens: Option<u64>,
}

/// Something that turns texts into vectors.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// The model name stamped on its vectors.
    fn model(&self) -> String;
    /// One vector per text, in order; an empty `texts` is an empty answer without a call.
    async fn embed(&self, texts: &[String]) -> Result<Vectors, Error>;
}
