//! Plain Rust mirrors of the WIT types, so the logic modules test natively without bindgen.

/// Who produced a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Instructions to the model.
    System,
    /// The human side.
    User,
    /// The model side.
    Assistant,
    /// Tool output.
    Tool,
}

impl Role {
    /// The label used in rendered transcripts and ChatML.
    pub fn label(self) -> &'static str {
        match self {
            Role::System => "System",
            Role::User => "User",
            Role::Assistant => "Assistant",
            Role::Tool => "Tool",
        }
    }

    /// The lower-case wire name (`user`, `assistant`, …).
    pub fn wire(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One chat message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Text.
    pub content: String,
    /// The speaker's name, when the transcript gave one (not sent to models as a field).
    pub speaker: Option<String>,
    /// When it was said, ms since the epoch, if known (not sent to models as a field; the
    /// offline summary dates its lines and resolves relative dates with it).
    pub timestamp_ms: Option<i64>,
}

impl Message {
    /// Shorthand constructor.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            speaker: None,
            timestamp_ms: None,
        }
    }

    /// The same message, said at `timestamp_ms` (if known).
    pub fn at(mut self, timestamp_ms: Option<i64>) -> Self {
        self.timestamp_ms = timestamp_ms;
        self
    }

    /// The same message, said by `speaker` (if any).
    pub fn by(mut self, speaker: Option<String>) -> Self {
        self.speaker = speaker;
        self
    }

    /// Who said it, for attribution: the speaker's name, else the role's label.
    pub fn who(&self) -> &str {
        self.speaker.as_deref().unwrap_or(self.role.label())
    }
}

/// An actionable failure (mirrors the WIT `error` variant).
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// Model server unreachable.
    Unreachable(String),
    /// Model not available.
    ModelNotFound(String),
    /// Time limit hit.
    Timeout(String),
    /// Prompt refused as too long.
    ContextOverflow(String),
    /// Error status or unparseable answer.
    Server(String),
    /// Output failed the quality gate.
    RejectedOutput(String),
    /// Store failure.
    Storage(String),
    /// A concurrent writer changed the session first; re-read and retry.
    Conflict(String),
    /// Unusable input.
    InvalidInput(String),
}

/// A stored episode.
#[derive(Clone, Debug, PartialEq)]
pub struct Episode {
    /// Per-session id, 1-based.
    pub id: u64,
    /// Speaker.
    pub role: Role,
    /// Text.
    pub content: String,
    /// Estimated tokens of `content`.
    pub tokens: u32,
    /// When it was said, ms since the epoch, if known.
    pub timestamp_ms: Option<i64>,
    /// The speaker's name, if the transcript gave one.
    pub speaker: Option<String>,
    /// Sum of `tokens` over the session's episodes 1..=`id` (kept by the store).
    pub tokens_through: u64,
}

/// Why automatic refreshes are held back (mirrors the WIT `failure-marker`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureMarker {
    /// Consecutive failed refreshes.
    pub failures: u32,
    /// The last failure's reason.
    pub last_error: String,
    /// No automatic refresh before this, ms since the epoch.
    pub retry_after_ms: u64,
    /// When the last failure happened.
    pub failed_ms: u64,
}

/// Session figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Episodes stored.
    pub episodes: u64,
    /// Sum of estimated tokens.
    pub total_tokens: u64,
    /// Newest episode id (0 if none).
    pub last_episode: u64,
}

/// A summary row.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    /// Row id.
    pub id: u64,
    /// First covered episode.
    pub first_episode: u64,
    /// Last covered episode.
    pub last_episode: u64,
    /// Text.
    pub content: String,
    /// Estimated tokens of `content`.
    pub tokens: u32,
    /// Model-reported prompt tokens of the call that wrote `content` (0 if none).
    pub prompt_tokens: u32,
    /// Model-reported output tokens of that call (0 if none).
    pub output_tokens: u32,
    /// Model name or `extractive`.
    pub model: String,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// Last content change, ms since the epoch.
    pub updated_ms: u64,
    /// Episode ranges the content does not reflect (failed map chunks).
    pub skipped: Vec<(u64, u64)>,
    /// 0 for episode summaries; n + 1 for an "earlier" row compacting rows of level n.
    pub level: u32,
    /// The row that compacted this one (it then left the active chain).
    pub compacted_into: Option<u64>,
    /// The facts ledger.
    pub ledger: crate::ledger::Ledger,
}

