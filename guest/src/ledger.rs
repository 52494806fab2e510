//! The facts ledger: identifiers taken from episodes deterministically and carried beside the
//! summary prose, so an identifier survives even when the model's prose drops it.
//!
//! What counts as an identifier (each recognised by a fixed rule, no model involved):
//!
//! * `command`: a line starting with `$ ` (the rest of the line), or a backtick span that
//!   contains a space (`` `cargo test --workspace` ``);
//! * `code`: a backtick span without a space that no rule below claims (`` `HashMap::new` ``;
//!   `` `src/main.rs` `` is a path);
//! * `url`: `http://…` or `https://…`, trailing punctuation removed;
//! * `email`: `name@host.tld`;
//! * `path`: a token with a `/` between path characters (`src/main.rs`, `~/.config/x`,
//!   `/etc/hosts`), or a file name with a known extension (`Cargo.toml`, `notes.md`);
//! * `version`: `v1.2`, or three or more dotted numbers (`1.95.0`, `48.0.8`);
//! * `date`: `2026-11-24`, or `24/11/2026`-style day-month-year numbers;
//! * `number`: a number with a unit (`250 ms`, `16 GB`, `12%`, `$4.50`, `3 replicas`);
//! * `ticket`: `#123`, `ABC-123`, `GH-7`;
//! * `name`: a quoted name of one to six words (`"Project Falcon"`, `“Blue Harbor”`), or a
//!   run of capitalised words that does not open a sentence (people, places, organisations,
//!   titles: `Caroline`, `Harbor Inn`, `Bank of America`); a word that opens a sentence
//!   counts when the same text also uses it inside one;
//! * `date` also takes dates written out (`8 May, 2023`, `May 8th`, `March 2022`), and a
//!   relative date resolved against the message's time (`yesterday (= 7 May 2023)` gives
//!   `7 May 2023`, see [`crate::dates`]).
//!
//! Merging and the budget: entries are keyed by their text; merging sums the mention counts
//! and keeps the newest episode seen. A ledger is kept within a token budget by one
//! documented policy: entries mentioned at least [`FREQUENT`] times are kept first (most
//! mentioned first, then newest), up to half the budget; the rest of the budget goes to the
//! newest entries (by the episode last seen in, then by count). What the budget drops is
//! counted in the row's `ledger-dropped`, never silently lost.
//!
//! Where budgets apply: a row keeps its whole ledger (up to [`STORED_TOKENS`], a bound against
//! hostile input, far above any real session's); budgets are applied when it is read. A
//! compaction prompt gets the configured `ledger-tokens` slice ([`for_prompt`]); a fold prompt
//! none (the guest merges the ledger, not the model; the identifiers the summary mentions are
//! in it verbatim already, and the instructions say to copy them exactly); a context gets that slice
//! and then whatever room the budget has left after the summary and the recent messages, so
//! every identifier is shown whenever the budget can hold them.

use std::collections::{BTreeMap, BTreeSet};

use crate::tokens::estimate_tokens;

/// What kind of identifier an entry is (mirrors the WIT `identifier-kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A file or directory path.
    Path,
    /// A URL.
    Url,
    /// A shell command.
    Command,
    /// A code identifier in backticks.
    Code,
    /// A number with a unit.
    Number,
    /// A version.
    Version,
    /// A date.
    Date,
    /// An email address.
    Email,
    /// An issue or ticket id.
    Ticket,
    /// A quoted name.
    Name,
    /// Digest: a user's request, verbatim.
    Request,
    /// Digest: a file created.
    Created,
    /// Digest: a file edited.
    Edited,
    /// Digest: a file read.
    Read,
    /// Digest: a command or tool run.
    Ran,
    /// Digest: a failed tool call and its error.
    Failed,
    /// Digest: a to-do item.
    Todo,
    /// A person's fact as they said it, on its time line (see [`crate::facts`]): the text is
    /// the event's fields ([`crate::facts::encode`]).
    Fact,
}

impl Kind {
    /// The lower-case name used in goldens and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Path => "path",
            Kind::Url => "url",
            Kind::Command => "command",
            Kind::Code => "code",
            Kind::Number => "number",
            Kind::Version => "version",
            Kind::Date => "date",
            Kind::Email => "email",
            Kind::Ticket => "ticket",
            Kind::Name => "name",
            Kind::Request => "request",
            Kind::Created => "created",
            Kind::Edited => "edited",
            Kind::Read => "read",
            Kind::Ran => "ran",
            Kind::Failed => "failed",
            Kind::Todo => "todo",
            Kind::Fact => "fact",
        }
    }

    /// Whether the kind belongs to the coding-session digest (not an identifier).
    pub fn is_digest(self) -> bool {
        matches!(
            self,
            Kind::Request
                | Kind::Created
                | Kind::Edited
                | Kind::Read
                | Kind::Ran
                | Kind::Failed
                | Kind::Todo
        )
    }

    /// Whether the kind is a fact's event (neither an identifier nor the digest's).
    pub fn is_fact(self) -> bool {
        self == Kind::Fact
    }

    /// The group an entry is keyed in with its text: identifiers share one; a file's three
    /// kinds share one (a file read, then edited, is one entry); every other digest kind is
    /// its own.
    pub fn group(self) -> u8 {
        match self {
            Kind::Created | Kind::Edited | Kind::Read => 1,
            Kind::Request => 2,
            Kind::Ran => 3,
            Kind::Failed => 4,
            Kind::Todo => 5,
            Kind::Fact => 6,
            _ => 0,
        }
    }
}

/// One ledger entry (mirrors the WIT `ledger-entry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The identifier, verbatim.
    pub text: String,
    /// Its kind.
    pub kind: Kind,
    /// The episode it was last seen in.
    pub episode: u64,
    /// How often it was mentioned.
    pub count: u32,
}

/// A ledger and how many entries its budget dropped so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Entries in first-seen order.
    pub entries: Vec<Entry>,
    /// Entries the budget dropped, cumulative.
    pub dropped: u32,
}

