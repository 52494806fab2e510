//! Reading transcript files, inside the sandbox: format detection and the parsers, fed in
//! chunks of bytes. This module holds the streaming machinery (chunks, lines, one JSON value at
//! a time, the split of long episodes); each format reads its records in its own file: JSON
//! lines (`jsonl.rs`), OpenAI messages (`openai.rs`), Claude Code session JSONL
//! (`claude_code.rs`), Codex rollouts (`codex.rs`) and ChatGPT `conversations.json`
//! (`chatgpt.rs`), with the fields they share in `fields.rs`.
//!
//! Transcripts are the most hostile input abridge reads, so they are parsed here, under the
//! guest's fuel and memory limits: a parser bug ends in a bounded, reported error. Memory is
//! bounded by one line (line formats) or one array element (a ChatGPT export is read one
//! conversation at a time), never by the file. Episodes longer than `max_episode_bytes` are
//! split into parts at paragraph, line, sentence or word boundaries before they leave the
//! parser, so no single episode can outgrow what a summarization call can hold.
//!
//! Parsing is all-or-nothing per line: a malformed line is an error with its line number
//! (unless `skip_invalid`), except a partial last line with no newline, which a live Claude
//! Code session is still writing: it is skipped with a warning.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::types::Role;

mod chatgpt;
mod claude_code;
mod codex;
mod fields;
mod jsonl;
mod openai;

use chatgpt::*;
use claude_code::*;
use codex::*;
use fields::*;
pub use fields::{parse_timestamp, position_key, strip_harness};
use jsonl::*;
use openai::*;

/// A transcript format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line: `{"role", "content", "timestamp"?, "id"?}` (the time may
    /// also be `created_at`, `time`, `create_time` or `created`).
    Jsonl,
    /// An OpenAI messages array, or `{"messages": [...]}`.
    OpenAi,
    /// A Claude Code session file.
    ClaudeCode,
    /// A ChatGPT data export (`conversations.json`).
    ChatGpt,
    /// A Codex CLI session file (rollout JSON lines: `{"timestamp", "type", "payload"}`).
    Codex,
}

impl Format {
    /// The name used on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::OpenAi => "openai",
            Format::ClaudeCode => "claude-code",
            Format::ChatGpt => "chatgpt",
            Format::Codex => "codex",
        }
    }
}

/// Default most bytes in one episode; longer messages are split into parts.
pub const DEFAULT_MAX_EPISODE_BYTES: u32 = 64 << 10;

/// Most bytes of one line, or of one element of a document's array: past this, the line is
/// malformed (its bytes are dropped as they arrive, so memory stays bounded).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Most bytes of a whole-document transcript that is not a top-level array (`{"messages":
/// [...]}`, a single ChatGPT conversation): it is parsed in one piece.
pub const MAX_OBJECT_BYTES: usize = 32 << 20;

/// How to parse.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The format, or `None` to detect it.
    pub format: Option<Format>,
    /// Keep tool calls and tool results as episodes.
    pub include_tools: bool,
    /// Skip malformed lines with a warning instead of failing.
    pub skip_invalid: bool,
    /// Lines of the file before the first byte fed (a watcher resumes mid-file), so line
    /// numbers in messages and episode keys are the file's own.
    pub first_line: u32,
    /// The file's name, for messages.
    pub name: String,
    /// Longest episode in bytes (0: the default, 64 KiB).
    pub max_episode_bytes: u32,
    /// Deliver whole conversations: each batch holds only conversations that are complete
    /// (every episode, final id and title, never empty), in file order; a conversation is
    /// complete when the next one starts or at `finish`. Off: episodes as they complete.
    pub whole: bool,
    /// Most episodes the input may hold (0: no limit); past it the parse stops with
    /// [`ParseError::TooManyEpisodes`], so one input's cost stays bounded.
    pub max_episodes: u64,
}

/// An episode read from a transcript (tokens are estimated at append time).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedEpisode {
    /// Who spoke.
    pub role: Role,
    /// The text.
    pub content: String,
    /// When, ms since the epoch, if the format says.
    pub timestamp_ms: Option<i64>,
    /// Identifies the episode in its source (idempotent imports).
    pub source_key: String,
    /// The speaker's name, when the format gives one.
    pub speaker: Option<String>,
    /// A JSON-lines message's `item`, as compact JSON (see the WIT `parsed-episode.item`).
    pub item: Option<String>,
}

/// A message as a client posts it (the WIT `posted-message`): the fields the host decoded,
/// with `timestamp`, `id` and `item` as JSON text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Posted {
    /// Its role, as the client names it.
    pub role: String,
    /// Its text.
    pub content: String,
    /// When it was said (JSON text: ms since the epoch, or an RFC 3339 string).
    pub timestamp: Option<String>,
    /// The client's id (JSON text: a string or a number).
    pub id: Option<String>,
    /// The speaker's name.
    pub name: Option<String>,
    /// The client's own record of it (JSON text).
    pub item: Option<String>,
}

