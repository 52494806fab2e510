//! The WIT types, re-exported under stable names for embedders.

pub use crate::bindings::abridge::engine::llm::{FinishReason, Prompt, Request, Response};
pub use crate::bindings::abridge::engine::log::Level;
pub use crate::bindings::abridge::engine::memory_store::{
    Centroid, ClusterSummary, Embedding, Filter as MemoryFilter, Hit, HitKind, MemberSet, Memory,
    NewMemory, Scope, StoredMemory, SummaryWrite as ClusterSummaryWrite,
};
pub use crate::bindings::abridge::engine::store::{
    CachedAnswer, CalibrationTotals as Calibration, Compaction, Episode, EpisodeRange,
    FailureMarker, IdentifierKind, LedgerEntry, NewEpisode, SessionStats, SummaryRow, SummaryWrite,
    TermMatch, TermMatches,
};
pub use crate::bindings::abridge::engine::types::{
    Error, Message, Path as PlanPath, PlanReport, Role,
};
pub use crate::bindings::exports::abridge::engine::memories::{
    ClusterAction, ClusterOutcome, Forgotten, MemoryConfig, MemoryIn, Recalled, Remembered,
};
pub use crate::bindings::exports::abridge::engine::summarizer::{
    Config, ContextRequest, ContextWindow, Engine, Expansion, Fact, FactEnd, FactValue, FreshState,
    FreshnessReport, Mode, Outcome, Posted, PostedMessage, Rendering, SearchHit, SearchPage,
};
pub use crate::bindings::exports::abridge::engine::transcripts::{
    Batch as ParseBatch, ConversationPart, Format as TranscriptFormat, ParseError, ParseOptions,
    ParsedEpisode,
};

impl Role {
    /// Lower-case wire name, as chat APIs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parse a chat API role name (`developer` counts as `system`, `function` as `tool`).
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" | "developer" => Role::System,
            "user" | "human" => Role::User,
            "assistant" | "model" | "ai" => Role::Assistant,
            "tool" | "function" => Role::Tool,
            _ => return None,
        })
    }
}

impl Default for Config {
    /// The documented defaults, as the component exports them (`default-config`; see
    /// [`crate::defaults`]): LLM engine, chat rendering, `qwen2.5:3b`, a 4096-token context
    /// and so on.
    fn default() -> Self {
        crate::defaults::defaults().config.clone()
    }
}

impl Default for ContextRequest {
    /// The documented defaults, as the component exports them (`default-config`).
    fn default() -> Self {
        crate::defaults::defaults().context.clone()
    }
}

impl Mode {
    /// The lower-case name (`eager`, `idle`, `window`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Idle => "idle",
            Mode::Window => "window",
        }
    }

    /// The mode a name stands for.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "eager" => Some(Mode::Eager),
            "idle" => Some(Mode::Idle),
            "window" => Some(Mode::Window),
            _ => None,
        }
    }
}

/// A one-line description of an engine error, including how to fix it where the payload
/// says so.
pub fn describe(e: &Error) -> String {
    match e {
        Error::Unreachable(m) => m.clone(),
        Error::ModelNotFound(m) => m.clone(),
        Error::Timeout(m) => format!("timed out: {m}"),
        Error::ContextOverflow(m) => format!("the prompt did not fit the model's context: {m}"),
        Error::Server(m) => format!("the model server failed: {m}"),
        Error::RejectedOutput(m) => {
            format!("the summary was rejected and nothing was written: {m}")
        }
        Error::Storage(m) => format!("storage error: {m}"),
        Error::Conflict(m) => format!(
            "another process changed the session at the same time, and retrying did not settle it: {m}"
        ),
        Error::InvalidInput(m) => m.clone(),
    }
}

/// A configuration as JSON (snake-case keys, as in `abridge.toml`).
pub fn config_to_json(c: &Config) -> serde_json::Value {
    serde_json::json!({
        "engine": match c.engine { Engine::Llm => "llm", Engine::Extractive => "extractive" },
        "rendering": match c.rendering { Rendering::Chat => "chat", Rendering::Chatml => "chatml" },
        "model": c.model, "context_length": c.context_length,
        "max_output_tokens": c.max_output_tokens, "temperature": c.temperature,
        "threshold_tokens": c.threshold_tokens, "min_episodes_since": c.min_episodes_since,
        "max_summary_tokens": c.max_summary_tokens, "max_skipped_percent": c.max_skipped_percent,
        "chunk_tokens": c.chunk_tokens,
        "mode": c.mode.as_str(),
        "quiescence_secs": c.quiescence_secs, "provisional_tokens": c.provisional_tokens,
        "max_attempts": c.max_attempts, "retry_base_secs": c.retry_base_secs,
        "max_backlog_tokens": c.max_backlog_tokens,
        "summary_budget_tokens": c.summary_budget_tokens,
        "ledger_tokens": c.ledger_tokens, "window_messages": c.window_messages,
        "focus": c.focus,
    })
}

