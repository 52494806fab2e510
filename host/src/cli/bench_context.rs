//! `abridge bench context FILE…`: what a context keeps of a long chat, measured on a
//! long-conversation QA set (LoCoMo's JSON: `speaker_a`, `speaker_b`, `session_N` turns with
//! `speaker`, `text` and sometimes a photo's `blip_caption`, `session_N_date_time`, and `qa`).
//!
//! Each conversation is written as JSON lines (one message per turn, the first speaker as the
//! user, each turn dated by its session's date) and imported with `abridge summarize` into a
//! fresh database, as a user would; then the context is asked for at each budget. For every
//! question with an answer (categories 1–4) the answer words (the content words and numbers
//! of the gold answer) are looked up in the context's words; the figure is their mean share.
//! Beside it, at the same budget and by the same estimator: the most recent turns, evenly
//! spaced turns, and (a reference that knows the question) the turns that best match the
//! question by BM25, and abridge's context with the question passed as its query (what a
//! chat app does with the user's newest message). Then the context's p50 and p99 time (in
//! process, the app's own call), without and with the query.
//!
//! A coding session's transcript (`.jsonl`, such as Claude Code's) has no questions: it is
//! cut at 50, 60, 70, 80 and 90 % of its lines, the part before each cut imported as it is,
//! and the identifiers the requests after it go back to are the answers (see
//! [`load_session`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, anyhow};
use serde_json::{Value, json};

use super::bench::percentile;
use super::{Exit, Failure, Settings};

/// The budgets measured.
const BUDGETS: [u32; 3] = [1000, 2000, 4000];
/// Tokens a message costs beyond its content (the guest's `MESSAGE_COST`).
const MESSAGE_COST: u32 = 3;

/// Words that carry no answer.
const STOP: &[&str] = &[
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "and", "or", "is", "was", "were", "be",
    "been", "by", "with", "from", "as", "that", "this", "it", "its", "i", "my", "me", "we", "our",
    "you", "your", "he", "she", "his", "her", "they", "them", "their", "what", "when", "where",
    "who", "how", "which", "did", "do", "does", "has", "have", "had", "not", "no", "yes",
];

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn answer_words(answer: &str) -> Vec<String> {
    words(answer)
        .into_iter()
        .filter(|w| !STOP.contains(&w.as_str()))
        .collect()
}

/// A conversation of the set.
pub(super) struct Conversation {
    /// (speaker, text, ms): a set without times (BEAM) has none, and none is invented.
    pub(super) turns: Vec<(String, String, Option<i64>)>,
    pub(super) first: String,
    /// (question, answer words).
    pub(super) qa: Vec<(String, Vec<String>)>,
    /// The set it is from ("LoCoMo", "REALTALK", "BEAM", "coding"), for the per-set means.
    pub(super) set: &'static str,
    /// A coding session's history as its own transcript file, imported as it is (its format
    /// detected); its answers are identifiers, each looked up whole in the context's text
    /// rather than word by word. `None`: the turns are imported as JSON lines.
    pub(super) source: Option<PathBuf>,
}

impl Conversation {
    /// A turn as a posted message (`{role, content, name, timestamp?}`): the first speaker
    /// is the user; a turn without a time is posted without one.
    pub(super) fn message(&self, (speaker, text, ms): &(String, String, Option<i64>)) -> Value {
        let role = if *speaker == self.first {
            "user"
        } else {
            "assistant"
        };
        let mut line = json!({"role": role, "content": text, "name": speaker});
        if let Some(ms) = ms {
            line["timestamp"] = json!(ms);
        }
        line
    }
}

/// "1:56 pm on 8 May, 2023" as ms since the epoch (UTC).
fn session_time(s: &str) -> Option<i64> {
    parse_time("%I:%M %p on %d %B, %Y", s)
}

/// `s` in `format` as ms since the epoch (UTC).
fn parse_time(format: &str, s: &str) -> Option<i64> {
    let t = jiff::fmt::strtime::parse(format, s)
        .ok()?
        .to_datetime()
        .ok()?;
    let epoch = jiff::civil::date(1970, 1, 1).at(0, 0, 0, 0);
    Some(t.duration_since(epoch).as_millis() as i64)
}

/// "8 May 2023" for ms since the epoch (UTC).
fn day_of(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.strftime("%-d %B %Y").to_string())
        .unwrap_or_default()
}

/// A question's answer words, when it has an answer with any.
fn qa_of(question: &Value, answer: &Value) -> Option<(String, Vec<String>)> {
    let answer = match answer {
        Value::String(s) => s.clone(),
        Value::Null => return None,
        other => other.to_string(),
    };
    let aw = answer_words(&answer);
    (!aw.is_empty()).then(|| (question.as_str().unwrap_or("").to_string(), aw))
}