/// Posted message `n` (from 1) checked as `abridge ingest` checks its line `n`: the same
/// roles, times, ids, names and item bound. `Ok(None)` for a message with no text; `Err`
/// says what is wrong with it ("message N: …").
pub fn posted_episode(n: u32, m: &Posted) -> Result<Option<ParsedEpisode>, String> {
    let json = |what: &str, text: &Option<String>| -> Result<Option<Value>, String> {
        match text {
            None => Ok(None),
            Some(t) => serde_json::from_str(t)
                .map(Some)
                .map_err(|e| format!("message {n}: its {what} is not JSON ({e})")),
        }
    };
    let mut v = serde_json::Map::new();
    v.insert("role".into(), Value::String(m.role.clone()));
    v.insert("content".into(), Value::String(m.content.clone()));
    if let Some(name) = &m.name {
        v.insert("name".into(), Value::String(name.clone()));
    }
    for (key, text) in [
        ("timestamp", &m.timestamp),
        ("id", &m.id),
        ("item", &m.item),
    ] {
        if let Some(x) = json(key, text)? {
            v.insert(key.into(), x);
        }
    }
    jsonl::jsonl_episode(n, &Value::Object(v), true).map_err(|e| format!("message {n}: {e}"))
}

/// The largest `item` a message may carry, in bytes of compact JSON.
pub const MAX_ITEM_BYTES: usize = 256 * 1024;

/// Episodes of one conversation found in a chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct ConversationPart {
    /// The conversation's position in the file (0 for single-conversation formats).
    pub index: u32,
    /// Its own id, once known.
    pub id: Option<String>,
    /// Its title, once known.
    pub title: Option<String>,
    /// Its episodes found in this chunk, in order.
    pub episodes: Vec<ParsedEpisode>,
}

/// What one `feed` or `finish` yields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// The format, once known.
    pub format: Option<Format>,
    /// Conversations with episodes (or metadata) found.
    pub conversations: Vec<ConversationPart>,
    /// Lines skipped, and why (one line each, prefixed with the file name).
    pub warnings: Vec<String>,
}

/// The message for a parse error of the input `name`: what happened and how to fix it, the
/// same in every host. `format_flag` is how the host's user names a format (`--format`,
/// `format:`).
pub fn describe(name: &str, e: &ParseError, format_flag: &str) -> String {
    match e {
        ParseError::Utf8 { line, offset } => format!(
            "{name}:{line}: invalid UTF-8 at byte {offset} — re-encode the file as UTF-8 (for example: iconv -f latin1 -t utf-8)"
        ),
        ParseError::Malformed { line, message } => format!("{name}:{line}: {message}"),
        ParseError::UnknownFormat => format!(
            "cannot tell the format of {name} — pass {format_flag} jsonl|openai|claude-code|chatgpt"
        ),
        ParseError::EmptyFile => {
            format!("{name} is empty — nothing to import; check that it is the right file")
        }
        ParseError::NoMessages(f) => format!(
            "{name} holds no messages (read as {}) — check that it is the right file, or pass {format_flag}",
            f.name()
        ),
        ParseError::TooManyEpisodes(limit) => format!(
            "{name} holds more than {limit} messages, more than one import takes — split it into parts of at most {limit} messages"
        ),
    }
}