/// A configuration from JSON written by [`config_to_json`]; missing keys take the defaults.
pub fn config_from_json(v: &serde_json::Value) -> Config {
    let d = Config::default();
    let u = |k: &str, d: u32| v[k].as_u64().map_or(d, |x| x as u32);
    Config {
        engine: if v["engine"] == "extractive" {
            Engine::Extractive
        } else {
            Engine::Llm
        },
        rendering: if v["rendering"] == "chatml" {
            Rendering::Chatml
        } else {
            Rendering::Chat
        },
        model: v["model"].as_str().unwrap_or(&d.model).to_string(),
        context_length: u("context_length", d.context_length),
        max_output_tokens: u("max_output_tokens", d.max_output_tokens),
        temperature: v["temperature"]
            .as_f64()
            .map_or(d.temperature, |t| t as f32),
        threshold_tokens: u("threshold_tokens", d.threshold_tokens),
        min_episodes_since: u("min_episodes_since", d.min_episodes_since),
        max_summary_tokens: u("max_summary_tokens", d.max_summary_tokens),
        max_skipped_percent: u("max_skipped_percent", d.max_skipped_percent),
        chunk_tokens: u("chunk_tokens", d.chunk_tokens),
        mode: v["mode"]
            .as_str()
            .and_then(Mode::parse)
            .unwrap_or(Mode::Eager),
        quiescence_secs: u("quiescence_secs", d.quiescence_secs),
        provisional_tokens: u("provisional_tokens", d.provisional_tokens),
        max_attempts: u("max_attempts", d.max_attempts),
        retry_base_secs: u("retry_base_secs", d.retry_base_secs),
        max_backlog_tokens: u("max_backlog_tokens", d.max_backlog_tokens),
        summary_budget_tokens: u("summary_budget_tokens", d.summary_budget_tokens),
        ledger_tokens: u("ledger_tokens", d.ledger_tokens),
        window_messages: u("window_messages", d.window_messages),
        focus: v["focus"].as_str().unwrap_or("").to_string(),
    }
}

impl Prompt {
    /// The prompt as one text: a chat's message contents joined by newlines, or the raw
    /// prompt (what a scripted model or a token count reads).
    pub fn text(&self) -> String {
        match self {
            Prompt::Chat(ms) => ms
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            Prompt::Raw(s) => s.clone(),
        }
    }
}

impl Default for MemoryConfig {
    /// The documented defaults, as the component exports them (`default-memory-config`; see
    /// [`crate::defaults`]): the offline lexical embedder, join a cluster at cosine 0.35, and
    /// so on.
    fn default() -> Self {
        crate::defaults::defaults().memory.clone()
    }
}

impl Default for NewEpisode {
    /// A user's message with nothing in it: an embedder names what it has and leaves the rest
    /// (`NewEpisode { content, source_key, ..Default::default() }`), so a field the WIT adds
    /// later (optional, or filled in by the engine) does not touch it.
    fn default() -> Self {
        NewEpisode {
            role: Role::User,
            content: String::new(),
            timestamp_ms: None,
            source_key: String::new(),
            tokens: 0,
            speaker: None,
            terms: String::new(),
            item: None,
        }
    }
}

impl Default for MemoryFilter {
    /// Every memory of the tenant.
    fn default() -> Self {
        MemoryFilter {
            user: None,
            project: None,
            environment: None,
            kind: None,
            key: None,
            exact: false,
        }
    }
}

impl IdentifierKind {
    /// The lower-case name (`path`, `url`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            IdentifierKind::Path => "path",
            IdentifierKind::Url => "url",
            IdentifierKind::Command => "command",
            IdentifierKind::Code => "code",
            IdentifierKind::Number => "number",
            IdentifierKind::Version => "version",
            IdentifierKind::Date => "date",
            IdentifierKind::Email => "email",
            IdentifierKind::Ticket => "ticket",
            IdentifierKind::Name => "name",
            IdentifierKind::Request => "request",
            IdentifierKind::Created => "created",
            IdentifierKind::Edited => "edited",
            IdentifierKind::Read => "read",
            IdentifierKind::Ran => "ran",
            IdentifierKind::Failed => "failed",
            IdentifierKind::Todo => "todo",
            IdentifierKind::Fact => "fact",
        }
    }
}

impl TranscriptFormat {
    /// Parse a `--format` value (`auto` is `None`).
    pub fn parse(s: &str) -> Result<Option<TranscriptFormat>, String> {
        Ok(Some(match s {
            "auto" => return Ok(None),
            "jsonl" => TranscriptFormat::Jsonl,
            "openai" => TranscriptFormat::Openai,
            "claude-code" => TranscriptFormat::ClaudeCode,
            "chatgpt" => TranscriptFormat::Chatgpt,
            "codex" => TranscriptFormat::Codex,
            other => {
                return Err(format!(
                    "unknown format '{other}'; use auto, jsonl, openai, claude-code, chatgpt or codex"
                ));
            }
        }))
    }
}

impl std::fmt::Display for TranscriptFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TranscriptFormat::Jsonl => "jsonl",
            TranscriptFormat::Openai => "openai",
            TranscriptFormat::ClaudeCode => "claude-code",
            TranscriptFormat::Chatgpt => "chatgpt",
            TranscriptFormat::Codex => "codex",
        })
    }
}