/// Mentions that make an entry "frequent" (kept ahead of one-offs).
pub const FREQUENT: u32 = 3;

/// Longest identifier kept (characters); longer spans are prose, not identifiers.
const MAX_LEN: usize = 200;

/// File extensions that make a bare file name a path.
const EXTENSIONS: &[&str] = &[
    "rs",
    "toml",
    "md",
    "txt",
    "json",
    "jsonl",
    "yaml",
    "yml",
    "js",
    "mjs",
    "ts",
    "tsx",
    "jsx",
    "py",
    "go",
    "java",
    "kt",
    "c",
    "h",
    "cc",
    "cpp",
    "hpp",
    "cs",
    "rb",
    "php",
    "sh",
    "bash",
    "zsh",
    "sql",
    "html",
    "css",
    "scss",
    "xml",
    "csv",
    "lock",
    "cfg",
    "conf",
    "ini",
    "env",
    "log",
    "wit",
    "wasm",
    "proto",
    "dockerfile",
    "swift",
    "lua",
    "pdf",
    "png",
    "jpg",
    "svg",
    "zip",
    "gz",
    "tar",
    "db",
    "sqlite",
];

/// Units that make a number an identifier. The units of time come first ([`TIME_UNITS`]).
const UNITS: &[&str] = &[
    "ms", "s", "sec", "secs", "second", "seconds", "min", "mins", "minute", "minutes", "h", "hr",
    "hrs", "hour", "hours", "day", "days", "week", "weeks", "month", "months", "year", "years",
    "b", "kb", "mb", "gb", "tb", "kib", "mib", "gib", "tib", "bytes", "%", "px", "em", "rem", "k",
    "m", "tokens", "token", "rps", "rpm", "qps", "req/s", "usd", "eur", "gbp", "replicas", "nodes",
    "cores", "cpus", "threads", "workers", "users", "items", "rows", "requests", "retries",
    "times", "x", "ghz", "mhz", "hz", "kg", "g", "km", "mi", "cm", "mm", "°c", "°f", "degrees",
    "percent", "dollars", "euros",
];

/// The tools coding agents call, as their transcripts name them (Claude Code's and Codex's):
/// a tool's name in a transcript is the call's label, not a name the session is about.
const TOOL_NAMES: &[&str] = &[
    "Agent",
    "Bash",
    "BashOutput",
    "Edit",
    "ExitPlanMode",
    "Glob",
    "Grep",
    "KillShell",
    "LS",
    "MultiEdit",
    "NotebookEdit",
    "NotebookRead",
    "Read",
    "Skill",
    "SlashCommand",
    "Task",
    "TodoRead",
    "TodoWrite",
    "WebFetch",
    "WebSearch",
    "Write",
    "apply_patch",
    "shell",
    "update_plan",
    "view_image",
];

/// Units of time (the first of [`UNITS`], up to hours): a duration with decimals (`1.3s`,
/// `151.9 s`) is a measurement a tool printed (a build step, a test run), not an identifier
/// of the work.
const TIME_UNITS: &[&str] = UNITS.split_at(15).0;

/// A number with decimals and a unit of time, glued or as two tokens.
fn is_timing(n: &str, unit: &str) -> bool {
    n.contains('.') && is_number(n) && TIME_UNITS.contains(&unit.to_lowercase().as_str())
}

/// Characters that end a token (besides whitespace).
fn trim_token(t: &str) -> &str {
    t.trim_start_matches(['(', '[', '{', '<', '"', '\'', '“', '‘', '*'])
        .trim_end_matches([
            '.', ',', ';', ':', '!', '?', ')', ']', '}', '>', '"', '\'', '”', '’', '*',
        ])
}

fn push(out: &mut Vec<(Kind, String)>, kind: Kind, text: &str) {
    let t = text.trim();
    if t.is_empty() || t.chars().count() > MAX_LEN {
        return;
    }
    if !out.iter().any(|(_, x)| x == t) {
        out.push((kind, t.to_string()));
    }
}

/// Identifiers in `text`, in order of first appearance, each once.
pub fn extract(text: &str) -> Vec<(Kind, String)> {
    let mut out: Vec<(Kind, String)> = Vec::new();
    // Text outside backtick spans, for the token rules (a span is taken whole).
    let mut plain = String::with_capacity(text.len());
    // Commands on their own lines.
    for line in text.lines() {
        let l = line.trim_start();
        if let Some(cmd) = l.strip_prefix("$ ")
            && cmd.chars().any(char::is_alphanumeric)
        {
            push(&mut out, Kind::Command, cmd.trim());
        }
    }
    // Backtick spans (single backticks; fences are skipped as markers).
    let mut rest = text;
    while let Some(at) = rest.find('`') {
        plain.push_str(&rest[..at]);
        plain.push(' ');
        let after = &rest[at..];
        let ticks = after.chars().take_while(|&c| c == '`').count();
        if ticks >= 3 {
            // A fence: its lines are read as plain text (commands were taken above).
            rest = &after[ticks..];
            continue;
        }
        let inner = &after[1..];
        match inner.find(['`', '\n']) {
            Some(end) if inner.as_bytes()[end] == b'`' => {
                let span = inner[..end].trim();
                if span.chars().any(char::is_alphanumeric) {
                    let kind = if span.contains(' ') {
                        Kind::Command
                    } else {
                        classify(span).unwrap_or(Kind::Code)
                    };
                    push(&mut out, kind, span);
                }
                rest = &inner[end + 1..];
            }
            _ => rest = inner,
        }
    }
    plain.push_str(rest);
    quoted_names(&plain, &mut out);
    for d in crate::dates::written(&plain) {
        push(&mut out, Kind::Date, &d);
    }
    let lower = lower_words(&plain);
    if plain.contains("**") || plain.contains("__") {
        // Names: a plain one found only inside a bold label is left out (`**Bug Fixed**`);
        // a code-like one there stays (`**TypeScript**`). (The text outside bold starts from
        // what is taken already, as the whole text does, so both read quoted names alike.)
        let taken = out.len();
        let mut outside = out.clone();
        capitalised_names(&without_bold(&plain), &lower, &mut outside);
        capitalised_names(&plain, &lower, &mut out);
        let added = out.split_off(taken);
        out.extend(
            added
                .into_iter()
                .filter(|(_, n)| !is_plain(n) || outside[taken..].iter().any(|(_, o)| o == n)),
        );
    } else {
        capitalised_names(&plain, &lower, &mut out);
    }
    let words: Vec<&str> = plain.split_whitespace().collect();
    for (i, raw) in words.iter().enumerate() {
        let t = trim_token(raw);
        if t.is_empty() {
            continue;
        }
        if let Some(kind) = classify(t) {
            push(&mut out, kind, t);
            continue;
        }
        // A number followed by a unit word: "250 ms", "3 replicas".
        if is_number(t)
            && let Some(next) = words.get(i + 1)
        {
            let unit = trim_token(next);
            if UNITS.contains(&unit.to_lowercase().as_str()) && !is_timing(t, unit) {
                push(&mut out, Kind::Number, &format!("{t} {unit}"));
            }
        }
    }
    out
}

