//! Reading transcripts: JSON lines, OpenAI messages, Claude Code session JSONL and ChatGPT
//! `conversations.json` (see ../shared/docs/transcript-formats.md).
//!
//! Parsing is all-or-nothing: a file with a malformed line is refused with its line number
//! before anything is stored (unless the caller asks to skip bad lines). The one exception
//! is a partial last line with no newline, which a live Claude Code session is still
//! writing: it is skipped with a warning.

use std::fmt;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::types::{NewEpisode, Role};

/// A transcript format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line: `{"role", "content", "timestamp"?, "id"?}`.
    Jsonl,
    /// An OpenAI messages array, or `{"messages": [...]}`.
    OpenAi,
    /// A Claude Code session file.
    ClaudeCode,
    /// A ChatGPT data export (`conversations.json`).
    ChatGpt,
}

impl Format {
    /// Parse a `--format` value (`auto` is `None`).
    pub fn parse(s: &str) -> Result<Option<Format>, String> {
        Ok(Some(match s {
            "auto" => return Ok(None),
            "jsonl" => Format::Jsonl,
            "openai" => Format::OpenAi,
            "claude-code" => Format::ClaudeCode,
            "chatgpt" => Format::ChatGpt,
            other => {
                return Err(format!(
                    "unknown format '{other}'; use auto, jsonl, openai, claude-code or chatgpt"
                ));
            }
        }))
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Jsonl => "jsonl",
            Format::OpenAi => "openai",
            Format::ClaudeCode => "claude-code",
            Format::ChatGpt => "chatgpt",
        })
    }
}

/// Parsing choices.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Keep tool calls and tool results as episodes (off: only dialogue).
    pub include_tools: bool,
    /// Skip malformed lines with a warning instead of refusing the file.
    pub skip_invalid: bool,
    /// Lines of the file before these bytes (a watcher reads from where it stopped), so line
    /// numbers in messages and in episode keys are the file's own whatever the read started.
    pub first_line: usize,
}

/// One conversation read from a file.
#[derive(Clone, Debug)]
pub struct Conversation {
    /// The conversation's own id (Claude Code `sessionId`, ChatGPT conversation id).
    pub id: Option<String>,
    /// A title, when the format carries one.
    pub title: Option<String>,
    /// Episodes in order; `tokens` is left 0 for the guest to fill in.
    pub episodes: Vec<NewEpisode>,
}

/// A parsed file.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// The format read.
    pub format: Format,
    /// Conversations (several only for ChatGPT exports).
    pub conversations: Vec<Conversation>,
    /// Lines skipped, and why.
    pub warnings: Vec<String>,
    /// Bytes read.
    pub bytes: u64,
}

/// Why a transcript could not be read. Each message says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source} — check the path")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is over the size limit.
    #[error(
        "{path} is over the {limit}-byte limit (at least {size} bytes) — raise it with --max-bytes, or split the file"
    )]
    TooLarge {
        /// File.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The file is not UTF-8.
    #[error(
        "{path}:{line}: invalid UTF-8 at byte {offset} — re-encode the file as UTF-8 (for example: iconv -f latin1 -t utf-8)"
    )]
    Utf8 {
        /// File.
        path: String,
        /// 1-based line.
        line: usize,
        /// Byte offset of the bad sequence.
        offset: usize,
    },
    /// A line or document is malformed.
    #[error("{path}:{line}: {message}")]
    Malformed {
        /// File.
        path: String,
        /// 1-based line (1 for whole-document formats).
        line: usize,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The file holds nothing but white space.
    #[error("{path} is empty — nothing to import; check that it is the right file")]
    EmptyFile {
        /// File.
        path: String,
    },
    /// The format could not be recognised.
    #[error(
        "cannot tell the format of {path} — pass --format jsonl|openai|claude-code|chatgpt (see README: Formats)"
    )]
    UnknownFormat {
        /// File.
        path: String,
    },
    /// No messages were found.
    #[error(
        "{path} holds no messages (read as {format}) — check that it is the right file, or pass --format"
    )]
    Empty {
        /// File.
        path: String,
        /// Format used.
        format: Format,
    },
}

