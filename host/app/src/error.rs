//! The app layer's one error type: a kind each front end maps to its own code (an exit status
//! for the CLI, an HTTP status for the server), a message that says what happened, and an
//! optional hint the front end may phrase for its caller.

use crate::runtime::CallError;
use crate::transcript::TranscriptError;
use crate::types::{Error as EngineError, describe};

/// What went wrong, as far as a caller can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request or input is malformed (bad JSON, an invalid id, a bad transcript).
    InvalidInput,
    /// The input is well-formed but cannot be processed (no messages in it).
    Unprocessable,
    /// No such session, job or token — also what another tenant's id looks like.
    NotFound,
    /// The request conflicts with the current state (a job already finished).
    Conflict,
    /// The body or input is over a size limit.
    TooLarge,
    /// No valid credentials.
    Unauthenticated,
    /// Valid credentials that may not do this (a read-only token writing).
    Forbidden,
    /// A per-tenant limit was hit; retry after the given seconds.
    RateLimited {
        /// Seconds until a retry may succeed.
        retry_after_secs: u32,
    },
    /// The tenant's monthly model budget is spent: nothing more is summarized until it
    /// resets.
    QuotaExhausted {
        /// Spent this month (tokens, or money in the prices' currency), rounded down.
        spent: u64,
        /// The limit, in the same unit.
        limit: u64,
        /// When the budget resets, ms since the epoch (the first of next month, UTC).
        resets_at_ms: u64,
    },
    /// The model or its server failed.
    Model,
    /// The database failed.
    Storage,
    /// The service is shutting down or a dependency is down.
    Unavailable,
    /// A bug or a trap in the engine.
    Internal,
}

impl ErrorKind {
    /// A stable name for the kind (the HTTP error `code`).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unprocessable => "unprocessable",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::RateLimited { .. } => "rate_limited",
            ErrorKind::QuotaExhausted { .. } => "quota_exhausted",
            ErrorKind::Model => "model_failed",
            ErrorKind::Storage => "storage_failed",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// An app-layer failure.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What happened, without front-end specific advice.
    pub message: String,
    /// How to fix it, when the app layer knows (front ends may replace it with their own).
    pub hint: Option<String>,
}

impl AppError {
    /// A failure of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AppError {
            kind,
            message: message.into(),
            hint: None,
        }
    }

    /// The same failure with a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Bad input.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// A database failure.
    pub fn storage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Storage, message)
    }

    /// A missing (or foreign) thing.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
}

impl From<EngineError> for AppError {
    fn from(e: EngineError) -> Self {
        let kind = match &e {
            EngineError::InvalidInput(_) => ErrorKind::InvalidInput,
            EngineError::Storage(_) => ErrorKind::Storage,
            EngineError::Conflict(_) => ErrorKind::Conflict,
            _ => ErrorKind::Model,
        };
        AppError::new(kind, describe(&e))
    }
}

impl From<CallError> for AppError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Engine(e) => e.into(),
            CallError::Cancelled => AppError::new(ErrorKind::Model, e.to_string()),
            CallError::Host(_) => AppError::new(ErrorKind::Internal, format!("{e:#}")),
        }
    }
}

impl From<TranscriptError> for AppError {
    fn from(e: TranscriptError) -> Self {
        let kind = match &e {
            TranscriptError::TooLarge { .. } | TranscriptError::TooManyEpisodes { .. } => {
                ErrorKind::TooLarge
            }
            TranscriptError::Empty { .. } | TranscriptError::EmptyFile { .. } => {
                ErrorKind::Unprocessable
            }
            TranscriptError::Sandbox { .. } => ErrorKind::Unprocessable,
            _ => ErrorKind::InvalidInput,
        };
        AppError::new(kind, e.to_string())
    }
}

/// The app layer's result.
pub type AppResult<T> = Result<T, AppError>;
