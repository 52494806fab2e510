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

/// The user a coding agent's memories belong to (the MCP tools' and the hooks').
pub const AGENT_USER: &str = "agent";
/// The memory type of a rule pinned to a project.
pub const PIN_TYPE: &str = "pin";
/// Earlier sessions of a project a start names, one line each (besides the newest).
const EARLIER_SESSIONS: usize = 5;
/// Memories of a project a start lists at most.
const START_MEMORIES: usize = 12;
/// Sessions of a project looked at for a start (the most recently active are shown).
const PROJECT_CANDIDATES: usize = 200;

/// A project as abridge names it: its folder's path the way Claude Code names its
/// transcripts' folder (every character not an ASCII letter or digit becomes `-`), so a
/// session imported from `~/.claude/projects/<that>/` and a hook's `cwd` name the same
/// project.
pub fn project_key(cwd: &str) -> String {
    cwd.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The project a tool's argument names: a folder's path (`/home/me/shop`, `C:\\work\\shop`)
/// as [`project_key`] names its folder, a name as it is (a key the hooks made,
/// `-home-me-shop`, stays the same); `None` for a blank one.
pub fn project_named(given: &str) -> Option<String> {
    let g = given.trim();
    if g.is_empty() {
        None
    } else if g.contains(['/', '\\']) {
        Some(project_key(g.trim_end_matches(['/', '\\'])))
    } else {
        Some(g.to_string())
    }
}

/// The id of the memory that pins `episode` of `session` to its project.
pub fn project_pin_id(session: &str, episode: u64) -> String {
    format!("pin:{session}:{episode}")
}

/// The rules pinned to a project as a start or a context shows them; `None` without any.
pub fn pins_text(pins: &[crate::memories::MemoryView]) -> Option<String> {
    (!pins.is_empty()).then(|| {
        let mut t = String::from("Pinned for this project:");
        for p in pins {
            t.push_str(&format!("\n- {}", p.text));
        }
        t
    })
}

fn cut_chars(s: &str, max: usize) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= max {
        return one;
    }
    let mut t: String = one.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

fn day_of(ms: Option<i64>) -> String {
    ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.strftime("%Y-%m-%d").to_string())
        .unwrap_or_else(|| "?".into())
}

impl Scoped {
    /// Record that `session` belongs to `project` (see [`project_key`]): a hook's `cwd` names
    /// it, for an agent (Codex) whose transcript folder does not.
    pub async fn label_project(&self, session: &str, project: &str) -> AppResult<()> {
        let (title, old) = self.label(session).await?;
        if old.as_deref() == Some(project) {
            return Ok(());
        }
        self.set_label(session, title.as_deref(), Some(project))
            .await
    }

    /// The rules pinned to `project`, oldest first.
    pub async fn project_pins(&self, project: &str) -> AppResult<Vec<crate::memories::MemoryView>> {
        let f = crate::memories::filter(
            Some(AGENT_USER.into()),
            Some(project.into()),
            None,
            Some(PIN_TYPE.into()),
            None,
        );
        Ok(self.memories(&f, 0, 100).await?.0)
    }

    /// Pin `episode` of `session` to the session's project (or unpin it): it then opens every
    /// new agent session there. The project is the session's (its transcript's folder or the
    /// `cwd` a hook gave).
    pub async fn pin_to_project(
        &self,
        session: &str,
        episode: u64,
        pinned: bool,
    ) -> AppResult<String> {
        let (_, project) = self.label(session).await?;
        let project = project.ok_or_else(|| {
            AppError::invalid(format!("session '{session}' has no project"))
                .hint("a session imported from an agent's project folder, or named by a hook's cwd, has one; pin it to the session instead")
        })?;
        let id = project_pin_id(session, episode);
        if !pinned {
            self.forget(&id, crate::memories::Summaries::Leave).await?;
            return Ok(project);
        }
        let e = self
            .store()
            .episodes_after(session, episode.saturating_sub(1), 1)
            .await?
            .into_iter()
            .find(|e| e.id == episode)
            .ok_or_else(|| {
                AppError::not_found(format!("session '{session}' has no episode {episode}"))
            })?;
        let m = crate::memories::MemoryInput {
            id: Some(id),
            user: AGENT_USER.into(),
            project: project.clone(),
            environment: String::new(),
            kind: PIN_TYPE.into(),
            key: "pinned".into(),
            text: cut_chars(&e.content, crate::memories::PIN_CHARS),
            importance: Some(1.0),
            replaces: None,
        };
        self.remember(vec![m], crate::memories::Summaries::Leave)
            .await?;
        Ok(project)
    }