/// Default size limit for one transcript file: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Read and parse a file (`-` reads standard input).
pub fn read_file(
    path: &Path,
    format: Option<Format>,
    opts: Options,
    max_bytes: u64,
) -> Result<Parsed, TranscriptError> {
    let name = path.display().to_string();
    let io = |source| TranscriptError::Io {
        path: name.clone(),
        source,
    };
    let bytes = if name == "-" {
        read_bounded(&name, &mut std::io::stdin().lock(), max_bytes)?
    } else {
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            return Err(TranscriptError::Io {
                path: name,
                source: std::io::Error::other("it is a directory, not a transcript file"),
            });
        }
        if meta.len() > max_bytes {
            return Err(TranscriptError::TooLarge {
                path: name,
                size: meta.len(),
                limit: max_bytes,
            });
        }
        // The size above is only a hint: a FIFO, a device or a growing file reports another;
        // the read itself stops one byte past the limit.
        let mut file = std::fs::File::open(path).map_err(io)?;
        read_bounded(&name, &mut file, max_bytes)?
    };
    parse_bytes(&name, &bytes, format, opts)
}

/// Read at most `max_bytes` from `r`: memory stays bounded however much (or however long) the
/// source writes; one byte more is [`TranscriptError::TooLarge`].
pub fn read_bounded(
    name: &str,
    r: &mut impl std::io::Read,
    max_bytes: u64,
) -> Result<Vec<u8>, TranscriptError> {
    let mut buf = Vec::new();
    let mut limited = std::io::Read::take(&mut *r, max_bytes.saturating_add(1));
    std::io::Read::read_to_end(&mut limited, &mut buf).map_err(|source| TranscriptError::Io {
        path: name.to_string(),
        source,
    })?;
    if buf.len() as u64 > max_bytes {
        return Err(TranscriptError::TooLarge {
            path: name.to_string(),
            size: buf.len() as u64,
            limit: max_bytes,
        });
    }
    Ok(buf)
}

/// Parse bytes named `name` (used in messages).
pub fn parse_bytes(
    name: &str,
    bytes: &[u8],
    format: Option<Format>,
    opts: Options,
) -> Result<Parsed, TranscriptError> {
    let mut warnings = Vec::new();
    let owned;
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) if !opts.skip_invalid => {
            let offset = e.valid_up_to();
            return Err(TranscriptError::Utf8 {
                path: name.to_string(),
                line: bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1,
                offset,
            });
        }
        Err(_) => {
            // --skip-invalid: a line that is not UTF-8 is skipped like any other bad line
            // (blanked, so later lines keep their numbers).
            let mut out = String::with_capacity(bytes.len());
            for (i, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
                match std::str::from_utf8(line) {
                    Ok(l) => out.push_str(l),
                    Err(_) => {
                        warnings.push(format!("{name}:{}: invalid UTF-8; skipped", i + 1));
                        if line.ends_with(b"\n") {
                            out.push('\n');
                        }
                    }
                }
            }
            owned = out;
            &owned
        }
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(TranscriptError::EmptyFile {
            path: name.to_string(),
        });
    }
    let format = match format {
        Some(f) => f,
        None => detect(text).ok_or_else(|| TranscriptError::UnknownFormat {
            path: name.to_string(),
        })?,
    };
    let mut p = Parser {
        name,
        opts,
        warnings,
    };
    let conversations = match format {
        Format::Jsonl => vec![p.jsonl(text)?],
        Format::OpenAi => vec![p.openai(text)?],
        Format::ClaudeCode => vec![p.claude_code(text)?],
        Format::ChatGpt => p.chatgpt(text)?,
    };
    let conversations: Vec<Conversation> = conversations
        .into_iter()
        .filter(|c| !c.episodes.is_empty())
        .collect();
    if conversations.is_empty() {
        return Err(TranscriptError::Empty {
            path: name.to_string(),
            format,
        });
    }
    Ok(Parsed {
        format,
        conversations,
        warnings: p.warnings,
        bytes: bytes.len() as u64,
    })
}