/// Why a transcript cannot be read. Messages say how to fix it.
#[derive(Clone, Debug, PartialEq)]
pub enum ParseError {
    /// Invalid UTF-8 at a 1-based line and byte offset.
    Utf8 {
        /// Line.
        line: u32,
        /// Byte offset in the file.
        offset: u64,
    },
    /// A malformed line (1-based), or document (line 1).
    Malformed {
        /// Line.
        line: u32,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Not a format this parser knows.
    UnknownFormat,
    /// Only white space.
    EmptyFile,
    /// Read as the format, but no messages.
    NoMessages(Format),
    /// More episodes than `Options::max_episodes` allows.
    TooManyEpisodes(u64),
}

/// A streaming transcript parser: [`feed`](Parser::feed) bytes in any chunking, then
/// [`finish`](Parser::finish); the episodes come out in order, whatever the chunk sizes.
pub struct Parser {
    opts: Options,
    max_episode: usize,
    /// Bytes consumed so far (file offsets in messages).
    offset: u64,
    /// Line number of the next line to complete, 1-based.
    line: u32,
    /// A BOM may only open the file.
    at_start: bool,
    mode: Mode,
    /// Whether any non-white-space byte was seen.
    seen_text: bool,
    episodes_out: u64,
    warnings: Vec<String>,
    out: Vec<ConversationPart>,
    /// Whole mode: conversations not complete yet.
    gathered: Vec<ConversationPart>,
    /// An error found after some episodes completed in the same call: those are returned
    /// first, and the error by the next call.
    pending: Option<ParseError>,
}

enum Mode {
    /// Format not known yet: bytes held until it is.
    Detect {
        held: Vec<u8>,
        /// How far into `held` the first value has been scanned (resumed on the next feed,
        /// so a large first object is scanned once, not once per feed).
        scan: FirstValue,
    },
    /// One JSON object per line.
    Lines {
        format: Format,
        carry: Carry,
        state: Box<LineState>,
    },
    /// A top-level array, one element at a time.
    Array {
        format: Option<Format>,
        scan: Scanner,
        element: Carry,
        index: u32,
        /// The line the current element started on.
        element_line: u32,
        /// Whether an element is in progress.
        in_element: bool,
        /// Whether the closing `]` was seen.
        closed: bool,
    },
    /// A top-level object, parsed whole at the end.
    Object {
        held: Vec<u8>,
        format: Option<Format>,
    },
    /// After an error: everything is ignored.
    Done,
}

/// The bytes of an incomplete line or element, held in the chunks they came in and joined
/// once, at its exact size, when it completes; past [`MAX_LINE_BYTES`] it only counts.
#[derive(Default)]
struct Carry {
    parts: Vec<Vec<u8>>,
    len: usize,
    /// The line's bytes went past the limit: they are dropped.
    overflow: bool,
}

impl Carry {
    fn push(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.len += bytes.len();
        if self.len > MAX_LINE_BYTES {
            self.overflow = true;
            self.parts.clear();
        } else {
            self.parts.push(bytes.to_vec());
        }
    }

    fn take(&mut self) -> (Vec<u8>, usize, bool) {
        let mut out = Vec::with_capacity(if self.overflow { 0 } else { self.len });
        for p in self.parts.drain(..) {
            out.extend_from_slice(&p);
        }
        let r = (out, self.len, self.overflow);
        self.len = 0;
        self.overflow = false;
        r
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Per-conversation state of the line formats.
#[derive(Default)]
struct LineState {
    id: Option<String>,
    title: Option<String>,
    /// Claude Code: the assistant message id of the held episode, which later lines of the
    /// same API response extend.
    open_turn: Option<String>,
    /// Claude Code: the last assistant episode, held until no later line can extend it.
    held: Option<ParsedEpisode>,
    /// Whether id/title changed since the last batch.
    meta_dirty: bool,
    /// Claude Code: the action line of each tool call seen, by tool-use id, so a failed
    /// result can say which call failed (bounded: the oldest are forgotten).
    calls: BTreeMap<String, String>,
}

/// Detection's progress through the first value: the scanner's state, how many held bytes it
/// has seen, and whether a line break came before the value closed.
#[derive(Default, Clone, Copy)]
struct FirstValue {
    scan: Scanner,
    scanned: usize,
    newline: bool,
    /// The value closed on its first line: the format is read from the lines.
    one_line: bool,
}

/// Finds where JSON values end: strings, escapes and nesting depth, one byte at a time.
#[derive(Default, Clone, Copy)]
struct Scanner {
    depth: u32,
    in_string: bool,
    escape: bool,
}

impl Scanner {
    /// Advance over `b`; returns the depth after it.
    fn step(&mut self, b: u8) -> u32 {
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
            }
        } else {
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        self.depth
    }
}

fn malformed(line: u32, message: impl Into<String>) -> ParseError {
    ParseError::Malformed {
        line,
        message: message.into(),
    }
}

impl Parser {
    /// A parser with `opts`.
    pub fn new(opts: Options) -> Parser {
        let max_episode = match opts.max_episode_bytes {
            0 => DEFAULT_MAX_EPISODE_BYTES,
            n => n.max(256),
        } as usize;
        let line = opts.first_line + 1;
        Parser {
            opts,
            max_episode,
            offset: 0,
            line,
            at_start: true,
            mode: Mode::Detect {
                held: Vec::new(),
                scan: FirstValue::default(),
            },
            seen_text: false,
            episodes_out: 0,
            warnings: Vec::new(),
            out: Vec::new(),
            gathered: Vec::new(),
            pending: None,
        }
    }

    /// The format, once known.
    pub fn format(&self) -> Option<Format> {
        match &self.mode {
            Mode::Lines { format, .. } => Some(*format),
            Mode::Array { format, .. } | Mode::Object { format, .. } => *format,
            Mode::Detect { .. } | Mode::Done => self.opts.format,
        }
    }

    /// Parse the next bytes; returns the episodes they completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Batch, ParseError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let mut chunk = chunk;
        if self.at_start && !chunk.is_empty() {
            // A UTF-8 byte-order mark may open the file (possibly split across feeds: a
            // BOM in pieces is rare enough to read as text).
            if let Some(rest) = chunk.strip_prefix(b"\xEF\xBB\xBF") {
                chunk = rest;
                self.offset += 3;
            }
            self.at_start = false;
        }
        if !self.seen_text && chunk.iter().any(|b| !b.is_ascii_whitespace()) {
            self.seen_text = true;
        }
        let r = self.consume(chunk, false);
        self.batch(r, false)
    }

