//! Coding agents' lifecycle hooks (`abridge hook`): what a hook payload asks for and how it is
//! answered. A Claude Code or Codex command hook gets one JSON object on standard input
//! (`session_id`, `transcript_path` — Codex's rollout file, or null —, `cwd`,
//! `hook_event_name`, and per event `source`, `trigger`, `reason`, …); both agents read the
//! same answer. `SessionStart` (startup, resume, clear, compact) answers with the
//! session's context as additional context for the model; `PreCompact`, `Stop` and
//! `SessionEnd` import the transcript's new lines (the same incremental import as `watch`:
//! stored offsets, whole lines) and bring the summary up to date within the hook's budget —
//! what is not done stays queued for the next hook, `watch` or a worker. Front ends only read
//! stdin and print what this module answers.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{AppError, AppResult, Scoped};
use crate::sources::{Watched, WatchedFile};
use crate::watch::Followed;

/// Largest payload read (Claude Code's are a few hundred bytes).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Claude Code caps a hook's additional context at 10,000 characters; the context is kept
/// under this many.
pub const MAX_CONTEXT_CHARS: usize = 9_500;

/// A hook payload, as Claude Code and Codex send it (unknown fields are ignored).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Payload {
    /// The agent's session id (a Claude Code transcript's `sessionId`).
    pub session_id: Option<String>,
    /// The transcript file (Codex may send null before its rollout exists).
    pub transcript_path: Option<PathBuf>,
    /// The project directory.
    pub cwd: Option<String>,
    /// `SessionStart`, `PreCompact`, `Stop`, `SessionEnd`, …
    pub hook_event_name: String,
    /// SessionStart: `startup`, `resume`, `clear` or `compact`.
    pub source: Option<String>,
    /// PreCompact: `manual` or `auto`.
    pub trigger: Option<String>,
    /// SessionEnd: why.
    pub reason: Option<String>,
}

/// What a hook event asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Print the session's context for the model (SessionStart).
    Context,
    /// Import the transcript's new lines and summarize what the budget allows.
    Import,
    /// Nothing abridge acts on.
    Nothing,
}

impl Payload {
    /// Parse a payload; an error says what is wrong (the hook then exits non-zero without
    /// blocking the agent).
    pub fn parse(bytes: &[u8]) -> AppResult<Payload> {
        if bytes.len() > MAX_PAYLOAD {
            return Err(AppError::invalid(format!(
                "the hook payload is over {MAX_PAYLOAD} bytes; abridge hook reads the JSON object Claude Code sends on standard input"
            )));
        }
        let p: Payload = serde_json::from_slice(bytes).map_err(|e| {
            AppError::invalid(format!("the hook payload is not the JSON object a hook receives ({e})"))
                .hint("run abridge hook from a Claude Code hook (abridge setup claude-code installs them)")
        })?;
        if p.hook_event_name.trim().is_empty() {
            return Err(AppError::invalid("the hook payload has no hook_event_name"));
        }
        Ok(p)
    }

    /// What the event asks for.
    pub fn ask(&self) -> Ask {
        match self.hook_event_name.as_str() {
            "SessionStart" => Ask::Context,
            "PreCompact" | "PostCompact" | "Stop" | "SubagentStop" | "SessionEnd"
            | "UserPromptSubmit" => Ask::Import,
            _ => Ask::Nothing,
        }
    }

    /// The session the payload names, as abridge names it (a Claude Code session is its id).
    pub fn session(&self) -> Option<String> {
        self.session_id
            .as_deref()
            .and_then(crate::text::session_id_from)
            .or_else(|| {
                self.transcript_path
                    .as_deref()
                    .map(|p| crate::naming::base(None, p, None).plain())
            })
    }
}