/// Guess the format from the content.
pub fn detect(text: &str) -> Option<Format> {
    let t = text.trim_start();
    if let Ok(v) = serde_json::from_str::<Value>(t) {
        return match &v {
            Value::Array(items) => {
                let first = items.iter().find(|i| i.is_object())?;
                if first.get("mapping").is_some() {
                    Some(Format::ChatGpt)
                } else if first.get("role").is_some() {
                    Some(Format::OpenAi)
                } else {
                    None
                }
            }
            Value::Object(o) if o.contains_key("mapping") || o.contains_key("conversations") => {
                Some(Format::ChatGpt)
            }
            Value::Object(o) if o.contains_key("messages") => Some(Format::OpenAi),
            Value::Object(_) => line_format(&v),
            _ => None,
        };
    }
    t.lines()
        .filter(|l| !l.trim().is_empty())
        .take(20)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| line_format(&v))
}

fn line_format(v: &Value) -> Option<Format> {
    if v.get("type").is_some()
        && (v.get("sessionId").is_some() || v.get("uuid").is_some() || v.get("leafUuid").is_some())
    {
        Some(Format::ClaudeCode)
    } else if v.get("role").is_some() {
        Some(Format::Jsonl)
    } else {
        None
    }
}

/// The one session-naming rule, for every command: a conversation's own id (Claude Code
/// `sessionId`, ChatGPT conversation id) when it has one, else the file's path relative to the
/// directory the command was given (for a single file: its name) without its extension, with
/// `-N` for the N-th conversation of a file that holds several. `p1/notes.jsonl` and
/// `p2/notes.jsonl` under one backfill root are `p1/notes` and `p2/notes`; standard input is
/// `stdin`. Control characters become `_` (see [`crate::text::session_id_from`]).
pub fn session_name(conv_id: Option<&str>, rel: &Path, index: Option<usize>) -> String {
    if let Some(id) = conv_id.and_then(crate::text::session_id_from) {
        return id;
    }
    let base = if rel.as_os_str() == "-" {
        "stdin".to_string()
    } else {
        let no_ext = rel.with_extension("");
        let parts: Vec<String> = no_ext
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        crate::text::session_id_from(&parts.join("/")).unwrap_or_else(|| "session".into())
    };
    match index {
        Some(i) => format!("{base}-{}", i + 1),
        None => base,
    }
}

/// A stable key for an episode without an id of its own: position plus a content hash.
pub fn position_key(index: usize, role: Role, content: &str) -> String {
    let mut h = Sha256::new();
    h.update(role.as_str());
    h.update([0]);
    h.update(content);
    let d = h.finalize();
    format!(
        "{index}:{}",
        d.iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Parse an RFC 3339 / ISO 8601 UTC time (`2025-09-19T17:34:29.181Z`, offsets allowed) to ms.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let b = s.trim().as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d, h, mi, sec) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let frac = std::str::from_utf8(&b[start..i]).ok()?;
        let frac3: String = frac.chars().chain("000".chars()).take(3).collect();
        ms = frac3.parse().ok()?;
    }
    let offset_min = match b.get(i) {
        None | Some(b'Z') | Some(b'z') => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let oh = num(i + 1..i + 3)?;
            let om = if b.get(i + 3) == Some(&b':') {
                num(i + 4..i + 6)?
            } else {
                num(i + 3..i + 5)?
            };
            let m = oh * 60 + om;
            if sign == b'+' { m } else { -m }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + h) * 60 + mi - offset_min) * 60 + sec) * 1000 + ms)
}

/// Read a timestamp field: an RFC 3339 string, or epoch seconds / milliseconds as a number.
fn timestamp_value(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::String(s) => parse_timestamp(s),
        Value::Number(n) => {
            let f = n.as_f64()?;
            // Values past 1e11 are milliseconds (1e11 seconds is the year 5138).
            Some(if f.abs() >= 1e11 {
                f as i64
            } else {
                (f * 1000.0) as i64
            })
        }
        _ => None,
    }
}