    /// End of input: the last line (even without a newline), the held episode, and the
    /// checks that need the whole file.
    pub fn finish(&mut self) -> Result<Batch, ParseError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let r = self.consume(&[], true);
        let r = r.and_then(|()| {
            if !self.seen_text {
                return Err(ParseError::EmptyFile);
            }
            if let Mode::Lines { state, .. } = &mut self.mode
                && let Some(ep) = state.held.take()
            {
                let meta = (state.id.clone(), state.title.clone());
                self.emit_to(0, meta, ep);
            }
            Ok(())
        });
        let mut b = self.batch(r, true)?;
        let total = self.episodes_out;
        if total == 0 {
            return Err(match self.format() {
                Some(f) => ParseError::NoMessages(f),
                None => ParseError::UnknownFormat,
            });
        }
        b.format = self.format();
        Ok(b)
    }

    fn batch(&mut self, r: Result<(), ParseError>, end: bool) -> Result<Batch, ParseError> {
        let max = self.opts.max_episodes;
        let r = match r {
            Ok(()) if max > 0 && self.episodes_out > max => {
                // Nothing of an input over the limit is delivered.
                self.out.clear();
                Err(ParseError::TooManyEpisodes(max))
            }
            r => r,
        };
        if let Err(e) = r {
            self.mode = Mode::Done;
            if self.opts.whole || self.out.iter().all(|c| c.episodes.is_empty()) {
                // Whole conversations are all or nothing: an error delivers none of them.
                self.gathered.clear();
                self.out.clear();
                return Err(e);
            }
            // Episodes that completed before the error are delivered first.
            self.pending = Some(e);
        }
        if let Mode::Lines { state, .. } = &mut self.mode
            && state.meta_dirty
        {
            state.meta_dirty = false;
            if !self.out.iter().any(|c| c.index == 0) {
                self.out.push(ConversationPart {
                    index: 0,
                    id: state.id.clone(),
                    title: state.title.clone(),
                    episodes: Vec::new(),
                });
            }
            for c in &mut self.out {
                c.id = state.id.clone();
                c.title = state.title.clone();
            }
        }
        let mut conversations = std::mem::take(&mut self.out);
        if self.opts.whole {
            conversations = self.gather(conversations, end);
        }
        Ok(Batch {
            format: self.format(),
            conversations,
            warnings: std::mem::take(&mut self.warnings),
        })
    }

    /// Whole mode: add `parts` to the conversations being gathered and hand back those that
    /// are complete (every index below the newest, or all of them at the end), empty ones
    /// dropped, in file order.
    fn gather(&mut self, parts: Vec<ConversationPart>, end: bool) -> Vec<ConversationPart> {
        for p in parts {
            match self.gathered.iter_mut().find(|c| c.index == p.index) {
                Some(c) => {
                    c.id = p.id.or(c.id.take());
                    c.title = p.title.or(c.title.take());
                    c.episodes.extend(p.episodes);
                }
                None => self.gathered.push(p),
            }
        }
        let newest = self.gathered.iter().map(|c| c.index).max().unwrap_or(0);
        let (mut done, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.gathered)
            .into_iter()
            .partition(|c| end || c.index < newest);
        self.gathered = open;
        done.retain(|c| !c.episodes.is_empty());
        done.sort_by_key(|c| c.index);
        done
    }

    fn consume(&mut self, chunk: &[u8], end: bool) -> Result<(), ParseError> {
        match &mut self.mode {
            Mode::Done => Ok(()),
            Mode::Detect { held, scan } => {
                held.extend_from_slice(chunk);
                let (held, mut scan) = (std::mem::take(held), *scan);
                match self.detect(&held, &mut scan, end)? {
                    Some(mode) => {
                        self.mode = mode;
                        // Replay what was held through the chosen mode.
                        self.consume_in_mode(&held, end)
                    }
                    None => {
                        self.mode = Mode::Detect { held, scan };
                        Ok(())
                    }
                }
            }
            _ => self.consume_in_mode(chunk, end),
        }
    }