impl Scoped {
    /// Import what is new in a hook's transcript (the whole file the first time abridge sees
    /// it: a hook's file is never baselined). `Ok(None)` when the file does not exist (yet:
    /// Claude Code writes it lazily).
    pub async fn hook_import(&self, transcript: &Path) -> AppResult<Option<Followed>> {
        if !transcript.is_file() {
            return Ok(None);
        }
        let key = crate::naming::file_key(transcript);
        let watched = Watched::new(self.app.store());
        let mut f = watched
            .all()
            .await?
            .into_iter()
            .find(|f| f.path == key)
            .unwrap_or(WatchedFile {
                path: key,
                session: None,
                format: None,
                offset: 0,
                lines: Some(0),
            });
        let name = transcript.file_name().map_or_else(
            || transcript.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        self.import_appended(&mut f, transcript, &name, false)
            .await
            .map(Some)
    }
}

/// A context as the text a hook hands the model: the summary, digest and ledger message, then
/// the pinned and recent messages, labelled (each caller fits it to its own limit).
pub fn context_text(v: &crate::ContextView) -> String {
    let mut out = String::from(
        "abridge: what this session has done so far (summary, digest of requests, files and commands, pinned messages) — kept outside the agent's own context, so it survives compaction.\n",
    );
    for m in &v.messages {
        let label = match m.role.as_str() {
            "system" => String::new(),
            "user" => "User: ".into(),
            "assistant" => "Assistant: ".into(),
            other => format!("{other}: "),
        };
        out.push('\n');
        out.push_str(&label);
        out.push_str(m.content.trim());
        out.push('\n');
    }
    out
}

/// Whether a context `ctx` names the file `path`: whole, or relative to the folder the
/// digest names once (`Files edited (under /home/me/shop/): src/cart.rs (#6)`).
pub fn names_file(ctx: &str, path: &str) -> bool {
    ctx.contains(path)
        || ctx.match_indices("(under ").any(|(i, _)| {
            let rest = &ctx[i + "(under ".len()..];
            rest.find("):").is_some_and(|end| {
                path.strip_prefix(&rest[..end]).is_some_and(|rel| {
                    let after = &ctx[i..];
                    after.contains(&format!(" {rel} (#")) || after.contains(&format!(": {rel} (#"))
                })
            })
        })
}

/// The JSON a SessionStart hook prints to add `context` for the model.
/// The context is cut at a line to [`MAX_CONTEXT_CHARS`] (Claude Code's cap), saying so.
pub fn session_start_output(context: &str) -> serde_json::Value {
    let context = if context.chars().count() > MAX_CONTEXT_CHARS {
        let cut: String = context.chars().take(MAX_CONTEXT_CHARS).collect();
        let at = cut.rfind('\n').unwrap_or(cut.len());
        format!("{}\n(cut at {MAX_CONTEXT_CHARS} characters)", &cut[..at])
    } else {
        context.to_string()
    };
    serde_json::json!({
        "hookSpecificOutput": {
            "hookEventName": "SessionStart",
            "additionalContext": context,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads() {
        let p = Payload::parse(
            br#"{"session_id":"abc-1","transcript_path":"/t/abc-1.jsonl","cwd":"/p","hook_event_name":"SessionStart","source":"compact","extra":1}"#,
        )
        .unwrap();
        assert_eq!(p.ask(), Ask::Context);
        assert_eq!(p.session().as_deref(), Some("abc-1"));
        assert_eq!(p.source.as_deref(), Some("compact"));
        let p = Payload::parse(br#"{"hook_event_name":"PreCompact","transcript_path":"/t/x.jsonl","trigger":"auto","custom_instructions":null}"#).unwrap();
        assert_eq!((p.ask(), p.session().as_deref()), (Ask::Import, Some("x")));
        assert_eq!(
            Payload::parse(br#"{"hook_event_name":"Notification"}"#)
                .unwrap()
                .ask(),
            Ask::Nothing
        );
        assert!(
            Payload::parse(b"not json")
                .unwrap_err()
                .message
                .contains("not the JSON object")
        );
        assert!(Payload::parse(br#"{"hook_event_name":""}"#).is_err());
        // Codex: a thread id, a null transcript before the rollout exists, its own fields.
        let p = Payload::parse(
            br#"{"session_id":"5f0c2a8e-1111-4222-8333-444455556666","transcript_path":null,"cwd":"/p","hook_event_name":"SessionStart","model":"gpt-5-codex","permission_mode":"default","source":"startup"}"#,
        )
        .unwrap();
        assert_eq!(p.ask(), Ask::Context);
        assert_eq!(p.transcript_path, None);
        assert_eq!(
            p.session().as_deref(),
            Some("5f0c2a8e-1111-4222-8333-444455556666")
        );
    }
}