/// Quoted names: one to six words between double quotes (straight or curly), starting with a
/// capital or a digit (the quality gate's own quotation scanner finds the spans).
fn quoted_names(text: &str, out: &mut Vec<(Kind, String)>) {
    for inner in crate::quality::quoted_spans(text) {
        let words = inner.split_whitespace().count();
        let named = inner
            .chars()
            .next()
            .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit());
        if (1..=6).contains(&words) && named && inner.chars().count() <= 80 {
            push(out, Kind::Name, &inner);
        }
    }
}

/// Capitalised words that are not names: the pronoun, and words a sentence often starts
/// with after a colon or a quote.
const NOT_NAMES: &[&str] = &[
    "i", "i'm", "i've", "i'd", "i'll", "ok", "okay", "mr", "mrs", "ms", "dr", "st", "oh", "hi",
    "hey", "yes", "no", "the", "a", "an", "and", "but", "or", "so", "if", "it", "it's", "we",
    "you", "he", "she", "they", "this", "that", "my", "our", "your", "thanks", "thank",
];

/// Lower-case words that may join two capitalised ones inside a name ("Bank of America").
const NAME_JOINERS: &[&str] = &["of", "the", "de", "and", "du", "von", "van"];

/// A capitalised word of a name: `Lisbon`, `PostGIS`, `O'Neill`, `Jean-Luc` (a possessive
/// `'s` is not part of it); not a month or weekday (dates are their own rule).
fn name_word(raw: &str) -> Option<&str> {
    let t = trim_token(raw);
    let t = t
        .strip_suffix("'s")
        .or_else(|| t.strip_suffix("’s"))
        .unwrap_or(t);
    let mut chars = t.chars();
    let first = chars.next()?;
    let ok = first.is_uppercase()
        && t.chars().count() >= 2
        && t.chars()
            .all(|c| c.is_alphabetic() || c == '-' || c == '\'' || c == '’')
        && t.chars().any(char::is_lowercase)
        && !NOT_NAMES.contains(&t.to_lowercase().as_str())
        && !crate::dates::is_calendar_word(t);
    ok.then_some(t)
}