    /// Decide the format from the bytes held so far; `None` to wait for more.
    fn detect(
        &self,
        held: &[u8],
        fv: &mut FirstValue,
        end: bool,
    ) -> Result<Option<Mode>, ParseError> {
        let lines = || Mode::Lines {
            format: Format::Jsonl,
            carry: Carry::default(),
            state: Box::default(),
        };
        let array = |format| Mode::Array {
            format,
            scan: Scanner::default(),
            element: Carry::default(),
            index: 0,
            element_line: 0,
            in_element: false,
            closed: false,
        };
        if let Some(f) = self.opts.format {
            return Ok(Some(match f {
                Format::Jsonl | Format::ClaudeCode | Format::Codex => Mode::Lines {
                    format: f,
                    carry: Carry::default(),
                    state: Box::default(),
                },
                Format::OpenAi | Format::ChatGpt => {
                    match held.iter().find(|b| !b.is_ascii_whitespace()) {
                        Some(b'[') => array(Some(f)),
                        Some(_) => Mode::Object {
                            held: Vec::new(),
                            format: Some(f),
                        },
                        None if end => return Err(ParseError::EmptyFile),
                        None => return Ok(None),
                    }
                }
            }));
        }
        let Some(first) = held.iter().position(|b| !b.is_ascii_whitespace()) else {
            return if end {
                Err(ParseError::EmptyFile)
            } else {
                Ok(None)
            };
        };
        match held[first] {
            // An array is a document: its first object element names the format.
            b'[' => Ok(Some(array(None))),
            b'{' => {
                // Where does the first value end? On its first line: JSON lines, whose first
                // lines name the format. Later: a document object (pretty-printed).
                let from = fv.scanned.max(first);
                if fv.one_line {
                    return self.detect_lines(held, end).map(|f| f.map(line_or_doc));
                }
                for &b in &held[from..] {
                    fv.scanned += 1;
                    if b == b'\n' {
                        fv.newline = true;
                    }
                    if fv.scan.step(b) == 0 {
                        fv.one_line = !fv.newline;
                        if !fv.newline {
                            // One value on the first line: a line format, or a one-line
                            // document; look at up to 20 lines.
                            return self.detect_lines(held, end).map(|f| f.map(line_or_doc));
                        }
                        return Ok(Some(Mode::Object {
                            held: Vec::new(),
                            format: None,
                        }));
                    }
                }
                // Not closed yet: wait, unless the file ended or the wait grew too long (a
                // malformed first line that never closes): read it as lines.
                if end || held.len() > MAX_OBJECT_BYTES {
                    return self.detect_lines(held, true).map(|f| {
                        Some(match f {
                            Some(LineOrDoc::Line(format)) => Mode::Lines {
                                format,
                                carry: Carry::default(),
                                state: Box::default(),
                            },
                            _ => lines(),
                        })
                    });
                }
                Ok(None)
            }
            _ => Err(ParseError::UnknownFormat),
        }
    }

    /// Look at the first 20 non-blank lines for one that names a line format.
    fn detect_lines(&self, held: &[u8], end: bool) -> Result<Option<LineOrDoc>, ParseError> {
        let mut seen = 0;
        let complete = match held.iter().rposition(|&b| b == b'\n') {
            Some(i) => &held[..=i],
            None if end => held,
            None => return Ok(None),
        };
        let mut lines: Vec<&[u8]> = complete.split(|&b| b == b'\n').collect();
        if !end && held.last() != Some(&b'\n') {
            // The last piece is incomplete.
            lines.pop();
        }
        let mut start = 0u64;
        for (i, line) in lines.into_iter().enumerate() {
            let line_start = start;
            start += line.len() as u64 + 1;
            if let Err(e) = std::str::from_utf8(line) {
                if self.opts.skip_invalid {
                    continue;
                }
                return Err(ParseError::Utf8 {
                    line: self.opts.first_line + i as u32 + 1,
                    offset: line_start + e.valid_up_to() as u64,
                });
            }
            let t = trim_ascii(line);
            if t.is_empty() {
                continue;
            }
            seen += 1;
            if let Ok(v) = serde_json::from_slice::<Value>(t) {
                if seen == 1
                    && let Value::Object(o) = &v
                    && (o.contains_key("mapping")
                        || o.contains_key("conversations")
                        || o.contains_key("messages"))
                {
                    return Ok(Some(LineOrDoc::Doc));
                }
                if let Some(f) = line_format(&v) {
                    return Ok(Some(LineOrDoc::Line(f)));
                }
            }
            if seen >= 20 {
                return Err(ParseError::UnknownFormat);
            }
        }
        if end {
            Err(ParseError::UnknownFormat)
        } else {
            Ok(None)
        }
    }

    fn consume_in_mode(&mut self, chunk: &[u8], end: bool) -> Result<(), ParseError> {
        match &mut self.mode {
            Mode::Lines { .. } => self.consume_lines(chunk, end),
            Mode::Array { .. } => self.consume_array(chunk, end),
            Mode::Object { held, .. } => {
                if held.len() + chunk.len() > MAX_OBJECT_BYTES {
                    return Err(malformed(
                        1,
                        format!(
                            "a transcript that is one JSON object is read whole, and this one is over {} MiB — a ChatGPT export's conversations.json (an array) is read one conversation at a time; split the file, or convert it to JSON lines",
                            MAX_OBJECT_BYTES >> 20
                        ),
                    ));
                }
                held.extend_from_slice(chunk);
                if end {
                    let held = std::mem::take(held);
                    self.object_document(&held)?;
                }
                Ok(())
            }
            Mode::Detect { .. } | Mode::Done => Ok(()),
        }
    }