    /// What a new agent session in the project at `cwd` starts with, within about
    /// `budget_tokens`: the rules pinned to the project, the newest earlier session's summary
    /// and digest (its last request, files edited, open error and to-dos), the older ones a
    /// line each, and the memories kept for the project and the agent. `None` for a project
    /// abridge knows nothing of. `current` (the starting session) is left out.
    pub async fn project_start(
        &self,
        cwd: &str,
        current: Option<&str>,
        budget_tokens: u32,
    ) -> AppResult<Option<String>> {
        let project = project_key(cwd);
        let mut room = (budget_tokens as usize)
            .saturating_mul(4)
            .min(MAX_CONTEXT_CHARS);
        let mut parts: Vec<String> = Vec::new();
        let mut take = |text: String, room: &mut usize| -> bool {
            let n = text.chars().count() + 1;
            if n > *room {
                return false;
            }
            *room -= n;
            parts.push(text);
            true
        };
        // The sessions of this project, most recently active first.
        let (hits, _) = self.sessions(0, PROJECT_CANDIDATES, Some(&project)).await?;
        let mut earlier: Vec<crate::SessionView> = hits
            .into_iter()
            .filter(|v| v.project.as_deref() == Some(project.as_str()))
            .filter(|v| Some(v.id.as_str()) != current && v.episodes > 0)
            .collect();
        earlier.sort_by(|a, b| {
            b.last_activity_ms
                .cmp(&a.last_activity_ms)
                .then(a.id.cmp(&b.id))
        });
        let pins = self.project_pins(&project).await?;
        let f = crate::memories::filter(
            Some(AGENT_USER.into()),
            Some(project.clone()),
            None,
            None,
            None,
        );
        let (_, total) = self.memories(&f, 0, 0).await?;
        let (mems, _) = self
            .memories(
                &f,
                total.saturating_sub(START_MEMORIES * 2),
                START_MEMORIES * 2,
            )
            .await?;
        let mems: Vec<_> = mems
            .into_iter()
            .rev()
            .filter(|m| m.kind != PIN_TYPE)
            .take(START_MEMORIES)
            .collect();
        if earlier.is_empty() && pins.is_empty() && mems.is_empty() {
            return Ok(None);
        }
        take(
            format!(
                "abridge: what this project ({cwd}) already knows, from its earlier agent sessions and what was pinned and remembered for it."
            ),
            &mut room,
        );
        if let Some(t) = pins_text(&pins) {
            take(format!("\n{t}"), &mut room);
        }
        if let Some(last) = earlier.first() {
            // Its summary and digest: at most 60 % of what is left.
            let share = (room * 3 / 5 / 4) as u32;
            if share >= 64 {
                let v = self
                    .context(
                        &last.id,
                        crate::ContextAsk {
                            pairs: 1,
                            refresh_after: u32::MAX,
                            ..crate::ContextAsk::new(share)
                        },
                    )
                    .await?;
                // The summary, and the per-call note that carries a coding session's digest.
                let system: Vec<&str> = v
                    .messages
                    .iter()
                    .filter(|m| m.role == "system")
                    .map(|m| m.content.trim())
                    .chain(v.note.as_deref().map(str::trim))
                    .collect();
                let name = match &last.title {
                    Some(title) => format!("{title}, session {}", last.id),
                    None => format!("session {}", last.id),
                };
                let mut t = format!(
                    "\nThe last session here ({name}, {}):",
                    day_of(last.last_activity_ms)
                );
                if system.is_empty() {
                    // No summary yet: the session is short enough that its context is all
                    // of it, so its digest is its own messages (a tool's output left out).
                    t.push_str(&format!(
                        " {} messages, no summary yet; what they said:",
                        last.episodes
                    ));
                    for line in short_digest(&v.messages) {
                        t.push('\n');
                        t.push_str(&line);
                    }
                } else {
                    t.push('\n');
                    t.push_str(&system.join("\n"));
                }
                take(t, &mut room);
            }
        }
        if earlier.len() > 1 {
            let mut t = String::from("\nEarlier sessions here:");
            for v in earlier.iter().skip(1).take(EARLIER_SESSIONS) {
                let title = v
                    .title
                    .as_deref()
                    .map(|t| format!(" {}", cut_chars(t, 80)))
                    .unwrap_or_default();
                t.push_str(&format!(
                    "\n- {}{title} (session {}, {} messages)",
                    day_of(v.last_activity_ms),
                    v.id,
                    v.episodes
                ));
            }
            if earlier.len() > 1 + EARLIER_SESSIONS {
                t.push_str(&format!(
                    "\n- … and {} more (abridge status)",
                    earlier.len() - 1 - EARLIER_SESSIONS
                ));
            }
            take(t, &mut room);
        }
        if !mems.is_empty() {
            let mut t = String::from("\nRemembered for this project:");
            for m in &mems {
                t.push_str(&format!(
                    "\n- {} ({}, {})",
                    cut_chars(&m.text, 200),
                    m.kind,
                    m.key
                ));
            }
            take(t, &mut room);
        }
        Ok(Some(parts.join("\n")))
    }
}

/// Characters of one message a short session's digest shows.
const DIGEST_LINE_CHARS: usize = 300;

/// A short session's digest from its messages (a context that holds all of them): each
/// request and answer on a line, cut to [`DIGEST_LINE_CHARS`]; of a tool's messages only
/// its actions (`[action] Edit src/a.rs`), not its output.
pub fn short_digest(messages: &[crate::views::ContextMessage]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.role != "system")
        .filter(|m| m.role != "tool" || m.content.starts_with("[action] "))
        .map(|m| {
            let label = match m.role.as_str() {
                "user" => "User",
                "assistant" => "Assistant",
                _ => "Tool",
            };
            format!("- {label}: {}", cut_chars(&m.content, DIGEST_LINE_CHARS))
        })
        .collect()
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