/// `text` with the insides of bold spans (`**Build Fixed**`, `__Note__`) blanked: in chat and
/// agent text a bold span is a heading or a label, whose capitals say nothing of a name.
fn without_bold(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut rest = line;
        while let Some(at) = rest.find("**").or_else(|| rest.find("__")) {
            let mark = &rest[at..at + 2];
            let Some(end) = rest[at + 2..].find(mark) else {
                break;
            };
            out.push_str(&rest[..at]);
            // A full stop ends the sentence the span was in, so words after it open one.
            out.push_str(" . ");
            rest = &rest[at + 2 + end + 2..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// The words `text` writes in lower case (letters only), each once.
fn lower_words(text: &str) -> BTreeSet<&str> {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|w| w.len() >= 2 && w.chars().all(|c| c.is_lowercase()))
        .collect()
}

/// A plain capitalised word (`Fixed`; not `TypeScript`, `GPT-4`, `iOS`).
fn plain_word(w: &str) -> bool {
    let mut cs = w.chars();
    cs.next().is_some_and(char::is_uppercase) && cs.all(char::is_lowercase)
}

/// The words of a run, without the joiners inside it.
fn run_words(run: &str) -> impl Iterator<Item = &str> {
    run.split(' ').filter(|w| !NAME_JOINERS.contains(w))
}

/// Whether every word of a run is a plain capitalised word (`Bug Fixed`): what a label, a
/// heading or a log line capitalises.
fn is_plain(run: &str) -> bool {
    run_words(run).all(plain_word)
}

/// Whether a capitalised run is no name: an agent's tool (`TodoWrite`), or ordinary words
/// the same text also writes in lower case (`Exit` beside "exit", `Bug Fixed` beside "bug"
/// and "fixed"): a label or a sentence's first word, not a name. Only a plain capitalised
/// word can be an ordinary one (`TypeScript` cannot).
fn not_a_name(run: &str, lower: &BTreeSet<&str>) -> bool {
    run_words(run).all(|w| {
        TOOL_NAMES.contains(&w) || (plain_word(w) && lower.contains(w.to_lowercase().as_str()))
    })
}

/// People, places, organisations and titles: runs of one to five capitalised words (lower-case
/// joiners inside) that do not open a sentence, line, list item or heading. A word that opens
/// a sentence counts where the same text also uses it inside one (a name that recurs). A run
/// of words the text also writes in lower case, or an agent's tool, is not a name
/// ([`not_a_name`]).
fn capitalised_names(text: &str, lower: &BTreeSet<&str>, out: &mut Vec<(Kind, String)>) {
    let mut found: Vec<String> = Vec::new();
    let mut openers: Vec<String> = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('#') || l.starts_with('|') {
            continue;
        }
        let words: Vec<&str> = l.split_whitespace().collect();
        // A title-case line is a heading, not a sentence.
        if crate::extractive::is_title_case(&words) {
            continue;
        }
        let mut opens = true;
        let mut i = 0;
        while i < words.len() {
            let raw = words[i];
            // A list marker, a number, a tag (`[completed]`, `[action]`) or a symbol (`✅`,
            // `→`): what follows opens an item, like a sentence.
            let tag = raw.len() > 2
                && raw.starts_with('[')
                && raw.ends_with([']', ':'])
                && !raw[1..].contains('[');
            let marker = matches!(raw, "-" | "*" | "•" | "–" | "—")
                || tag
                || !raw.chars().any(char::is_alphanumeric)
                || raw
                    .trim_end_matches(['.', ')'])
                    .chars()
                    .all(|c| c.is_ascii_digit());
            if marker {
                opens = true;
                i += 1;
                continue;
            }
            let Some(first) = name_word(raw) else {
                opens = ends_sentence(raw);
                i += 1;
                continue;
            };
            if raw.starts_with(['"', '“', '(', '[']) {
                opens = true;
            }
            // The run: capitalised words, joiners between them, until punctuation ends it.
            let mut run = vec![first.to_string()];
            let mut last = i;
            let mut j = i + 1;
            let mut stop = raw != trim_token(raw) && !raw.ends_with("'s") && !raw.ends_with("’s");
            while !stop && j < words.len() && run.len() < 5 {
                let w = words[j];
                if NAME_JOINERS.contains(&w)
                    && let Some(next) = words.get(j + 1).and_then(|n| name_word(n))
                {
                    run.push(w.to_string());
                    run.push(next.to_string());
                    stop = words[j + 1] != trim_token(words[j + 1]);
                    last = j + 1;
                    j += 2;
                    continue;
                }
                match name_word(w) {
                    Some(n) => {
                        run.push(n.to_string());
                        stop = w != trim_token(w);
                        last = j;
                        j += 1;
                    }
                    None => break,
                }
            }
            if opens {
                // Only the words after the first may stand as a name by themselves.
                openers.push(first.to_string());
                if run.len() > 1 && !NAME_JOINERS.contains(&run[1].as_str()) {
                    found.push(run[1..].join(" "));
                }
            } else {
                found.push(run.join(" "));
            }
            opens = ends_sentence(words[last]);
            i = last + 1;
        }
    }
    // (`push` below keeps each name once.)
    for o in openers {
        if found.iter().any(|f| f.split(' ').any(|w| w == o)) {
            found.push(o);
        }
    }
    for n in found {
        if not_a_name(&n, lower) {
            continue;
        }
        // Part of a quoted name already taken ("Harbor" of "Blue Harbor").
        let quoted = out
            .iter()
            .any(|(k, t)| *k == Kind::Name && t != &n && t.contains(n.as_str()));
        if !quoted {
            push(out, Kind::Name, &n);
        }
    }
}

/// Whether a word ends a sentence (or a clause that starts a new one: a colon).
fn ends_sentence(raw: &str) -> bool {
    let t = raw.trim_end_matches(['"', '\'', '”', '’', ')', ']', '*']);
    t.ends_with(['.', '!', '?', ':'])
}

fn is_number(t: &str) -> bool {
    let t = t.strip_prefix(['$', '€', '£']).unwrap_or(t);
    !t.is_empty()
        && t.chars().next().is_some_and(|c| c.is_ascii_digit())
        && t.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
        && !t.ends_with(['.', ','])
}

/// The kind of a single token, if it is an identifier by itself.
fn classify(t: &str) -> Option<Kind> {
    // A plain word (letters only) is none of the kinds below, each of which needs a digit, a
    // symbol or a separator: most words of a chat end here, before any copy is made.
    if t.chars().all(char::is_alphabetic) {
        return None;
    }
    let lower = t.to_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return (t.len() > 8).then_some(Kind::Url);
    }
    if let Some((user, host)) = t.split_once('@')
        && !user.is_empty()
        && user
            .chars()
            .all(|c| c.is_alphanumeric() || "._%+-".contains(c))
        && host.contains('.')
        && !host.ends_with('.')
        && host
            .chars()
            .all(|c| c.is_alphanumeric() || ".-".contains(c))
    {
        return Some(Kind::Email);
    }
    // Tickets: #123, ABC-123.
    if let Some(n) = t.strip_prefix('#')
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
    {
        return Some(Kind::Ticket);
    }
    if let Some((p, n)) = t.split_once('-')
        && p.len() >= 2
        && p.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        && p.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && !n.is_empty()
        && n.chars().all(|c| c.is_ascii_digit())
    {
        return Some(Kind::Ticket);
    }
    if is_date(t) {
        return Some(Kind::Date);
    }
    if is_version(t) {
        return Some(Kind::Version);
    }
    // Money and percentages written without a space.
    if (t.starts_with(['$', '€', '£']) && is_number(t))
        || (t.ends_with('%') && is_number(&t[..t.len() - 1]))
    {
        return Some(Kind::Number);
    }
    // A number glued to its unit: 250ms, 16GB, 3.5x.
    if t.chars().next().is_some_and(|c| c.is_ascii_digit()) {
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
            .unwrap_or(t.len());
        let (n, unit) = t.split_at(split);
        if !unit.is_empty() && is_number(n) && UNITS.contains(&unit.to_lowercase().as_str()) {
            // A measured duration (`1.3s`) is no identifier at all.
            return (!is_timing(n, unit)).then_some(Kind::Number);
        }
    }
    if is_path(t) {
        return Some(Kind::Path);
    }
    None
}

fn is_date(t: &str) -> bool {
    let parts: Vec<&str> = t.split(['-', '/']).collect();
    if parts.len() != 3 || !parts.iter().all(|p| p.chars().all(|c| c.is_ascii_digit())) {
        return false;
    }
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    let iso = lens == [4, 2, 2] && t.contains('-');
    let dmy = (1..=2).contains(&lens[0]) && (1..=2).contains(&lens[1]) && lens[2] == 4;
    iso || dmy
}