    // ---- line formats -------------------------------------------------------------------

    fn consume_lines(&mut self, chunk: &[u8], end: bool) -> Result<(), ParseError> {
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(nl + 1);
            rest = tail;
            let Mode::Lines { carry, .. } = &mut self.mode else {
                unreachable!()
            };
            carry.push(&head[..head.len() - 1]);
            let (line, len, overflow) = carry.take();
            let start = self.offset;
            self.offset += len as u64 + 1;
            let n = self.line;
            self.line += 1;
            self.line_complete(n, start, &line, overflow, false)?;
        }
        let Mode::Lines { carry, .. } = &mut self.mode else {
            unreachable!()
        };
        carry.push(rest);
        if end && !carry.is_empty() {
            let (line, len, overflow) = carry.take();
            let start = self.offset;
            self.offset += len as u64;
            let n = self.line;
            self.line_complete(n, start, &line, overflow, true)?;
        }
        Ok(())
    }

    /// One complete line (`last_partial`: the file's last line, with no newline).
    fn line_complete(
        &mut self,
        n: u32,
        start: u64,
        line: &[u8],
        overflow: bool,
        last_partial: bool,
    ) -> Result<(), ParseError> {
        let name = self.opts.name.clone();
        if overflow {
            let m = format!(
                "the line is over {} MiB, too long for a message",
                MAX_LINE_BYTES >> 20
            );
            return self.bad_line(n, m, "split the message, or pass --skip-invalid to skip it");
        }
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(e) => {
                if self.opts.skip_invalid {
                    self.warnings
                        .push(format!("{name}:{n}: invalid UTF-8; skipped"));
                    return Ok(());
                }
                return Err(ParseError::Utf8 {
                    line: n,
                    offset: start + e.valid_up_to() as u64,
                });
            }
        };
        if text.trim().is_empty() {
            return Ok(());
        }
        match serde_json::from_str::<Value>(text) {
            Ok(v) if v.is_object() => self.line_value(n, v),
            Ok(_) => self.bad_line(
                n,
                "expected a JSON object on this line".into(),
                "fix the line, or pass --skip-invalid to skip bad lines",
            ),
            Err(e) if last_partial => {
                let _ = e;
                self.warnings.push(format!(
                    "{name}:{n}: partial last line (still being written?) skipped"
                ));
                Ok(())
            }
            Err(e) => self.bad_line(
                n,
                format!("not valid JSON ({e})"),
                "fix the line, or pass --skip-invalid to skip bad lines",
            ),
        }
    }

    fn bad_line(&mut self, n: u32, what: String, fix: &str) -> Result<(), ParseError> {
        if self.opts.skip_invalid {
            self.warnings
                .push(format!("{}:{n}: {what}; skipped", self.opts.name));
            Ok(())
        } else {
            Err(malformed(n, format!("{what} — {fix}")))
        }
    }

    fn line_value(&mut self, n: u32, v: Value) -> Result<(), ParseError> {
        let Mode::Lines { format, state, .. } = &mut self.mode else {
            unreachable!()
        };
        let format = *format;
        let include_tools = self.opts.include_tools;
        match format {
            Format::Jsonl => match jsonl_episode(n, &v, include_tools) {
                Ok(Some(ep)) => {
                    self.emit_single(ep);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(m) => self.bad_line(
                    n,
                    m,
                    "fix the line, or pass --skip-invalid to skip bad lines",
                ),
            },
            Format::Codex => {
                let eps = codex_line(state, &v, include_tools, n);
                let meta = (state.id.clone(), state.title.clone());
                for ep in eps {
                    self.emit_to(0, meta.clone(), ep);
                }
                Ok(())
            }
            _ => {
                let eps = claude_code_line(state, &v, include_tools, self.episodes_out);
                let meta = (state.id.clone(), state.title.clone());
                for ep in eps {
                    self.emit_to(0, meta.clone(), ep);
                }
                Ok(())
            }
        }
    }

    // ---- documents ----------------------------------------------------------------------

    fn consume_array(&mut self, chunk: &[u8], end: bool) -> Result<(), ParseError> {
        // Where the element in progress starts in this chunk (it may have begun earlier).
        let mut elem_start: Option<usize> = match &self.mode {
            Mode::Array {
                in_element: true, ..
            } => Some(0),
            _ => None,
        };
        for (i, &b) in chunk.iter().enumerate() {
            let Mode::Array {
                scan,
                element,
                element_line,
                in_element,
                closed,
                ..
            } = &mut self.mode
            else {
                unreachable!()
            };
            let before = *scan;
            scan.step(b);
            if before.depth == 0 {
                if b == b'[' && !*closed {
                    // The array opens.
                } else if !b.is_ascii_whitespace() {
                    let line = self.line;
                    return Err(malformed(
                        line,
                        "unexpected text after the closing ']' — a transcript array must be the whole file",
                    ));
                }
            } else if before.depth == 1 && !before.in_string {
                match b {
                    b',' | b']' => {
                        if b == b']' {
                            *closed = true;
                        }
                        if *in_element {
                            element.push(&chunk[elem_start.unwrap_or(0)..i]);
                            *in_element = false;
                            elem_start = None;
                            let (bytes, _, overflow) = element.take();
                            let line = *element_line;
                            self.offset += 1;
                            self.array_element(line, &bytes, overflow)?;
                            continue;
                        }
                    }
                    c if c.is_ascii_whitespace() => {}
                    _ => {
                        if !*in_element {
                            *in_element = true;
                            *element_line = self.line;
                            elem_start = Some(i);
                        }
                    }
                }
            }
            if b == b'\n' {
                self.line += 1;
            }
            self.offset += 1;
        }
        if let Mode::Array {
            element,
            in_element: true,
            ..
        } = &mut self.mode
        {
            element.push(&chunk[elem_start.unwrap_or(0)..]);
        }
        if end {
            let Mode::Array { scan, closed, .. } = &self.mode else {
                unreachable!()
            };
            if scan.depth > 0 || !*closed {
                let line = self.line;
                return Err(malformed(
                    line,
                    "the file ends inside the JSON array (truncated?) — check that the whole export was copied",
                ));
            }
        }
        Ok(())
    }

    fn array_element(&mut self, line: u32, bytes: &[u8], overflow: bool) -> Result<(), ParseError> {
        let Mode::Array { format, index, .. } = &mut self.mode else {
            unreachable!()
        };
        let i = *index;
        *index += 1;
        if overflow {
            return Err(malformed(
                line,
                format!(
                    "element {i} of the array is over {} MiB — split the file",
                    MAX_LINE_BYTES >> 20
                ),
            ));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| ParseError::Utf8 {
            line,
            offset: self.offset.saturating_sub(bytes.len() as u64) + e.valid_up_to() as u64,
        })?;
        let v: Value = serde_json::from_str(text).map_err(|e| {
            malformed(
                line + e.line() as u32 - 1,
                format!("not valid JSON ({e}) — a ChatGPT export is the conversations.json file from the export zip; an OpenAI messages file is one JSON array"),
            )
        })?;
        if format.is_none() {
            if !v.is_object() {
                return Err(ParseError::UnknownFormat);
            }
            *format = if v.get("mapping").is_some() {
                Some(Format::ChatGpt)
            } else if v.get("role").is_some() {
                Some(Format::OpenAi)
            } else {
                return Err(ParseError::UnknownFormat);
            };
        }
        match format.expect("set above") {
            Format::ChatGpt => {
                let (conv, warnings) = chatgpt_conversation(&self.opts, i, &v)?;
                self.warnings.extend(warnings);
                self.emit_conversation(i, conv);
            }
            _ => {
                if let Some(ep) = openai_message(&self.opts, i, &v)? {
                    self.emit_single(ep);
                }
            }
        }
        Ok(())
    }

    /// An episode of conversation `index`, with what is known of its id and title.
    fn emit_to(&mut self, index: u32, meta: (Option<String>, Option<String>), ep: ParsedEpisode) {
        emit(
            &mut self.out,
            &mut self.episodes_out,
            self.max_episode,
            index,
            meta,
            ep,
        );
    }

    /// An episode of the file's one conversation (formats without conversation metadata).
    fn emit_single(&mut self, ep: ParsedEpisode) {
        self.emit_to(0, (None, None), ep);
    }

    fn emit_conversation(&mut self, index: u32, conv: Conversation) {
        let meta = (conv.id, conv.title);
        if conv.episodes.is_empty() {
            return;
        }
        for ep in conv.episodes {
            self.emit_to(index, meta.clone(), ep);
        }
    }

    /// A whole document that is one object: `{"messages": [...]}`, `{"conversations":
    /// [...]}`, one ChatGPT conversation, or a single JSON line.
    fn object_document(&mut self, held: &[u8]) -> Result<(), ParseError> {
        let text = std::str::from_utf8(held).map_err(|e| {
            let offset = e.valid_up_to();
            ParseError::Utf8 {
                line: self.opts.first_line
                    + 1
                    + held[..offset].iter().filter(|&&b| b == b'\n').count() as u32,
                offset: offset as u64,
            }
        })?;
        let Mode::Object { format, .. } = &mut self.mode else {
            unreachable!()
        };
        let forced = *format;
        let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
            malformed(
                e.line() as u32,
                format!("not valid JSON ({e}) — a ChatGPT export is the conversations.json file from the export zip; an OpenAI messages file is one JSON array"),
            )
        })?;
        let Value::Object(o) = &v else {
            return Err(malformed(1, "expected a JSON object or array"));
        };
        let detected = if o.contains_key("mapping") || o.contains_key("conversations") {
            Some(Format::ChatGpt)
        } else if o.contains_key("messages") {
            Some(Format::OpenAi)
        } else {
            None
        };
        let format = match forced.or(detected) {
            Some(f) => f,
            None => {
                // A single JSON line that names a line format.
                let Some(f) = line_format(&v) else {
                    return Err(ParseError::UnknownFormat);
                };
                self.mode = Mode::Lines {
                    format: f,
                    carry: Carry::default(),
                    state: Box::default(),
                };
                return self.line_value(self.opts.first_line + 1, v);
            }
        };
        self.mode = Mode::Object {
            held: Vec::new(),
            format: Some(format),
        };
        match format {
            Format::ChatGpt => {
                let convs: Vec<&Value> = match o.get("conversations") {
                    Some(Value::Array(a)) => a.iter().collect(),
                    Some(_) => Vec::new(),
                    None => vec![&v],
                };
                for (i, c) in convs.into_iter().enumerate() {
                    let (conv, warnings) = chatgpt_conversation(&self.opts, i as u32, c)?;
                    self.warnings.extend(warnings);
                    self.emit_conversation(i as u32, conv);
                }
            }
            _ => {
                let msgs = o.get("messages").and_then(Value::as_array).ok_or_else(|| {
                    malformed(1, "expected a messages array or {\"messages\": [...]}")
                })?;
                for (i, m) in msgs.iter().enumerate() {
                    if let Some(ep) = openai_message(&self.opts, i as u32, m)? {
                        self.emit_single(ep);
                    }
                }
            }
        }
        Ok(())
    }
}