/// Text of a content field: a string, or an array of parts with `text`.
fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(_)
                    if p.get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "text" || t == "input_text" || t == "output_text") =>
                {
                    p.get("text").and_then(Value::as_str)
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Harness-generated text in Claude Code user lines, removed with its content.
const HARNESS_TAGS: &[&str] = &[
    "command-name",
    "command-message",
    "command-args",
    "local-command-stdout",
    "local-command-stderr",
    "local-command-caveat",
    "system-reminder",
    "user-prompt-submit-hook",
];

/// Remove every harness block (`<tag>…</tag>`, or `<tag>…` to the end when unclosed) in one
/// left-to-right pass: linear in the text, whatever it holds.
fn strip_harness(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(lt) = rest.find('<') {
        let after = &rest[lt + 1..];
        let tag = HARNESS_TAGS
            .iter()
            .find(|t| after.starts_with(**t) && after[t.len()..].starts_with('>'));
        match tag {
            Some(tag) => {
                out.push_str(&rest[..lt]);
                let body = &after[tag.len() + 1..];
                let close = format!("</{tag}>");
                rest = body.find(&close).map_or("", |c| &body[c + close.len()..]);
            }
            None => {
                out.push_str(&rest[..=lt]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// One JSON-lines episode `{"role", "content", "timestamp"?, "id"?}` read from line `n` of
/// `name`. `None` for lines with no text (or tool lines when tools are excluded).
pub fn jsonl_episode(
    name: &str,
    n: usize,
    v: &Value,
    include_tools: bool,
) -> Result<Option<NewEpisode>, TranscriptError> {
    let malformed = |message: String| TranscriptError::Malformed {
        path: name.to_string(),
        line: n,
        message,
    };
    let Some(role_s) = v.get("role").and_then(Value::as_str) else {
        let hint = if line_format(v) == Some(Format::ClaudeCode) {
            " (this looks like a Claude Code file: pass --format claude-code)"
        } else {
            ""
        };
        return Err(malformed(format!(
            "expected {{\"role\", \"content\"}} but found no \"role\"{hint}"
        )));
    };
    let role = Role::parse(role_s).ok_or_else(|| {
        malformed(format!(
            "unknown role '{role_s}'; use system, user, assistant or tool"
        ))
    })?;
    if role == Role::Tool && !include_tools {
        return Ok(None);
    }
    let content = content_text(v.get("content"));
    if content.trim().is_empty() {
        return Ok(None);
    }
    let source_key = match v.get("id") {
        Some(Value::String(s)) => format!("id:{s}"),
        Some(Value::Number(x)) => format!("id:{x}"),
        _ => position_key(n, role, &content),
    };
    Ok(Some(NewEpisode {
        role,
        content,
        timestamp_ms: timestamp_value(v.get("timestamp")),
        source_key,
        tokens: 0,
    }))
}

struct Parser<'a> {
    name: &'a str,
    opts: Options,
    warnings: Vec<String>,
}

impl Parser<'_> {
    fn malformed(&self, line: usize, message: impl Into<String>) -> TranscriptError {
        TranscriptError::Malformed {
            path: self.name.to_string(),
            line,
            message: message.into(),
        }
    }

    /// Parse JSON lines, handing each object to `f`. Blank lines are skipped; a partial last
    /// line is skipped with a warning; other bad lines are errors unless `skip_invalid`.
    fn lines(
        &mut self,
        text: &str,
        mut f: impl FnMut(&mut Self, usize, Value) -> Result<(), TranscriptError>,
    ) -> Result<(), TranscriptError> {
        let ends_with_newline = text.ends_with('\n');
        let all: Vec<&str> = text.lines().collect();
        let last_non_blank = all.iter().rposition(|l| !l.trim().is_empty());
        for (i, line) in all.iter().enumerate() {
            let n = self.opts.first_line + i + 1;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(line) {
                Ok(v) if v.is_object() => f(self, n, v)?,
                Ok(_) => {
                    let m = "expected a JSON object on this line";
                    if self.opts.skip_invalid {
                        self.warnings
                            .push(format!("{}:{n}: {m}; skipped", self.name));
                    } else {
                        return Err(self.malformed(
                            n,
                            format!("{m} — fix the line, or pass --skip-invalid to skip bad lines"),
                        ));
                    }
                }
                Err(e) => {
                    if Some(i) == last_non_blank && !ends_with_newline {
                        self.warnings.push(format!(
                            "{}:{n}: partial last line (still being written?) skipped",
                            self.name
                        ));
                    } else if self.opts.skip_invalid {
                        self.warnings
                            .push(format!("{}:{n}: not valid JSON ({e}); skipped", self.name));
                    } else {
                        return Err(self.malformed(n, format!("not valid JSON ({e}) — fix the line, or pass --skip-invalid to skip bad lines")));
                    }
                }
            }
        }
        Ok(())
    }

    fn jsonl(&mut self, text: &str) -> Result<Conversation, TranscriptError> {
        let mut episodes = Vec::new();
        let include_tools = self.opts.include_tools;
        self.lines(text, |p, n, v| {
            episodes.extend(jsonl_episode(p.name, n, &v, include_tools)?);
            Ok(())
        })?;
        Ok(Conversation {
            id: None,
            title: None,
            episodes,
        })
    }

    fn openai(&mut self, text: &str) -> Result<Conversation, TranscriptError> {
        let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
            self.malformed(
                e.line(),
                format!("not valid JSON ({e}) — an OpenAI messages file is one JSON array"),
            )
        })?;
        let msgs = match &v {
            Value::Array(a) => a,
            Value::Object(o) => o.get("messages").and_then(Value::as_array).ok_or_else(|| {
                self.malformed(1, "expected a messages array or {\"messages\": [...]}")
            })?,
            _ => {
                return Err(self.malformed(1, "expected a messages array or {\"messages\": [...]}"));
            }
        };
        let mut episodes = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            let Some(role_s) = m.get("role").and_then(Value::as_str) else {
                return Err(self.malformed(1, format!("message {i} has no \"role\"")));
            };
            let Some(role) = Role::parse(role_s) else {
                return Err(self.malformed(1, format!("message {i} has unknown role '{role_s}'")));
            };
            let mut content = content_text(m.get("content"));
            if self.opts.include_tools {
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                    for c in calls {
                        let name = c
                            .pointer("/function/name")
                            .and_then(Value::as_str)
                            .unwrap_or("tool");
                        let args = c
                            .pointer("/function/arguments")
                            .map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_string))
                            .unwrap_or_default();
                        content.push_str(&format!("\n[tool call {name}: {args}]"));
                    }
                }
            } else if role == Role::Tool {
                continue;
            }
            let content = content.trim().to_string();
            if content.is_empty() {
                continue;
            }
            let source_key = position_key(i, role, &content);
            episodes.push(NewEpisode {
                role,
                content,
                timestamp_ms: None,
                source_key,
                tokens: 0,
            });
        }
        Ok(Conversation {
            id: None,
            title: None,
            episodes,
        })
    }

    fn claude_code(&mut self, text: &str) -> Result<Conversation, TranscriptError> {
        let mut conv = Conversation {
            id: None,
            title: None,
            episodes: Vec::new(),
        };
        // The message id of the assistant turn being merged, if the last episode is one.
        let mut open_turn: Option<String> = None;
        let include_tools = self.opts.include_tools;
        self.lines(text, |_, _, v| {
            let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "summary" {
                if conv.title.is_none() {
                    conv.title = v.get("summary").and_then(Value::as_str).map(str::to_string);
                }
                return Ok(());
            }
            if !matches!(kind, "user" | "assistant") {
                return Ok(());
            }
            let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
            if flag("isMeta") || flag("isSidechain") || flag("isCompactSummary") {
                return Ok(());
            }
            let Some(msg) = v.get("message") else {
                return Ok(());
            };
            if conv.id.is_none() {
                conv.id = v
                    .get("sessionId")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            let uuid = v
                .get("uuid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let ts = timestamp_value(v.get("timestamp"));
            let role = if msg.get("role").and_then(Value::as_str) == Some("assistant") {
                Role::Assistant
            } else {
                Role::User
            };
            let mut texts = Vec::new();
            let mut tool_results = Vec::new();
            match msg.get("content") {
                Some(Value::String(s)) => texts.push(s.clone()),
                Some(Value::Array(blocks)) => {
                    for b in blocks {
                        match b.get("type").and_then(Value::as_str) {
                            Some("text") => texts
                                .extend(b.get("text").and_then(Value::as_str).map(str::to_string)),
                            Some("tool_use") if include_tools => {
                                let name = b.get("name").and_then(Value::as_str).unwrap_or("tool");
                                let input =
                                    b.get("input").map(Value::to_string).unwrap_or_default();
                                texts.push(format!("[tool call {name}: {input}]"));
                            }
                            Some("tool_result") if include_tools => {
                                let c = content_text(b.get("content"));
                                if !c.trim().is_empty() {
                                    tool_results.push(c);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
            let text = if role == Role::User {
                strip_harness(&texts.join("\n"))
            } else {
                texts.join("\n").trim().to_string()
            };
            for (k, r) in tool_results.into_iter().enumerate() {
                open_turn = None;
                conv.episodes.push(NewEpisode {
                    role: Role::Tool,
                    content: r,
                    timestamp_ms: ts,
                    source_key: format!("{uuid}#tool{k}"),
                    tokens: 0,
                });
            }
            if text.is_empty() {
                return Ok(());
            }
            let msg_id = msg.get("id").and_then(Value::as_str).map(str::to_string);
            // One API response arrives as several assistant lines sharing a message id.
            if role == Role::Assistant
                && msg_id.is_some()
                && open_turn == msg_id
                && let Some(last) = conv.episodes.last_mut()
            {
                last.content.push('\n');
                last.content.push_str(&text);
                return Ok(());
            }
            open_turn = if role == Role::Assistant {
                msg_id
            } else {
                None
            };
            let source_key = if uuid.is_empty() {
                position_key(conv.episodes.len(), role, &text)
            } else {
                uuid
            };
            conv.episodes.push(NewEpisode {
                role,
                content: text,
                timestamp_ms: ts,
                source_key,
                tokens: 0,
            });
            Ok(())
        })?;
        Ok(conv)
    }

    fn chatgpt(&mut self, text: &str) -> Result<Vec<Conversation>, TranscriptError> {
        let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
            self.malformed(e.line(), format!("not valid JSON ({e}) — a ChatGPT export is the conversations.json file from the export zip"))
        })?;
        let convs: Vec<&Value> = match &v {
            Value::Array(a) => a.iter().collect(),
            Value::Object(o) if o.contains_key("conversations") => o["conversations"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default(),
            Value::Object(_) => vec![&v],
            _ => Vec::new(),
        };
        let mut out = Vec::new();
        for (ci, c) in convs.iter().enumerate() {
            let Some(mapping) = c.get("mapping").and_then(Value::as_object) else {
                return Err(self.malformed(1, format!("conversation {ci} has no \"mapping\"; is this a ChatGPT conversations.json?")));
            };
            let id = c
                .get("conversation_id")
                .or_else(|| c.get("id"))
                .and_then(Value::as_str)
                .map(str::to_string);
            let title = c.get("title").and_then(Value::as_str).map(str::to_string);
            // The active branch: from current_node up to the root, reversed.
            let mut leaf = c
                .get("current_node")
                .and_then(Value::as_str)
                .map(str::to_string);
            if leaf.as_ref().is_none_or(|l| !mapping.contains_key(l)) {
                // No current node: follow the last child from the root.
                let mut node = mapping
                    .iter()
                    .find(|(_, n)| n.get("parent").is_none_or(Value::is_null))
                    .map(|(k, _)| k.clone());
                // Children links may form a cycle: the walk stops at the first node it has
                // already visited, with a warning, and keeps the branch read so far.
                let mut seen = std::collections::BTreeSet::new();
                while let Some(k) = node.clone() {
                    seen.insert(k.clone());
                    let next = mapping[&k]
                        .get("children")
                        .and_then(Value::as_array)
                        .and_then(|ch| ch.last())
                        .and_then(Value::as_str);
                    match next {
                        Some(n) if seen.contains(n) => {
                            self.warnings.push(format!(
                                "{}: conversation {ci}: its children links form a cycle (at node {}); read up to it",
                                self.name,
                                crate::text::printable(n)
                            ));
                            break;
                        }
                        Some(n) if mapping.contains_key(n) => node = Some(n.to_string()),
                        _ => break,
                    }
                }
                leaf = node;
            }
            let mut path = Vec::new();
            let mut cur = leaf;
            while let Some(k) = cur {
                if path.len() > mapping.len() {
                    return Err(self.malformed(
                        1,
                        format!("conversation {ci} has a cycle in its parent links"),
                    ));
                }
                let Some(node) = mapping.get(&k) else { break };
                path.push(node);
                cur = node
                    .get("parent")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            path.reverse();
            let mut episodes = Vec::new();
            for node in path {
                let Some(m) = node.get("message").filter(|m| !m.is_null()) else {
                    continue;
                };
                let role_s = m
                    .pointer("/author/role")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let meta = m.get("metadata");
                let meta_flag = |k: &str| {
                    meta.and_then(|x| x.get(k))
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                };
                if meta_flag("is_visually_hidden_from_conversation") {
                    continue;
                }
                let role = match role_s {
                    "system" if meta_flag("is_user_system_message") => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "tool" if self.opts.include_tools => Role::Tool,
                    _ => continue,
                };
                if role == Role::Assistant
                    && m.get("recipient")
                        .and_then(Value::as_str)
                        .is_some_and(|r| r != "all")
                    && !self.opts.include_tools
                {
                    continue;
                }
                let ctype = m
                    .pointer("/content/content_type")
                    .and_then(Value::as_str)
                    .unwrap_or("text");
                if !matches!(ctype, "text" | "multimodal_text") {
                    continue;
                }
                let content = content_text(m.pointer("/content/parts")).trim().to_string();
                if content.is_empty() {
                    continue;
                }
                let key = m.get("id").and_then(Value::as_str).map_or_else(
                    || position_key(episodes.len(), role, &content),
                    str::to_string,
                );
                episodes.push(NewEpisode {
                    role,
                    content,
                    timestamp_ms: timestamp_value(m.get("create_time")),
                    source_key: key,
                    tokens: 0,
                });
            }
            out.push(Conversation {
                id,
                title,
                episodes,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, f: Option<Format>) -> Result<Parsed, TranscriptError> {
        parse_bytes("t", text.as_bytes(), f, Options::default())
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_timestamp("2025-09-19T17:34:29.181Z"),
            Some(1_758_303_269_181)
        );
        assert_eq!(
            parse_timestamp("2025-09-19T19:34:29.181+02:00"),
            Some(1_758_303_269_181)
        );
        assert_eq!(
            parse_timestamp("2000-02-29T12:00:00"),
            Some(951_825_600_000)
        );
        assert_eq!(parse_timestamp("yesterday"), None);
        assert_eq!(
            timestamp_value(Some(&serde_json::json!(1_700_000_000.5))),
            Some(1_700_000_000_500)
        );
        assert_eq!(
            timestamp_value(Some(&serde_json::json!(1_700_000_000_500i64))),
            Some(1_700_000_000_500)
        );
    }

    #[test]
    fn jsonl_with_errors_reported_by_line() {
        let ok = "{\"role\":\"user\",\"content\":\"hi\"}\n\n{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"hello\"}],\"timestamp\":\"2025-01-01T00:00:00Z\"}\n";
        let p = parse(ok, None).unwrap();
        assert_eq!(p.format, Format::Jsonl);
        assert_eq!(p.conversations[0].episodes.len(), 2);
        assert_eq!(
            p.conversations[0].episodes[1].timestamp_ms,
            Some(1_735_689_600_000)
        );

        let bad = "{\"role\":\"user\",\"content\":\"hi\"}\n{oops\n{\"role\":\"user\",\"content\":\"x\"}\n";
        let e = parse(bad, Some(Format::Jsonl)).unwrap_err().to_string();
        assert!(
            e.starts_with("t:2: not valid JSON") && e.contains("--skip-invalid"),
            "{e}"
        );
        let skipped = parse_bytes(
            "t",
            bad.as_bytes(),
            None,
            Options {
                skip_invalid: true,
                ..Options::default()
            },
        )
        .unwrap();
        assert_eq!(
            (
                skipped.conversations[0].episodes.len(),
                skipped.warnings.len()
            ),
            (2, 1)
        );

        // A partial last line (no newline) is tolerated.
        let partial = "{\"role\":\"user\",\"content\":\"hi\"}\n{\"role\":\"assis";
        let p = parse(partial, Some(Format::Jsonl)).unwrap();
        assert_eq!(
            (p.conversations[0].episodes.len(), p.warnings.len()),
            (1, 1)
        );
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            parse("hello world", None),
            Err(TranscriptError::UnknownFormat { .. })
        ));
        assert!(matches!(
            parse("[]", Some(Format::OpenAi)),
            Err(TranscriptError::Empty { .. })
        ));
        let e = parse_bytes(
            "f.jsonl",
            b"{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":\"\xff\"}\n",
            None,
            Options::default(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("f.jsonl:2: invalid UTF-8"), "{e}");
        let e = parse("{\"role\":\"wizard\",\"content\":\"a\"}\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown role 'wizard'"), "{e}");
    }

    #[test]
    fn openai_messages() {
        let t = r#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42"},{"role":"assistant","content":"It is 42."}]}"#;
        let p = parse(t, None).unwrap();
        let roles: Vec<Role> = p.conversations[0].episodes.iter().map(|e| e.role).collect();
        assert_eq!(roles, vec![Role::System, Role::User, Role::Assistant]);
    }

    #[test]
    fn claude_code_merges_split_assistant_turns_and_drops_noise() {
        let lines = [
            r#"{"type":"summary","summary":"Fix CI","leafUuid":"x"}"#,
            r#"{"type":"user","uuid":"u1","sessionId":"S","timestamp":"2025-01-01T00:00:00Z","message":{"role":"user","content":"Why does CI fail?"}}"#,
            r#"{"type":"assistant","uuid":"a1","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"thinking","thinking":"hmm"}]}}"#,
            r#"{"type":"assistant","uuid":"a2","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"Let me look."}]}}"#,
            r#"{"type":"assistant","uuid":"a3","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t","name":"Bash","input":{"command":"ls"}}]}}"#,
            r#"{"type":"user","uuid":"u2","sessionId":"S","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"a b"}]}}"#,
            r#"{"type":"assistant","uuid":"a4","sessionId":"S","message":{"id":"m2","role":"assistant","content":[{"type":"text","text":"The lockfile is stale."}]}}"#,
            r#"{"type":"user","uuid":"u3","sessionId":"S","isMeta":true,"message":{"role":"user","content":"meta"}}"#,
            r#"{"type":"user","uuid":"u4","sessionId":"S","message":{"role":"user","content":"<command-name>/clear</command-name>"}}"#,
        ];
        let p = parse(&(lines.join("\n") + "\n"), None).unwrap();
        assert_eq!(p.format, Format::ClaudeCode);
        let c = &p.conversations[0];
        assert_eq!(
            (c.id.as_deref(), c.title.as_deref()),
            (Some("S"), Some("Fix CI"))
        );
        let got: Vec<(Role, &str)> = c
            .episodes
            .iter()
            .map(|e| (e.role, e.content.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (Role::User, "Why does CI fail?"),
                (Role::Assistant, "Let me look."),
                (Role::Assistant, "The lockfile is stale.")
            ]
        );

        let with_tools = parse_bytes(
            "t",
            (lines.join("\n") + "\n").as_bytes(),
            None,
            Options {
                include_tools: true,
                ..Options::default()
            },
        )
        .unwrap();
        let c = &with_tools.conversations[0];
        assert!(
            c.episodes[1]
                .content
                .contains("[tool call Bash: {\"command\":\"ls\"}]")
        );
        assert_eq!(c.episodes[2].role, Role::Tool);
    }

    #[test]
    fn chatgpt_follows_the_current_branch() {
        let t = r#"[{"id":"c1","title":"T","current_node":"n3","mapping":{
            "root":{"id":"root","parent":null,"children":["n1"],"message":null},
            "n1":{"id":"n1","parent":"root","children":["n2","n3"],"message":{"id":"n1","author":{"role":"user"},"create_time":1700000000.0,"content":{"content_type":"text","parts":["Question?"]}}},
            "n2":{"id":"n2","parent":"n1","children":[],"message":{"id":"n2","author":{"role":"assistant"},"content":{"content_type":"text","parts":["Old answer"]}}},
            "n3":{"id":"n3","parent":"n1","children":[],"message":{"id":"n3","author":{"role":"assistant"},"content":{"content_type":"text","parts":["New answer"]}}}}}]"#;
        let p = parse(t, None).unwrap();
        assert_eq!(p.format, Format::ChatGpt);
        let c = &p.conversations[0];
        let texts: Vec<&str> = c.episodes.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(texts, vec!["Question?", "New answer"]);
        assert_eq!(c.episodes[0].timestamp_ms, Some(1_700_000_000_000));
    }
}