fn is_version(t: &str) -> bool {
    let (v, body) = match t.strip_prefix(['v', 'V']) {
        Some(b) => (true, b),
        None => (false, t),
    };
    let core = body.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    numeric && ((v && parts.len() >= 2) || parts.len() >= 3)
}

fn is_path(t: &str) -> bool {
    let path_char = |c: char| c.is_alphanumeric() || "._-/~@+".contains(c);
    if !t.chars().all(path_char) || !t.chars().any(|c| c.is_ascii_alphabetic()) {
        return false;
    }
    if t.contains('/') {
        // At least one segment with a letter, no empty middle segments ("and/or" counts: it
        // is kept out by needing a dot, a leading slash or tilde, or three segments).
        let segments: Vec<&str> = t.split('/').collect();
        let rooted = t.starts_with('/') || t.starts_with("~/") || t.starts_with("./");
        let dotted = segments.last().is_some_and(|s| s.contains('.'));
        let deep = segments.iter().filter(|s| !s.is_empty()).count() >= 3;
        return (rooted && segments.len() >= 2 && t.len() > 2) || dotted || deep;
    }
    if let Some((stem, ext)) = t.rsplit_once('.') {
        return !stem.is_empty()
            && stem.chars().any(|c| c.is_ascii_alphabetic())
            && EXTENSIONS.contains(&ext.to_lowercase().as_str());
    }
    false
}

/// The ledger of `episodes` (`(id, text)`, in order, each read as a user's), unbudgeted.
#[cfg(test)]
pub fn of_episodes<S: AsRef<str>>(episodes: impl IntoIterator<Item = (u64, S)>) -> Ledger {
    of_messages(
        episodes
            .into_iter()
            .map(|(id, text)| (id, crate::types::Role::User, text)),
    )
}

/// The ledger of `episodes` (`(id, role, text)`, in order), unbudgeted; a tool's output is
/// read by [`extract_for`].
pub fn of_messages<S: AsRef<str>>(
    episodes: impl IntoIterator<Item = (u64, crate::types::Role, S)>,
) -> Ledger {
    let mut l = Ledger::default();
    for (id, role, text) in episodes {
        for (kind, t) in extract_for(role, text.as_ref()) {
            add(&mut l.entries, kind, t, id, 1);
        }
    }
    l
}

/// The identifiers of a message from `role`: a tool's output (a build log, a file read, a
/// listing) gives its paths, URLs, versions, tickets and code-like names (`ReadableStream`),
/// but no plain capitalised words — there they are log levels, labels and sentence openers
/// (`Response`, `Exit handler`), not the people, places and products the conversation is
/// about.
pub fn extract_for(role: crate::types::Role, text: &str) -> Vec<(Kind, String)> {
    let mut out = extract(text);
    if role == crate::types::Role::Tool {
        out.retain(|(k, t)| *k != Kind::Name || !is_plain(t));
    }
    out
}

/// A file's kinds by precedence: a file the session created stays "created" when it is
/// edited later, and one it edited stays "edited" when it is read again.
fn file_rank(k: Kind) -> u8 {
    match k {
        Kind::Created => 3,
        Kind::Edited => 2,
        _ => 1,
    }
}

/// One more sighting of `e`'s identifier (as `kind`, in `episode`, `count` times): counts
/// summed, the newest episode kept, a file's strongest kind kept.
fn seen_again(e: &mut Entry, kind: Kind, episode: u64, count: u32) {
    e.count = e.count.saturating_add(count);
    if kind.group() == 1 {
        if file_rank(kind) > file_rank(e.kind) {
            e.kind = kind;
        }
        e.episode = e.episode.max(episode);
    } else if episode >= e.episode {
        e.episode = episode;
        e.kind = kind;
    }
}

/// `entries` with each identifier once (merged as [`add`] merges them), first-seen order
/// kept: O(n log n), for lists gathered in bulk.
pub(crate) fn deduplicated(entries: Vec<Entry>) -> Vec<Entry> {
    let mut at: BTreeMap<(u8, String), usize> = BTreeMap::new();
    let mut out: Vec<Entry> = Vec::with_capacity(entries.len());
    for e in entries {
        match at.get(&(e.kind.group(), e.text.clone())) {
            Some(&i) => seen_again(&mut out[i], e.kind, e.episode, e.count),
            None => {
                at.insert((e.kind.group(), e.text.clone()), out.len());
                out.push(e);
            }
        }
    }
    out
}

pub(crate) fn add(entries: &mut Vec<Entry>, kind: Kind, text: String, episode: u64, count: u32) {
    let text = bounded_text(text);
    match entries
        .iter_mut()
        .find(|e| e.kind.group() == kind.group() && e.text == text)
    {
        Some(e) => seen_again(e, kind, episode, count),
        None => entries.push(Entry {
            text,
            kind,
            episode,
            count,
        }),
    }
}

/// The longest entry a ledger keeps, in characters: identifiers are short (at most 200), a
/// digest's request is at most [`crate::digest::REQUEST_MAX_CHARS`]; anything longer (a row
/// written before these bounds, a babbling model) is cut to it.
pub const MAX_ENTRY_CHARS: usize = 1_000;

pub(crate) fn bounded_text(text: String) -> String {
    if text.chars().count() <= MAX_ENTRY_CHARS {
        return text;
    }
    let mut t: String = text.chars().take(MAX_ENTRY_CHARS - 1).collect();
    t.push('…');
    t
}

/// `a` and `b` merged (b is newer): counts summed, newest episode kept, drops added.
pub fn merge(a: &Ledger, b: &Ledger) -> Ledger {
    let mut out = a.clone();
    for e in &b.entries {
        add(&mut out.entries, e.kind, e.text.clone(), e.episode, e.count);
    }
    out.dropped = a.dropped.saturating_add(b.dropped);
    out
}