impl SummaryRow {
    /// A level-0 row with no ledger (tests and defaults).
    #[cfg(test)]
    pub fn plain(id: u64, first: u64, last: u64, content: &str, tokens: u32) -> Self {
        SummaryRow {
            id,
            first_episode: first,
            last_episode: last,
            content: content.into(),
            tokens,
            prompt_tokens: 0,
            output_tokens: 0,
            model: "m".into(),
            created_ms: 0,
            updated_ms: 0,
            skipped: vec![],
            level: 0,
            compacted_into: None,
            ledger: Default::default(),
        }
    }
}

/// A summary write request.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryWrite {
    /// Row to replace, or `None` for a new row.
    pub replaces: Option<u64>,
    /// First covered episode.
    pub first_episode: u64,
    /// Last covered episode.
    pub last_episode: u64,
    /// Cleaned text.
    pub content: String,
    /// Estimated tokens of `content`.
    pub tokens: u32,
    /// Model-reported prompt tokens (0 if none).
    pub prompt_tokens: u32,
    /// Model-reported output tokens (0 if none).
    pub output_tokens: u32,
    /// Model name or `extractive`.
    pub model: String,
    /// Time of the write.
    pub now_ms: u64,
    /// Episode ranges the content does not reflect.
    pub skipped: Vec<(u64, u64)>,
    /// The facts ledger.
    pub ledger: crate::ledger::Ledger,
}

/// The oldest active rows folded into one "earlier" row (mirrors the WIT `compaction`).
#[derive(Clone, Debug, PartialEq)]
pub struct Compaction {
    /// Rows folded, oldest first.
    pub rows: Vec<u64>,
    /// Text of the new row.
    pub content: String,
    /// Estimated tokens of `content`.
    pub tokens: u32,
    /// Model-reported prompt tokens (0 if none).
    pub prompt_tokens: u32,
    /// Model-reported output tokens (0 if none).
    pub output_tokens: u32,
    /// Model name or `extractive`.
    pub model: String,
    /// Time of the write.
    pub now_ms: u64,
    /// Episode ranges the content does not reflect.
    pub skipped: Vec<(u64, u64)>,
    /// The merged ledger.
    pub ledger: crate::ledger::Ledger,
}

/// How a prompt is sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Chat messages.
    Chat(Vec<Message>),
    /// A rendered raw prompt.
    Raw(String),
}

/// A model request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Model name.
    pub model: String,
    /// Prompt.
    pub prompt: Prompt,
    /// Temperature.
    pub temperature: f32,
    /// Output limit.
    pub max_output_tokens: u32,
    /// Context window.
    pub context_length: u32,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Partial-cache key: the host caches a complete answer under it as it arrives.
    pub cache_key: Option<String>,
    /// Sampling seed, `None` for the server's default.
    pub seed: Option<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Finished normally.
    Stop,
    /// Cut off by a limit.
    Length,
    /// Something else.
    Other,
}

/// A model answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// Raw text.
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
    /// Reported prompt tokens.
    pub prompt_tokens: Option<u32>,
    /// Reported output tokens.
    pub output_tokens: Option<u32>,
}

/// Log severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Debug detail.
    Debug,
    /// Progress.
    Info,
    /// Needs attention.
    Warn,
}

/// A model answer kept in the partial cache, with what producing it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Cached {
    /// The raw answer text.
    pub text: String,
    /// Prompt tokens the model reported.
    pub prompt_tokens: u32,
    /// Output tokens the model reported.
    pub output_tokens: u32,
}