enum LineOrDoc {
    Line(Format),
    Doc,
}

/// The mode for what [`Parser::detect_lines`] found.
fn line_or_doc(f: LineOrDoc) -> Mode {
    match f {
        LineOrDoc::Line(format) => Mode::Lines {
            format,
            carry: Carry::default(),
            state: Box::default(),
        },
        LineOrDoc::Doc => Mode::Object {
            held: Vec::new(),
            format: None,
        },
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &b[start..end]
}

/// One conversation read whole (ChatGPT).
struct Conversation {
    id: Option<String>,
    title: Option<String>,
    episodes: Vec<ParsedEpisode>,
}

/// Add an episode to the output of conversation `index`, split into parts when it is longer
/// than `max` bytes.
fn emit(
    out: &mut Vec<ConversationPart>,
    count: &mut u64,
    max: usize,
    index: u32,
    (id, title): (Option<String>, Option<String>),
    ep: ParsedEpisode,
) {
    let part = match out.iter_mut().position(|c| c.index == index) {
        Some(i) => &mut out[i],
        None => {
            out.push(ConversationPart {
                index,
                id: id.clone(),
                title: title.clone(),
                episodes: Vec::new(),
            });
            out.last_mut().expect("just pushed")
        }
    };
    if id.is_some() {
        part.id = id;
    }
    if title.is_some() {
        part.title = title;
    }
    for ep in in_parts(ep, max) {
        *count += 1;
        part.episodes.push(ep);
    }
}

/// An episode of more than `max` bytes as consecutive parts of at most `max` (each keyed
/// `KEY#partI/N`; the item stays with none of them); a smaller one as it is.
pub fn in_parts(ep: ParsedEpisode, max: usize) -> Vec<ParsedEpisode> {
    if ep.content.len() <= max {
        return vec![ep];
    }
    let pieces = split_parts(&ep.content, max);
    let n = pieces.len();
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, piece)| ParsedEpisode {
            item: None,
            role: ep.role,
            content: piece.to_string(),
            timestamp_ms: ep.timestamp_ms,
            source_key: format!("{}#part{}/{n}", ep.source_key, i + 1),
            speaker: ep.speaker.clone(),
        })
        .collect()
}

/// Split `text` into pieces of at most `max` bytes, each ending at the coarsest boundary
/// (paragraph, line, sentence, word) found in the back half of the window, else at a
/// character boundary. The pieces concatenate back to `text`. Linear time.
pub fn split_parts(text: &str, max: usize) -> Vec<&str> {
    let max = max.max(4);
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut end = max;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let window = &rest[..end];
        let half = end / 2;
        let cut = [
            window.rfind("\n\n").map(|i| i + 2),
            window.rfind('\n').map(|i| i + 1),
            window.rfind(". ").map(|i| i + 2),
            window.rfind(' ').map(|i| i + 1),
        ]
        .into_iter()
        .flatten()
        .find(|&c| c >= half)
        .unwrap_or(end);
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out.push(rest);
    out
}

#[cfg(test)]
mod tests;