/// The most a row's ledger keeps, in tokens: a bound on memory and storage against a babbling
/// transcript, not a budget (budgets apply when the ledger is read).
pub const STORED_TOKENS: u32 = 16_000;

/// The ledger a row stores: whole, unless its identifiers pass [`STORED_TOKENS`] (the digest's
/// entries have their own bound, [`crate::digest::bounded`]).
pub fn stored(l: Ledger) -> Ledger {
    let mut out = within(&l, STORED_TOKENS, false);
    out.entries = bounded_facts(crate::digest::bounded(out.entries));
    out
}

/// The most facts' events a row keeps (the newest): a bound against a babbling transcript; a
/// real session states far fewer.
pub const MAX_FACT_EVENTS: usize = 600;

/// `entries` with at most [`MAX_FACT_EVENTS`] facts' events (the newest kept), order kept.
fn bounded_facts(entries: Vec<Entry>) -> Vec<Entry> {
    let mut facts: Vec<(u64, usize)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind.is_fact())
        .map(|(i, e)| (e.episode, i))
        .collect();
    if facts.len() <= MAX_FACT_EVENTS {
        return entries;
    }
    facts.sort();
    let drop: BTreeSet<usize> = facts[..facts.len() - MAX_FACT_EVENTS]
        .iter()
        .map(|(_, i)| *i)
        .collect();
    entries
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !drop.contains(i))
        .map(|(_, e)| e)
        .collect()
}

/// The ledger as a prompt shows it: within the configured slice (`0`: none).
pub fn for_prompt(l: &Ledger, slice: u32) -> String {
    if slice == 0 {
        return String::new();
    }
    render(&budgeted(l, slice))
}

/// Tokens one entry's text takes in a rendered ledger, with the separator after it.
pub fn entry_cost(e: &Entry) -> u32 {
    estimate_tokens(&e.text) + 1
}

/// The label a group of entries last seen in episode `episode` ends with.
fn label(episode: u64) -> String {
    format!(" (#{episode})")
}

/// Tokens the label of a group last seen in `episode` takes, its separator included.
fn label_cost(episode: u64) -> u32 {
    estimate_tokens(&label(episode)) + 1
}

/// Tokens `l`'s identifiers take rendered (see [`render`]): each entry's text, and one label
/// per episode they were last seen in.
pub fn cost(l: &Ledger) -> u32 {
    let mut episodes = BTreeSet::new();
    let mut total = 0u32;
    for e in identifiers(l) {
        total = total.saturating_add(entry_cost(e));
        if episodes.insert(e.episode) {
            total = total.saturating_add(label_cost(e.episode));
        }
    }
    total
}

/// `l` kept within `budget` tokens, as rendered, by the policy in the module docs; what is
/// dropped is added to `dropped`. Entries stay in first-seen order.
pub fn budgeted(l: &Ledger, budget: u32) -> Ledger {
    within(l, budget, true)
}

/// [`budgeted`], counting each episode's label when `labels` (a rendered slice) or only the
/// entries' texts (a stored ledger's bound).
fn within(l: &Ledger, budget: u32, labels: bool) -> Ledger {
    // The budget is the identifiers'; the digest's entries pass through (the digest is
    // budgeted when it is rendered, see [`crate::digest::render`]).
    let total = if labels {
        cost(l)
    } else {
        identifiers(l).map(entry_cost).sum()
    };
    if total <= budget {
        return l.clone();
    }
    let mut keep: Vec<bool> = l
        .entries
        .iter()
        .map(|e| e.kind.is_digest() || e.kind.is_fact())
        .collect();
    let mut used = 0u32;
    let mut labelled: BTreeSet<u64> = BTreeSet::new();
    // An entry's cost beside those kept so far: its text, and its episode's label when it is
    // the first kept from that episode.
    let marginal = |e: &Entry, labelled: &BTreeSet<u64>| {
        entry_cost(e)
            + if labels && !labelled.contains(&e.episode) {
                label_cost(e.episode)
            } else {
                0
            }
    };
    let mut frequent: Vec<usize> = (0..l.entries.len())
        .filter(|&i| !keep[i] && l.entries[i].count >= FREQUENT)
        .collect();
    frequent.sort_by(|&a, &b| {
        let (x, y) = (&l.entries[a], &l.entries[b]);
        y.count.cmp(&x.count).then(y.episode.cmp(&x.episode))
    });
    for i in frequent {
        let c = marginal(&l.entries[i], &labelled);
        if used + c <= budget / 2 {
            used += c;
            keep[i] = true;
            labelled.insert(l.entries[i].episode);
        }
    }
    let mut newest: Vec<usize> = (0..l.entries.len()).filter(|&i| !keep[i]).collect();
    newest.sort_by(|&a, &b| {
        let (x, y) = (&l.entries[a], &l.entries[b]);
        y.episode.cmp(&x.episode).then(y.count.cmp(&x.count))
    });
    for i in newest {
        let c = marginal(&l.entries[i], &labelled);
        if used + c <= budget {
            used += c;
            keep[i] = true;
            labelled.insert(l.entries[i].episode);
        }
    }
    let dropped = keep.iter().filter(|k| !**k).count() as u32;
    Ledger {
        entries: l
            .entries
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(e, _)| e.clone())
            .collect(),
        dropped: l.dropped.saturating_add(dropped),
    }
}

/// The heading of the ledger block in prompts and contexts.
pub const HEADING: &str = "Identifiers mentioned (verbatim; episode last seen):";

/// The identifiers of a ledger (not the digest's entries, nor the facts' events).
pub fn identifiers(l: &Ledger) -> impl Iterator<Item = &Entry> {
    l.entries
        .iter()
        .filter(|e| !e.kind.is_digest() && !e.kind.is_fact())
}