/// A conversation of one of the sets `bench context` reads, told apart by its layout:
/// - LoCoMo: `speaker_a`, `session_N` turns (`speaker`, `text`, a photo's `blip_caption`),
///   `session_N_date_time`, and `qa` (categories 1–4 have answers);
/// - REALTALK (LoCoMo's layout for two people's messaging-app chats): `name.speaker_1`,
///   `session_N` turns with `clean_text` and their own `date_time` ("29.12.2023, 22:42:04");
/// - BEAM (long user–assistant chats without times): a folder (or its `chat.json`) of batches
///   of turns (`role`, `content`), with `probing_questions.json` beside it or in
///   `probing_questions/`; the questions with a stated answer (`answer`, `ideal_answer` or
///   `ideal_summary`) count, not those that test abstention or how a reply is written.
pub(super) fn load(path: &Path) -> anyhow::Result<Conversation> {
    if path.is_dir() {
        return load_beam(&path.join("chat.json"));
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    if v.is_array() {
        return load_beam(path);
    }
    if let Some(first) = v["name"]["speaker_1"].as_str() {
        return load_realtalk(&v, first);
    }
    let c = v.get("conversation").unwrap_or(&v);
    let first = c["speaker_a"]
        .as_str()
        .ok_or_else(|| {
            anyhow!(
                "{}: neither LoCoMo (speaker_a), REALTALK (name.speaker_1) nor BEAM (a list of batches of turns)",
                path.display()
            )
        })?
        .to_string();
    let mut turns = Vec::new();
    let mut n = 1;
    while let Some(session) = c.get(format!("session_{n}")).and_then(Value::as_array) {
        let at = c[format!("session_{n}_date_time")]
            .as_str()
            .and_then(session_time)
            .ok_or_else(|| anyhow!("session_{n}_date_time is not a date"))?;
        for (i, t) in session.iter().enumerate() {
            let mut text = t["text"].as_str().unwrap_or("").to_string();
            if let Some(cap) = t["blip_caption"].as_str() {
                text.push_str(&format!(" [shares a photo: {cap}]"));
            }
            let speaker = t["speaker"].as_str().unwrap_or("").to_string();
            turns.push((speaker, text, Some(at + i as i64 * 30_000)));
        }
        n += 1;
    }
    let qa = v["qa"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|q| matches!(q["category"].as_i64(), Some(1..=4)))
        .filter_map(|q| qa_of(&q["question"], &q["answer"]))
        .collect();
    Ok(Conversation {
        turns,
        first,
        qa,
        set: "LoCoMo",
        source: None,
    })
}

fn load_realtalk(v: &Value, first: &str) -> anyhow::Result<Conversation> {
    let mut turns = Vec::new();
    let mut n = 1;
    while let Some(session) = v.get(format!("session_{n}")).and_then(Value::as_array) {
        for t in session {
            let mut text = t["clean_text"].as_str().unwrap_or("").to_string();
            if let Some(cap) = t["blip_caption"].as_str() {
                text.push_str(&format!(" [shares a photo: {cap}]"));
            }
            let at = t["date_time"]
                .as_str()
                .and_then(|d| parse_time("%d.%m.%Y, %H:%M:%S", d));
            let speaker = t["speaker"].as_str().unwrap_or("").to_string();
            turns.push((speaker, text, at));
        }
        n += 1;
    }
    if turns.is_empty() {
        return Err(anyhow!("no session_1 turns (not a REALTALK conversation)"));
    }
    let qa = v["qa"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| qa_of(&q["question"], &q["answer"]))
        .collect();
    Ok(Conversation {
        turns,
        first: first.to_string(),
        qa,
        set: "REALTALK",
        source: None,
    })
}

fn load_beam(chat: &Path) -> anyhow::Result<Conversation> {
    let v: Value = serde_json::from_slice(
        &std::fs::read(chat).with_context(|| format!("reading {}", chat.display()))?,
    )
    .with_context(|| format!("{} is not JSON", chat.display()))?;
    let mut turns = Vec::new();
    for batch in v.as_array().into_iter().flatten() {
        for turn in batch["turns"].as_array().into_iter().flatten() {
            for m in turn.as_array().into_iter().flatten() {
                let role = m["role"].as_str().unwrap_or("user").to_string();
                let text = m["content"].as_str().unwrap_or("").to_string();
                turns.push((role, text, None));
            }
        }
    }
    if turns.is_empty() {
        return Err(anyhow!(
            "{}: no batches of turns (not a BEAM chat)",
            chat.display()
        ));
    }
    let dir = chat.parent().unwrap_or(Path::new("."));
    let questions = [
        dir.join("probing_questions.json"),
        dir.join("probing_questions").join("probing_questions.json"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or_else(|| anyhow!("{}: no probing_questions.json beside it", chat.display()))?;
    let q: Value = serde_json::from_slice(&std::fs::read(&questions)?)
        .with_context(|| format!("{} is not JSON", questions.display()))?;
    let mut qa = Vec::new();
    for list in q.as_object().into_iter().flat_map(|o| o.values()) {
        for item in list.as_array().into_iter().flatten() {
            let answer = ["answer", "ideal_answer", "ideal_summary"]
                .iter()
                .map(|k| &item[*k])
                .find(|a| !a.is_null());
            if let Some(a) = answer
                && let Some(x) = qa_of(&item["question"], a)
            {
                qa.push(x);
            }
        }
    }
    Ok(Conversation {
        turns,
        first: "user".to_string(),
        qa,
        set: "BEAM",
        source: None,
    })
}

/// The mean share of each question's answer words found among `text`'s words.
pub(super) fn kept(text: &str, qa: &[(String, Vec<String>)]) -> f64 {
    let have: BTreeSet<String> = words(text).into_iter().collect();
    let sum: f64 = qa
        .iter()
        .map(|(_, aw)| aw.iter().filter(|w| have.contains(*w)).count() as f64 / aw.len() as f64)
        .sum();
    sum / qa.len().max(1) as f64
}

/// [`kept`] for `conv`'s questions: a coding session's answers (identifiers) are looked up
/// whole in `text`.
fn kept_of(conv: &Conversation, text: &str, qa: &[(String, Vec<String>)]) -> f64 {
    if conv.source.is_none() {
        return kept(text, qa);
    }
    let sum: f64 = qa
        .iter()
        .map(|(_, ids)| {
            ids.iter().filter(|id| text.contains(id.as_str())).count() as f64 / ids.len() as f64
        })
        .sum();
    sum / qa.len().max(1) as f64
}

/// The identifiers of `text` as a coding session names things: paths, file names, dotted,
/// snake_case and camelCase names, `::` paths, flags (`--release`); at least 4 characters
/// and 3 letters, trimmed of the punctuation around them (`./run.sh` is `run.sh`). Plain words
/// and numbers are not identifiers. A rule of the bench's own, not the guest's ledger rule, so
/// the ledger is not graded by the rule that fills it.
fn code_ids(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let split = |c: char| c.is_whitespace() || "`'\"()[]{}<>,;|=".contains(c);
    for raw in text.split(split) {
        // Sentence punctuation after it, emphasis around it, and a `./` that adds nothing.
        let w = raw
            .trim_end_matches(|c: char| ".:!?*".contains(c))
            .trim_start_matches('*');
        let w = w.strip_prefix("./").unwrap_or(w);
        let letters = w.chars().filter(|c| c.is_alphabetic()).count();
        if w.chars().count() < 4 || letters < 3 {
            continue;
        }
        let chars: Vec<char> = w.chars().collect();
        let inner = |c: char| {
            chars
                .windows(3)
                .any(|x| x[1] == c && x[0].is_alphanumeric() && x[2].is_alphanumeric())
        };
        let camel = chars
            .windows(2)
            .any(|x| x[0].is_lowercase() && x[1].is_uppercase());
        let flag = w.starts_with("--") && w[2..].chars().all(|c| c.is_alphanumeric() || c == '-');
        let id = w.contains('/') || w.contains("::") || inner('_') || inner('.') || camel || flag;
        if id && !out.iter().any(|o| o == w) {
            out.push(w.to_string());
        }
    }
    out
}

/// The turns of a transcript file as `abridge summarize` reads it (whatever its format; the
/// longest conversation when it holds several): tool calls and results are left out, as an
/// import leaves them out by default.
async fn session_turns(
    engine: &abridge_app::Pure,
    path: &Path,
) -> anyhow::Result<Vec<(String, String, Option<i64>)>> {
    use abridge_app::engine::types::Role;
    let parsed = super::bench::parse(engine, path).await?;
    Ok(parsed
        .conversations
        .into_iter()
        .max_by_key(|c| c.episodes.len())
        .map(|c| c.episodes)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| matches!(e.role, Role::User | Role::Assistant) && !e.content.trim().is_empty())
        .map(|e| {
            let who = if e.role == Role::User {
                "user"
            } else {
                "assistant"
            };
            (who.to_string(), e.content, e.timestamp_ms)
        })
        .collect())
}

/// Where a coding session is cut, in percent of its lines: the history up to each cut, and
/// the requests up to the next cut as its questions.
pub(super) const CUTS: [usize; 5] = [50, 60, 70, 80, 90];

/// A coding session's transcript (a JSON-lines format `abridge summarize` reads, such as
/// Claude Code's), which has no questions: the file's lines before `cut` (a share of them, in
/// percent) are the history, imported as they are (written to `dir`), and each request after
/// it (up to `cut + 10` %) is a question whose answers are the identifiers (see [`code_ids`])
/// that request and the replies up to the next request name and the history already held:
/// what the session went back to. The request is the question's text.
async fn load_session(
    engine: &abridge_app::Pure,
    path: &Path,
    dir: &Path,
    cut: usize,
) -> anyhow::Result<Conversation> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let split = lines.len() * cut / 100;
    let end = (lines.len() * (cut + 10) / 100).min(lines.len());
    let prefix = dir.join("history.jsonl");
    let suffix = dir.join("later.jsonl");
    std::fs::write(&prefix, lines[..split].join("\n") + "\n")?;
    std::fs::write(&suffix, lines[split..end].join("\n") + "\n")?;
    let history = session_turns(engine, &prefix).await?;
    let later = session_turns(engine, &suffix).await?;
    if history.len() < 10 {
        return Err(anyhow!(
            "{}: {} messages in its first {cut} %; a coding session needs at least 10 there",
            path.display(),
            history.len()
        ));
    }
    let held: String = history
        .iter()
        .map(|t| t.1.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let mut qa = Vec::new();
    let mut i = 0;
    while i < later.len() {
        if later[i].0 != "user" || later[i].1.starts_with("[Request interrupted") {
            i += 1;
            continue;
        }
        let mut said = later[i].1.clone();
        let mut j = i + 1;
        while j < later.len() && later[j].0 != "user" {
            said.push('\n');
            said.push_str(&later[j].1);
            j += 1;
        }
        let ids: Vec<String> = code_ids(&said)
            .into_iter()
            .filter(|id| held.contains(id.as_str()))
            .collect();
        if !ids.is_empty() {
            qa.push((later[i].1.chars().take(500).collect(), ids));
        }
        i = j;
    }
    if qa.is_empty() {
        return Err(anyhow!(
            "{}: no request after {cut} % goes back to an identifier before it",
            path.display()
        ));
    }
    Ok(Conversation {
        turns: history,
        first: "user".to_string(),
        qa,
        set: "coding",
        source: Some(prefix),
    })
}

/// The turns `order` names, taken while they fit `budget`, joined in conversation order.
pub(super) fn cut(
    turns: &[(String, u32)],
    order: impl Iterator<Item = usize>,
    budget: u32,
) -> String {
    let mut used = 0;
    let mut taken = Vec::new();
    for i in order {
        let c = turns[i].1 + MESSAGE_COST;
        if used + c > budget {
            continue;
        }
        used += c;
        taken.push(i);
    }
    taken.sort_unstable();
    taken
        .iter()
        .map(|&i| turns[i].0.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The most evenly spaced turns that fit `budget` (the largest count that fits).
fn even(turns: &[(String, u32)], budget: u32) -> String {
    let n = turns.len();
    let pick = |k: usize| -> Vec<usize> {
        let mut v: Vec<usize> = (0..k).map(|i| (i * (n - 1)) / (k - 1).max(1)).collect();
        v.dedup();
        v
    };
    let (mut lo, mut hi, mut best) = (1, n, Vec::new());
    while lo <= hi {
        let k = (lo + hi) / 2;
        let idx = pick(k);
        if idx.iter().map(|&i| turns[i].1 + MESSAGE_COST).sum::<u32>() <= budget {
            best = idx;
            lo = k + 1;
        } else {
            hi = k - 1;
        }
    }
    best.iter()
        .map(|&i| turns[i].0.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The turns as BM25 sees them (k1 1.2, b 0.75): each turn's term counts and length, and
/// each term's document frequency, counted once per conversation.
pub(super) struct Bm25 {
    docs: Vec<(BTreeMap<String, f64>, f64)>,
    df: BTreeMap<String, f64>,
    avg: f64,
}

impl Bm25 {
    pub(super) fn new(turns: &[(String, u32)]) -> Bm25 {
        let mut df: BTreeMap<String, f64> = BTreeMap::new();
        let docs: Vec<(BTreeMap<String, f64>, f64)> = turns
            .iter()
            .map(|(t, _)| {
                let mut tf: BTreeMap<String, f64> = BTreeMap::new();
                let ws = words(t);
                for w in &ws {
                    *tf.entry(w.clone()).or_insert(0.0) += 1.0;
                }
                for w in tf.keys() {
                    *df.entry(w.clone()).or_insert(0.0) += 1.0;
                }
                (tf, ws.len() as f64)
            })
            .collect();
        let avg = docs.iter().map(|(_, l)| l).sum::<f64>() / (docs.len().max(1) as f64);
        Bm25 { docs, df, avg }
    }

    /// Turn indices by score against `query`, best first (ties: the earlier turn).
    pub(super) fn rank(&self, query: &str) -> Vec<usize> {
        let n = self.docs.len() as f64;
        let q: BTreeSet<String> = answer_words(query).into_iter().collect();
        let mut scored: Vec<(f64, usize)> = self
            .docs
            .iter()
            .enumerate()
            .map(|(i, (tf, len))| {
                let s: f64 = q
                    .iter()
                    .filter_map(|w| Some((tf.get(w)?, self.df.get(w)?)))
                    .map(|(tf, df)| {
                        let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                        idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len / self.avg.max(1.0)))
                    })
                    .sum();
                (s, i)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().map(|(_, i)| i).collect()
    }
}

/// One conversation's figures at one budget, in the table's column order: abridge, the
/// share of the budget it used, recent turns, evenly spaced turns, BM25 with the question,
/// abridge with the question as its query.
type Figures = [f64; 6];

/// What one conversation measured.
struct Measured {
    /// Figures per budget.
    figures: Vec<(u32, Figures)>,
    p50_ms: f64,
    p99_ms: f64,
    /// With the question as the query.
    p50_q_ms: f64,
    p99_q_ms: f64,
    questions: usize,
    history_tokens: u64,
    /// The set the conversation is from.
    set: &'static str,
    /// The share of answer words the history itself holds (each turn with its speaker and its
    /// day): a context quoting the history can hold no more (only resolved dates add words).
    ceiling: f64,
}

/// One row of the table (no times on the mean's rows).
fn print_row(name: &str, budget: u32, x: &Figures, times: Option<(f64, f64, f64, f64)>) {
    let mut line = format!(
        "{:<10} {:>6} {:>7.3} {:>9} {:>7.3} {:>7.3} {:>7.3} {:>10.3}",
        name,
        budget,
        x[0],
        format!("{:.0} %", x[1] * 100.0),
        x[2],
        x[3],
        x[4],
        x[5]
    );
    if let Some((p50, p99, p50q, p99q)) = times {
        line.push_str(&format!(" {p50:>7.1} {p99:>7.1} {p50q:>7.1} {p99q:>7.1}"));
    }
    println!("{line}");
}

/// Whether `file` is a coding session's transcript (JSON lines), measured at each of [`CUTS`].
pub(super) fn is_session(file: &Path) -> bool {
    file.extension().is_some_and(|x| x == "jsonl")
}

/// The session a benchmark imports a conversation as.
pub(super) const SESSION: &str = "bench-context";

/// `conv` imported into a fresh database in `dir` as a user would (`abridge summarize` of its
/// transcript, then a context at each budget, which runs the refresh it needs first), and the
/// local app's handle on that database.
pub(super) fn import(
    s: &Settings,
    exe: &Path,
    conv: &Conversation,
    dir: &Path,
) -> anyhow::Result<abridge_app::Scoped> {
    let db = dir.join("bench.db");
    let run = |args: &[&str]| -> anyhow::Result<()> {
        let out = Command::new(exe)
            .arg("--db")
            .arg(&db)
            .args(["-q", "--backend", "extractive"])
            .args(args)
            .output()
            .context("running abridge")?;
        if !out.status.success() {
            return Err(anyhow!(
                "abridge {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    };
    // A coding session's history is its own file, read as an import reads it; a chat's turns
    // are written as JSON lines.
    let (path, format): (String, &[&str]) = match &conv.source {
        Some(p) => (p.display().to_string(), &[]),
        None => {
            let jsonl = dir.join("conversation.jsonl");
            let mut lines = String::new();
            for turn in &conv.turns {
                lines.push_str(&conv.message(turn).to_string());
                lines.push('\n');
            }
            std::fs::write(&jsonl, lines)?;
            (jsonl.display().to_string(), &["--format", "jsonl"])
        }
    };
    run(&[&["summarize", &path][..], format, &["--session", SESSION]].concat())?;
    for b in BUDGETS {
        run(&["context", SESSION, "--budget", &b.to_string(), "--json"])?;
    }
    let mut local_settings = s.clone();
    local_settings.db = db;
    local_settings.quiet = true;
    super::app::local(&local_settings, None).map_err(|f| f.error)
}

/// The text of the imported session's context at `budget` (with `query`, if any), read
/// without a refresh, and the tokens it counts.
pub(super) async fn context_text(
    local: &abridge_app::Scoped,
    budget: u32,
    query: Option<&str>,
) -> anyhow::Result<(String, u32)> {
    let w = local
        .context(
            SESSION,
            abridge_app::ContextAsk {
                refresh_after: u32::MAX,
                query,
                ..abridge_app::ContextAsk::new(budget)
            },
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let text = w
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Ok((text, w.tokens))
}

/// One conversation's figures: `file`'s, or a coding session's cut at `cut` % of its lines.
async fn measure(
    s: &Settings,
    exe: &Path,
    file: &Path,
    at: Option<usize>,
    runs: usize,
) -> anyhow::Result<Measured> {
    let engine = super::commands::pure_engine(s).map_err(|f| f.error)?;
    let tmp = tempfile::tempdir()?;
    let conv = match at {
        Some(at) => load_session(&engine, file, tmp.path(), at).await?,
        None => load(file)?,
    };
    let local = import(s, exe, &conv, tmp.path())?;
    let mut turns: Vec<(String, u32)> = Vec::with_capacity(conv.turns.len());
    let mut full = 0u64;
    for (_, text, _) in &conv.turns {
        let t = engine.estimate_tokens(text).await?;
        full += u64::from(t + MESSAGE_COST);
        turns.push((text.clone(), t));
    }
    // The reference's order for each question, ranked once for every budget.
    let index = Bm25::new(&turns);
    let ranked: Vec<Vec<usize>> = conv.qa.iter().map(|(q, _)| index.rank(q)).collect();
    let mut out = Vec::new();
    let mut times = Vec::new();
    let mut times_q = Vec::new();
    for budget in BUDGETS {
        let mut text = String::new();
        let mut used = 0;
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            (text, used) = context_text(&local, budget, None).await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        // With each question as the query, that question's answer words.
        let mut with_q = 0.0;
        for qa in &conv.qa {
            let started = Instant::now();
            let (text, _) = context_text(&local, budget, Some(&qa.0)).await?;
            times_q.push(started.elapsed().as_secs_f64() * 1000.0);
            with_q += kept_of(&conv, &text, std::slice::from_ref(qa));
        }
        let with_q = with_q / conv.qa.len().max(1) as f64;
        let n = turns.len();
        let bm = conv
            .qa
            .iter()
            .zip(&ranked)
            .map(|(qa, order)| {
                kept_of(
                    &conv,
                    &cut(&turns, order.iter().copied(), budget),
                    std::slice::from_ref(qa),
                )
            })
            .sum::<f64>()
            / conv.qa.len().max(1) as f64;
        out.push((
            budget,
            [
                kept_of(&conv, &text, &conv.qa),
                f64::from(used) / f64::from(budget),
                kept_of(&conv, &cut(&turns, (0..n).rev(), budget), &conv.qa),
                kept_of(&conv, &even(&turns, budget), &conv.qa),
                bm,
                with_q,
            ],
        ));
    }
    times.sort_by(f64::total_cmp);
    times_q.sort_by(f64::total_cmp);
    let whole: String = conv
        .turns
        .iter()
        .map(|(speaker, text, ms)| match ms {
            Some(ms) => format!("{} {speaker}: {text}", day_of(*ms)),
            None => format!("{speaker}: {text}"),
        })
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Measured {
        ceiling: kept_of(&conv, &whole, &conv.qa),
        figures: out,
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
        p50_q_ms: percentile(&times_q, 0.5),
        p99_q_ms: percentile(&times_q, 0.99),
        questions: conv.qa.len(),
        history_tokens: full,
        set: conv.set,
    })
}

/// `abridge bench context FILE…`.
pub async fn run(s: &Settings, paths: &[PathBuf], runs: usize) -> Result<(), Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::new(Exit::Internal, e))?;
    println!(
        "{:<10} {:>6} {:>7} {:>9} {:>7} {:>7} {:>7} {:>10} {:>7} {:>7} {:>7} {:>7}",
        "file",
        "budget",
        "abridge",
        "used",
        "recent",
        "even",
        "bm25(q)",
        "abridge(q)",
        "p50 ms",
        "p99 ms",
        "p50(q)",
        "p99(q)"
    );
    let mut sums: BTreeMap<u32, Figures> = BTreeMap::new();
    // Per set: (conversations, figures summed per budget).
    let mut per_set: BTreeMap<&'static str, (usize, BTreeMap<u32, Figures>)> = BTreeMap::new();
    let mut measured = 0;
    let mut ceiling = 0.0;
    // Each file once; a coding session at each cut.
    let runs_of: Vec<(&PathBuf, Option<usize>)> = paths
        .iter()
        .flat_map(|f| match is_session(f) {
            true => CUTS.iter().map(|c| (f, Some(*c))).collect::<Vec<_>>(),
            false => vec![(f, None)],
        })
        .collect();
    for (f, cut) in runs_of {
        match measure(s, &exe, f, cut, runs).await {
            Ok(m) => {
                measured += 1;
                let mut name: String = f
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
                    .chars()
                    .take(if cut.is_some() { 7 } else { 10 })
                    .collect();
                if let Some(c) = cut {
                    name.push_str(&format!("@{c}"));
                }
                for (b, x) in &m.figures {
                    print_row(
                        &name,
                        *b,
                        x,
                        Some((m.p50_ms, m.p99_ms, m.p50_q_ms, m.p99_q_ms)),
                    );
                    let e = sums.entry(*b).or_default();
                    for (sum, v) in e.iter_mut().zip(x) {
                        *sum += v;
                    }
                    let e = per_set.entry(m.set).or_default().1.entry(*b).or_default();
                    for (sum, v) in e.iter_mut().zip(x) {
                        *sum += v;
                    }
                }
                per_set.entry(m.set).or_default().0 += 1;
                ceiling += m.ceiling;
                println!(
                    "{name:<10} {} questions, {} tokens of history; ceiling {:.3} (answer words anywhere in the history)",
                    m.questions, m.history_tokens, m.ceiling
                );
            }
            Err(e) => println!("{}: not measured ({e:#})", f.display()),
        }
    }
    // The mean of each set, when the run has more than one set or more than one of a set.
    if per_set.len() > 1 || per_set.values().any(|(n, _)| *n > 1) {
        for (set, (n, figures)) in &per_set {
            for (b, e) in figures {
                print_row(set, *b, &e.map(|v| v / *n as f64), None);
            }
        }
    }
    if measured > 1 {
        for (b, e) in &sums {
            print_row("mean", *b, &e.map(|v| v / measured as f64), None);
        }
        println!(
            "mean ceiling {:.3} (the share of answer words the history itself holds, each turn with its day: a context that quotes it holds no more, but for the words of resolved dates)",
            ceiling / measured as f64
        );
    }
    println!(
        "abridge, recent, even, bm25(q), abridge(q): mean share of each question's answer words in the context (categories 1-4); used: context tokens / budget (abridge without a query); bm25(q) knows the question (a reference: the best-matching turns cut to the budget); abridge(q): abridge's context with the question as its query; times: the app's context call, {runs} runs per budget, and once per question with its query"
    );
    if measured == 0 {
        return Err(Failure::new(
            Exit::Input,
            anyhow!("no conversation was measured"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_dates_are_read_as_written() {
        // 8 May 2023, 13:56 UTC.
        assert_eq!(
            session_time("1:56 pm on 8 May, 2023"),
            Some(1_683_554_160_000)
        );
        assert_eq!(
            session_time("12:09 am on 13 September, 2023"),
            Some(1_694_563_740_000)
        );
        assert_eq!(session_time("on a Tuesday"), None);
    }

    #[test]
    fn realtalk_and_beam_layouts_are_read_and_a_chat_without_times_gets_none() {
        let dir = tempfile::tempdir().unwrap();
        let realtalk = dir.path().join("Chat_1_A_B.json");
        std::fs::write(
            &realtalk,
            json!({
                "name": {"speaker_1": "Emi", "speaker_2": "elise"},
                "session_1": [
                    {"clean_text": "I teach at UCLA.", "speaker": "Emi", "date_time": "29.12.2023, 22:42:04"},
                    {"clean_text": "Nice!", "speaker": "elise", "date_time": "30.12.2023, 00:32:20",
                     "blip_caption": "a campus"}
                ],
                "session_1_date_time": "29.12.2023, 22:42:04",
                "qa": [{"question": "Where does Emi teach?", "answer": "UCLA", "category": 1}]
            })
            .to_string(),
        )
        .unwrap();
        let c = load(&realtalk).unwrap();
        assert_eq!(
            (c.set, c.first.as_str(), c.turns.len()),
            ("REALTALK", "Emi", 2)
        );
        assert_eq!(c.turns[0].2, Some(1_703_889_724_000));
        assert!(c.turns[1].1.contains("[shares a photo: a campus]"));
        assert_eq!(
            c.qa,
            vec![(
                "Where does Emi teach?".to_string(),
                vec!["ucla".to_string()]
            )]
        );

        let beam = dir.path().join("1");
        std::fs::create_dir_all(beam.join("probing_questions")).unwrap();
        std::fs::write(
            beam.join("chat.json"),
            json!([{"batch_number": 1, "turns": [[
                {"role": "user", "id": 0, "content": "My sprint ends on March 29."},
                {"role": "assistant", "id": 1, "content": "Noted."}
            ]]}])
            .to_string(),
        )
        .unwrap();
        std::fs::write(
            beam.join("probing_questions").join("probing_questions.json"),
            json!({
                "information_extraction": [{"question": "When does my sprint end?", "answer": "March 29"}],
                "summarization": [{"question": "Summarize.", "ideal_summary": "A sprint plan"}],
                "abstention": [{"question": "Who is my boss?", "ideal_response": "Not said."}],
                "preference_following": [{"question": "Suggest a tool.", "rubric": ["lightweight"]}]
            })
            .to_string(),
        )
        .unwrap();
        let c = load(&beam).unwrap();
        assert_eq!(
            (c.set, c.first.as_str(), c.turns.len()),
            ("BEAM", "user", 2)
        );
        assert!(c.turns.iter().all(|t| t.2.is_none()), "no invented times");
        let questions: Vec<&str> = c.qa.iter().map(|q| q.0.as_str()).collect();
        assert_eq!(questions, ["When does my sprint end?", "Summarize."]);
        assert!(load(&beam.join("chat.json")).is_ok());
        let err = load(&dir.path().join("missing"))
            .err()
            .expect("a missing file is an error")
            .to_string();
        assert!(err.contains("reading") && err.contains("missing"), "{err}");
    }

    #[test]
    fn the_share_of_answer_words_kept() {
        let qa = vec![
            ("When?".to_string(), answer_words("7 May 2023")),
            ("What?".to_string(), answer_words("Adoption agencies")),
        ];
        assert_eq!(qa[0].1, ["7", "may", "2023"]);
        // All of the first answer, half of the second.
        let k = kept("On 7 May 2023 she called the adoption office.", &qa);
        assert!((k - 0.75).abs() < 1e-9, "{k}");
        assert_eq!(kept("", &qa), 0.0);
        assert_eq!(day_of(1_683_554_160_000), "8 May 2023");
    }

    #[test]
    fn a_coding_session_names_paths_and_code_not_words() {
        let ids = code_ids(
            "Edit `src/lib/stream.ts` so sendToSession calls JSON.stringify, then run \
             cargo test --release (see docs/README.md, rate_limit and std::fs). Took 1.3s, v2. \
             Then **./run.sh**.",
        );
        assert_eq!(
            ids,
            [
                "src/lib/stream.ts",
                "sendToSession",
                "JSON.stringify",
                "--release",
                "docs/README.md",
                "rate_limit",
                "std::fs",
                "run.sh"
            ]
        );
        let conv = Conversation {
            turns: Vec::new(),
            first: "user".into(),
            qa: Vec::new(),
            set: "coding",
            source: Some(PathBuf::from("history.jsonl")),
        };
        let qa = vec![(
            "fix it".to_string(),
            vec!["src/lib/stream.ts".to_string(), "rate_limit".to_string()],
        )];
        // Looked up whole: `rate` and `limit` apart are not `rate_limit`.
        assert_eq!(
            kept_of(&conv, "in src/lib/stream.ts at the rate limit", &qa),
            0.5
        );
    }

    #[test]
    fn baselines_stay_within_the_budget() {
        let turns: Vec<(String, u32)> = (0..50)
            .map(|i| (format!("turn {i} about the garden"), 7))
            .collect();
        // Ten turns of 7 + 3 tokens fit 100.
        let recent = cut(&turns, (0..50).rev(), 100);
        assert_eq!(recent.lines().count(), 10);
        assert!(recent.starts_with("turn 40 "));
        let spread = even(&turns, 100);
        assert_eq!(spread.lines().count(), 10);
        assert!(spread.starts_with("turn 0 ") && spread.ends_with("turn 49 about the garden"));
        let docs: Vec<(String, u32)> = ["the cat sat", "a dog ran in the park", "the park"]
            .iter()
            .map(|t| (t.to_string(), 0))
            .collect();
        assert_eq!(Bm25::new(&docs).rank("Which park did the dog visit?")[0], 1);
    }
}