/// The ledger's identifiers as one block of text (empty when there are none): grouped by the
/// episode they were last seen in, `a, b (#12) · c (#15)` (one label per episode, not per
/// entry: a label costs as much as a short identifier), the groups in the order of their
/// first entry. The digest's entries are rendered by [`crate::digest::render`].
pub fn render(l: &Ledger) -> String {
    if identifiers(l).next().is_none() {
        return String::new();
    }
    let mut groups: Vec<(u64, Vec<String>)> = Vec::new();
    let mut at: BTreeMap<u64, usize> = BTreeMap::new();
    for e in identifiers(l) {
        let text = crate::prompt::neutralize(&e.text);
        match at.get(&e.episode) {
            Some(&i) => groups[i].1.push(text),
            None => {
                at.insert(e.episode, groups.len());
                groups.push((e.episode, vec![text]));
            }
        }
    }
    let items: Vec<String> = groups
        .iter()
        .map(|(episode, texts)| format!("{}{}", texts.join(", "), label(*episode)))
        .collect();
    let mut s = format!("{HEADING}\n{}", items.join(" · "));
    if l.dropped > 0 {
        s.push_str(&format!(
            "\n({} older identifiers left out for the budget)",
            l.dropped
        ));
    }
    s
}

/// Count of distinct identifiers in `texts`, and how many of them occur in `context`.
pub fn retention<'a>(texts: impl IntoIterator<Item = &'a str>, context: &str) -> (usize, usize) {
    let mut all: BTreeMap<String, ()> = BTreeMap::new();
    for t in texts {
        for (_, x) in extract(t) {
            all.insert(x, ());
        }
    }
    let kept = all.keys().filter(|x| context.contains(x.as_str())).count();
    (all.len(), kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(s: &str) -> Vec<String> {
        extract(s).into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn kinds() {
        let s = "Edit `src/engine.rs`, `HashMap::new` and host/src/store/sqlite.rs, see https://example.com/a?b=1. \
                 Run `cargo test --workspace` on v1.95 (or 48.0.8) by 2026-11-24; it took 250 ms \
                 and 16GB, 12% slower. Mail ops@example.org about #42 and ABC-123 for \"Project Falcon\".\n\
                 $ npm run build";
        let got = extract(s);
        let find = |t: &str| got.iter().find(|(_, x)| x == t).map(|(k, _)| *k);
        assert_eq!(find("src/engine.rs"), Some(Kind::Path));
        assert_eq!(find("HashMap::new"), Some(Kind::Code));
        assert_eq!(find("host/src/store/sqlite.rs"), Some(Kind::Path));
        assert_eq!(find("https://example.com/a?b=1"), Some(Kind::Url));
        assert_eq!(find("cargo test --workspace"), Some(Kind::Command));
        assert_eq!(find("v1.95"), Some(Kind::Version));
        assert_eq!(find("48.0.8"), Some(Kind::Version));
        assert_eq!(find("2026-11-24"), Some(Kind::Date));
        assert_eq!(find("250 ms"), Some(Kind::Number));
        assert_eq!(find("16GB"), Some(Kind::Number));
        assert_eq!(find("12%"), Some(Kind::Number));
        assert_eq!(find("ops@example.org"), Some(Kind::Email));
        assert_eq!(find("#42"), Some(Kind::Ticket));
        assert_eq!(find("ABC-123"), Some(Kind::Ticket));
        assert_eq!(find("Project Falcon"), Some(Kind::Name));
        assert_eq!(find("npm run build"), Some(Kind::Command));
    }

    #[test]
    fn prose_is_not_an_identifier() {
        assert!(
            texts("The user and/or the assistant said e.g. that it was 3 of them, ok? \"yes\"")
                .is_empty(),
            "{:?}",
            texts("The user and/or the assistant said e.g. that it was 3 of them, ok? \"yes\"")
        );
    }

    #[test]
    fn merge_counts_and_keeps_the_newest_episode() {
        let a = of_episodes([(1, "see src/a.rs"), (2, "src/a.rs again and #7")]);
        assert_eq!(a.entries[0].count, 2);
        assert_eq!(a.entries[0].episode, 2);
        let b = of_episodes([(9, "#7 is fixed")]);
        let m = merge(&a, &b);
        let t = m.entries.iter().find(|e| e.text == "#7").unwrap();
        assert_eq!((t.count, t.episode), (2, 9));
    }

    #[test]
    fn entries_last_seen_in_one_episode_share_one_label() {
        let l = of_episodes([
            (3, "src/a.rs"),
            (3, "v1.2.0"),
            (5, "OPS-12"),
            (3, "250 ms"),
            (7, "src/a.rs"),
        ]);
        let text = render(&l);
        assert_eq!(
            text.lines().nth(1),
            Some("src/a.rs (#7) · v1.2.0, 250 ms (#3) · OPS-12 (#5)"),
            "{text}"
        );
        // The estimate counts one label per episode, and holds what the text costs.
        assert!(cost(&l) >= estimate_tokens(text.lines().nth(1).unwrap()));
        assert!(
            cost(&l)
                < l.entries
                    .iter()
                    .map(|e| entry_cost(e) + label_cost(e.episode))
                    .sum()
        );
    }

    #[test]
    fn the_budget_keeps_frequent_then_newest_and_counts_drops() {
        let mut eps: Vec<(u64, String)> = (1..=40).map(|i| (i, format!("file{i}.rs"))).collect();
        // file1.rs is mentioned often, early.
        eps.push((41, "file1.rs".into()));
        eps.push((42, "file1.rs".into()));
        let l = of_episodes(eps.iter().map(|(i, t)| (*i, t.as_str())));
        let b = budgeted(&l, 30);
        assert!(cost(&b) <= 30);
        let text = render(&b);
        assert!(
            estimate_tokens(text.lines().nth(1).unwrap()) <= 30,
            "{text}"
        );
        assert!(
            b.entries.iter().any(|e| e.text == "file1.rs"),
            "frequent kept"
        );
        assert!(
            b.entries.iter().any(|e| e.text == "file40.rs"),
            "newest kept"
        );
        assert!(
            !b.entries.iter().any(|e| e.text == "file2.rs"),
            "old one-off dropped"
        );
        assert_eq!(b.dropped as usize, 40 - b.entries.len());
        let r = render(&b);
        assert!(r.starts_with(HEADING) && r.contains("left out"), "{r}");
    }
}
#[cfg(test)]
mod names_tests {
    use super::*;

    fn names(text: &str) -> Vec<String> {
        extract(text)
            .into_iter()
            .filter(|(k, _)| *k == Kind::Name)
            .map(|(_, t)| t)
            .collect()
    }

    fn dates(text: &str) -> Vec<String> {
        extract(text)
            .into_iter()
            .filter(|(k, _)| *k == Kind::Date)
            .map(|(_, t)| t)
            .collect()
    }

    #[test]
    fn people_places_and_titles_inside_sentences_are_names() {
        assert_eq!(
            names(
                "We stayed at the Harbor Inn in Lisbon, and Melanie loved it. Then we met Caroline's sister."
            ),
            ["Harbor Inn", "Lisbon", "Melanie", "Caroline"]
        );
        assert_eq!(
            names("I read a book by the Bank of America chairman."),
            ["Bank of America"]
        );
        // A sentence's first word is not a name by itself, unless the text uses it as one.
        assert!(names("Thanks! Great to hear.").is_empty());
        assert_eq!(names("Caroline is here. I told Caroline."), ["Caroline"]);
        // Nor are the pronoun, months and weekdays, headings or list markers' words.
        assert!(names("Yes I will go on Saturday in May.").is_empty());
        assert!(names("See you on Fri, or else Tues.").is_empty());
        assert!(names("## Critical Issue Add Buffer Protection\n- Fixed it.").is_empty());
        assert!(names("Sure: Done. OK then.").is_empty());
        // A coding agent's records open items with tags and symbols: the tool's name and
        // the verb after them open the item, as a list marker's word does.
        assert!(names("[action] Bash: chmod +x run.sh").is_empty());
        assert_eq!(
            names("[action] TodoWrite: [completed] Research frameworks; [pending] Set up Docker"),
            ["Docker"]
        );
        assert!(names("✅ Fixed the build → Push failed twice").is_empty());
        assert_eq!(names("✅ We moved to Lisbon."), ["Lisbon"]);
    }

    #[test]
    fn dates_as_people_write_them_and_relative_dates_resolved() {
        assert_eq!(
            dates(
                "(conversation of 1:56 pm on 8 May, 2023) We met on May 8th and in March 2022, and on 2023-05-08."
            ),
            ["8 May, 2023", "May 8th", "March 2022", "2023-05-08"]
        );
        let said = crate::dates::resolve("I went there yesterday.", Some(1_683_554_160_000));
        assert_eq!(dates(&said), ["7 May 2023"]);
    }
}

#[cfg(test)]
mod noise_tests {
    use super::*;

    fn shown(text: &str) -> Vec<String> {
        extract(text).into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn an_agents_tools_are_not_names() {
        let t = "I ran the tests with Bash and then TodoWrite, WebFetch and Write updated it; Caroline reviewed.";
        let got = shown(t);
        for tool in ["Bash", "TodoWrite", "WebFetch", "Write"] {
            assert!(!got.iter().any(|g| g.contains(tool)), "{tool} in {got:?}");
        }
        assert!(got.contains(&"Caroline".to_string()), "{got:?}");
    }

    #[test]
    fn ordinary_words_in_capitals_are_not_names() {
        // "Exit" and "Update" are words the same text writes in lower case.
        let t = "npm ERR! Exit handler never called. Please update npm; the exit code was 1. Run Update later with Kaner.";
        let got = shown(t);
        assert!(!got.iter().any(|g| g == "Update" || g == "Exit"), "{got:?}");
        assert!(got.contains(&"Kaner".to_string()), "{got:?}");
        // A product written in camel case stays, whatever the text writes in lower case.
        let got = shown("We use TypeScript here, and typescript is in package.json.");
        assert!(got.contains(&"TypeScript".to_string()), "{got:?}");
    }

    #[test]
    fn bold_labels_are_not_names() {
        let t = "**1. Authentication Bug Fixed** - Added back the call.\n**CORS Headers Present** in both. Deployed by Priya Nair.";
        let got = shown(t);
        assert!(
            !got.iter()
                .any(|g| g.contains("Fixed") || g.contains("Present")),
            "{got:?}"
        );
        assert!(got.contains(&"Priya Nair".to_string()), "{got:?}");
    }

    #[test]
    fn a_code_like_name_stays_in_a_bold_label_and_in_a_tools_output() {
        let got = shown("The build is now **TypeScript clean** and **Build Fixed** shows it.");
        assert!(got.contains(&"TypeScript".to_string()), "{got:?}");
        assert!(!got.iter().any(|g| g.contains("Fixed")), "{got:?}");
        let got: Vec<String> = extract_for(
            crate::types::Role::Tool,
            "Error: the ReadableStream was closed. Response status 500 from Router in app/routes/plan.tsx",
        )
        .into_iter()
        .map(|(_, t)| t)
        .collect();
        assert!(got.contains(&"ReadableStream".to_string()), "{got:?}");
        assert!(got.contains(&"app/routes/plan.tsx".to_string()), "{got:?}");
        assert!(
            !got.iter().any(|g| g == "Response" || g == "Router"),
            "{got:?}"
        );
    }

    #[test]
    fn the_units_of_time_are_the_first_units_up_to_hours() {
        assert_eq!(TIME_UNITS.first(), Some(&"ms"));
        assert_eq!(TIME_UNITS.last(), Some(&"hours"));
        assert_eq!(UNITS[TIME_UNITS.len()], "day");
    }

    #[test]
    fn measured_durations_are_not_identifiers() {
        let got =
            shown("[+] Building 1.3s (1/2) and 151.9 s later; the timeout is 250 ms and 30s.");
        assert!(
            !got.iter()
                .any(|g| g.contains("1.3s") || g.contains("151.9")),
            "{got:?}"
        );
        assert!(got.contains(&"250 ms".to_string()), "{got:?}");
        assert!(got.contains(&"30s".to_string()), "{got:?}");
    }
}
