//! `abridge bench cache FILE…`: what a context costs as it is really billed, when a chat app
//! sends it on every turn. Each conversation (LoCoMo's JSON, as `bench context` reads it, and
//! a generated 200-turn chat; a coding session's `.jsonl` transcript is written a line at a
//! time and imported as the hook imports it, see [`measure_session`]) is posted one message at a time to the app in process, with the
//! extractive summarizer, as `abridge serve` takes it: a fold the post or the context read
//! makes due runs as its job before the context is read (a client that waits for it, as
//! `wait_ms` does). After every message the context is read at 1,000, 2,000 and 4,000 tokens
//! and rendered as a chat template renders it (ChatML). Against the previous turn's prompt:
//!
//! - reuse: the share of turns whose prompt begins with the previous one for at least 1,024
//!   tokens (what a provider caches: OpenAI from 1,024 tokens);
//! - billed: input tokens with prefix caching, a cached token at a tenth of the price, against
//!   the whole history sent the same way, and against the most recent turns cut to the budget;
//! - re-evaluated: the tokens a local runner (llama.cpp, Ollama) evaluates per turn — the
//!   prompt less the prefix it shares with the one before — against the whole history's;
//! - at the end of each LoCoMo conversation, the answer recall of `bench context` (the share of
//!   each question's answer words in the context), without and with the question as query.

use std::path::{Path, PathBuf};

use anyhow::anyhow;

use super::bench_context::{Conversation, kept, load};
use super::settings::BackendChoice;
use super::{Exit, Failure, Settings};

/// The budgets measured.
const BUDGETS: [u32; 3] = [1000, 2000, 4000];
/// The shortest prefix a provider caches (OpenAI; Anthropic's Sonnet models).
const MIN_CACHED: u64 = 1024;
/// The price of a cached input token, in uncached tokens.
const CACHED_PRICE: f64 = 0.1;
/// The turns of the generated chat.
const GENERATED_TURNS: usize = 200;

/// A chat template's rendering of `messages` (ChatML), as a local runner sees the prompt.
fn render<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        out.push_str(content);
        out.push_str("<|im_end|>\n");
    }
    out
}

/// The length, in bytes at a character boundary, of the prefix `a` and `b` share.
fn shared_prefix(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, x), y) in a.char_indices().zip(b.chars()) {
        if x != y {
            return i;
        }
        n = i + x.len_utf8();
    }
    n
}

/// One policy's running totals over a conversation.
#[derive(Default, Clone, Copy)]
struct Totals {
    turns: u64,
    /// Turns whose prompt reused at least [`MIN_CACHED`] tokens of the previous one.
    reused: u64,
    /// Billed input with prefix caching.
    billed: f64,
    /// Input tokens without caching.
    tokens: u64,
    /// Tokens a local runner re-evaluates.
    evaluated: u64,
}

/// Follows one policy's prompts turn after turn.
struct Meter {
    previous: String,
    totals: Totals,
}

impl Meter {
    fn new() -> Meter {
        Meter {
            previous: String::new(),
            totals: Totals::default(),
        }
    }

    /// Count a prompt of `tokens` whose shared prefix with the previous prompt is
    /// `shared_tokens` (estimated by the caller).
    fn turn(&mut self, prompt: String, tokens: u64, shared_tokens: u64) {
        let shared = shared_tokens.min(tokens);
        let cached = if shared >= MIN_CACHED { shared } else { 0 };
        let t = &mut self.totals;
        t.turns += 1;
        t.reused += u64::from(cached > 0);
        t.billed += cached as f64 * CACHED_PRICE + (tokens - cached) as f64;
        t.tokens += tokens;
        t.evaluated += tokens - shared;
        self.previous = prompt;
    }
}

/// What one conversation measured at one budget.
struct Measured {
    abridge: Totals,
    full: Totals,
    recent: Totals,
    folds: u64,
    /// Answer recall at the end, without and with the question (LoCoMo only).
    recall: Option<(f64, f64)>,
}

/// A deterministic 200-turn chat between a user planning a move and an assistant: turns of
/// varied length with names, dates and numbers, some repeated later (a generated dialogue,
/// nobody's data).
fn generated() -> Conversation {
    /// xorshift64: the same chat on every run and machine.
    struct Rng(u64);
    impl Rng {
        fn pick(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }
    const CITIES: [&str; 7] = ["Lyon", "Porto", "Ghent", "Graz", "Bergen", "Turku", "Split"];
    const PEOPLE: [&str; 6] = ["Ana", "Tomas", "Ines", "Marek", "Lea", "Oskar"];
    const THINGS: [&str; 8] = [
        "the lease",
        "the moving van",
        "the school forms",
        "the bank transfer",
        "the piano",
        "the insurance",
        "the visa appointment",
        "the storage unit",
    ];
    const ASKS: [&str; 5] = [
        "Can you remind me what we decided about",
        "I still need to sort out",
        "What is the best way to handle",
        "My sister asked again about",
        "Please draft a short note about",
    ];
    const DETAILS: [&str; 6] = [
        "the deposit is {n} euros and it is due on the {d}th",
        "{p} said the slot on the {d}th at {h}:30 still works",
        "the reference number is {n}-{d}",
        "it has to be signed before we leave for {c}",
        "{p} can help on the weekend if we pay for lunch",
        "the office in {c} closes at {h} on Fridays",
    ];
    fn fill(r: &mut Rng, s: &str) -> String {
        s.replace("{n}", &(100 + r.pick(900)).to_string())
            .replace("{d}", &(1 + r.pick(28)).to_string())
            .replace("{h}", &(8 + r.pick(10)).to_string())
            .replace("{p}", PEOPLE[r.pick(PEOPLE.len())])
            .replace("{c}", CITIES[r.pick(CITIES.len())])
    }
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    let mut turns = Vec::with_capacity(GENERATED_TURNS);
    let start = 1_767_225_600_000i64; // 1 January 2026
    for i in 0..GENERATED_TURNS {
        let at = start + (i as i64 / 20) * 86_400_000 + (i as i64 % 20) * 90_000;
        let text = if i % 2 == 0 {
            let mut t = format!(
                "{} {}?",
                ASKS[r.pick(ASKS.len())],
                THINGS[r.pick(THINGS.len())]
            );
            if r.pick(3) == 0 {
                let d = DETAILS[r.pick(DETAILS.len())];
                t.push_str(&format!(" Also, {}.", fill(&mut r, d)));
            }
            t
        } else {
            let n = 1 + r.pick(4);
            let mut t = String::from("Here is where things stand.");
            for _ in 0..n {
                let thing = THINGS[r.pick(THINGS.len())];
                let d = DETAILS[r.pick(DETAILS.len())];
                t.push_str(&format!(" For {thing}, {}.", fill(&mut r, d)));
            }
            t
        };
        let speaker = if i % 2 == 0 { "Ana" } else { "Assistant" };
        turns.push((speaker.to_string(), text, Some(at)));
    }
    Conversation {
        turns,
        first: "Ana".into(),
        qa: Vec::new(),
        set: "generated",
        source: None,
    }
}

/// The three policies' meters over one conversation, fed a turn at a time.
struct Run<'a> {
    engine: &'a abridge_app::Pure,
    budget: u32,
    abridge: Meter,
    full: Meter,
    recent: Meter,
    /// The whole history as a chat app would send it: each turn's rendering and tokens.
    history: Vec<(String, u64)>,
    folds: u64,
}

impl<'a> Run<'a> {
    fn new(engine: &'a abridge_app::Pure, budget: u32) -> Run<'a> {
        Run {
            engine,
            budget,
            abridge: Meter::new(),
            full: Meter::new(),
            recent: Meter::new(),
            history: Vec::new(),
            folds: 0,
        }
    }

    async fn est(&self, text: &str) -> anyhow::Result<u64> {
        Ok(self.engine.estimate_tokens(text).await.map(u64::from)?)
    }

    /// The turn after `said` ((role, text) messages) reached `session`: the context is read
    /// (a fold it makes due runs first, as a client that waits for it) and each policy's
    /// prompt metered. The context read.
    async fn turn(
        &mut self,
        local: &abridge_app::Scoped,
        session: &str,
        said: &[(&str, &str)],
    ) -> anyhow::Result<abridge_app::ContextView> {
        let budget = self.budget;
        let mut view = local
            .context(session, abridge_app::ContextAsk::new(budget))
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if let Some(j) = &view.job {
            local.run_job(j.id).await.map_err(|e| anyhow!("{e}"))?;
            self.folds += 1;
            view = local
                .context(session, abridge_app::ContextAsk::new(budget))
                .await
                .map_err(|e| anyhow!("{e}"))?;
        }
        // abridge's prompt.
        let prompt = render(
            view.messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_str())),
        );
        let at = shared_prefix(&self.abridge.previous, &prompt);
        let shared = self.est(&prompt[..at]).await?;
        let tokens = self.est(&prompt).await?;
        self.abridge.turn(prompt, tokens, shared);
        // The whole history.
        let mut added = 0;
        for (role, text) in said {
            let one = render([(*role, *text)]);
            let t = self.est(&one).await?;
            added += t;
            self.history.push((one, t));
        }
        let prompt: String = self.history.iter().map(|(r, _)| r.as_str()).collect();
        let tokens: u64 = self.history.iter().map(|(_, t)| t).sum();
        self.full.turn(prompt, tokens, tokens - added);
        // The most recent turns cut to the budget.
        let mut used = 0u64;
        let mut from = self.history.len();
        while from > 0 && used + self.history[from - 1].1 <= u64::from(budget) {
            used += self.history[from - 1].1;
            from -= 1;
        }
        let prompt: String = self.history[from..]
            .iter()
            .map(|(r, _)| r.as_str())
            .collect();
        let at = shared_prefix(&self.recent.previous, &prompt);
        let shared = self.est(&prompt[..at]).await?;
        self.recent.turn(prompt, used, shared);
        Ok(view)
    }

    fn measured(self, recall: Option<(f64, f64)>) -> Measured {
        Measured {
            abridge: self.abridge.totals,
            full: self.full.totals,
            recent: self.recent.totals,
            folds: self.folds,
            recall,
        }
    }
}

/// The app in process over a fresh database in `dir`, folding with the extractive summarizer.
async fn bench_app(s: &Settings, dir: &Path) -> anyhow::Result<abridge_app::Scoped> {
    let mut ls = s.clone();
    ls.db = dir.join("bench.db");
    ls.quiet = true;
    ls.backend = BackendChoice::Extractive;
    ls.config.engine = abridge_app::engine::types::Engine::Extractive;
    let backend = super::commands::choose_backend(&ls)
        .await
        .map_err(|f| f.error)?;
    super::app::local(&ls, Some(&backend)).map_err(|f| f.error)
}

async fn measure(
    s: &Settings,
    conv: &Conversation,
    budget: u32,
    engine: &abridge_app::Pure,
) -> anyhow::Result<Measured> {
    let tmp = tempfile::tempdir()?;
    let local = bench_app(s, tmp.path()).await?;
    let session = "bench-cache";
    let mut run = Run::new(engine, budget);
    let mut last_view = None;
    for turn in &conv.turns {
        let line = conv.message(turn);
        let role = line["role"].as_str().unwrap_or("user");
        let message: abridge_app::MessageIn = serde_json::from_value(line.clone())?;
        let posted = local
            .post(session, vec![message])
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if let Some(j) = posted.job {
            local.run_job(j.id).await.map_err(|e| anyhow!("{e}"))?;
            run.folds += 1;
        }
        last_view = Some(
            run.turn(&local, session, &[(role, turn.1.as_str())])
                .await?,
        );
    }
    let recall = match (&last_view, conv.qa.is_empty()) {
        (Some(view), false) => {
            let text = |v: &abridge_app::ContextView| {
                v.messages
                    .iter()
                    .map(|m| m.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let without = kept(&text(view), &conv.qa);
            let mut with = 0.0;
            for qa in &conv.qa {
                let v = local
                    .context(
                        session,
                        abridge_app::ContextAsk {
                            refresh_after: u32::MAX,
                            query: Some(&qa.0),
                            ..abridge_app::ContextAsk::new(budget)
                        },
                    )
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
                with += kept(&text(&v), std::slice::from_ref(qa));
            }
            Some((without, with / conv.qa.len() as f64))
        }
        _ => None,
    };
    Ok(run.measured(recall))
}

/// A coding session's transcript (`.jsonl`, Claude Code's records) as its agent writes it: a
/// line at a time, imported as `abridge hook` imports it (format detected, tool calls read into
/// the digest). The agent calls the model after each line it sends as the user (a request or a
/// tool's result), so the context is read after each of those. The whole history it is billed
/// against is every record's text, tool calls and tool results as the agent re-sends them
/// (thinking and attached documents left out, so the history is if anything understated).
async fn measure_session(
    s: &Settings,
    lines: &[SessionLine],
    budget: u32,
    engine: &abridge_app::Pure,
) -> anyhow::Result<Measured> {
    use std::io::Write as _;
    let tmp = tempfile::tempdir()?;
    let local = bench_app(s, tmp.path()).await?;
    let file = tmp.path().join("session.jsonl");
    let mut out = std::fs::File::create(&file)?;
    let mut run = Run::new(engine, budget);
    let mut since: Vec<(&str, &str)> = Vec::new();
    let mut session: Option<String> = None;
    for line in lines {
        writeln!(out, "{}", line.raw)?;
        if !line.sent.is_empty() {
            since.push((line.role, line.sent.as_str()));
        }
        if line.role != "user" || line.sent.is_empty() {
            continue;
        }
        out.flush()?;
        let followed = local
            .hook_import(&file)
            .await
            .map_err(|e| anyhow!("{e}"))?
            .ok_or_else(|| anyhow!("{} vanished", file.display()))?;
        if let Some(s) = followed.sessions.first() {
            session = Some(s.clone());
        }
        let Some(session) = &session else {
            continue;
        };
        run.turn(&local, session, &since).await?;
        since.clear();
    }
    if run.abridge.totals.turns == 0 {
        return Err(anyhow!("no model call in it (no line from the user)"));
    }
    Ok(run.measured(None))
}

/// A transcript line: as written, who sends it, and what the agent re-sends of it on every
/// later call.
struct SessionLine {
    raw: String,
    role: &'static str,
    sent: String,
}

/// The lines of the Claude Code transcript at `path` (a line that is not a message record is
/// still written, and sends nothing).
fn session_lines(path: &Path) -> anyhow::Result<Vec<SessionLine>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for raw in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(raw).unwrap_or_default();
        let message = &v["message"];
        let role = match message["role"].as_str() {
            Some("user") => "user",
            Some("assistant") => "assistant",
            _ => "",
        };
        let mut sent = Vec::new();
        match &message["content"] {
            serde_json::Value::String(t) => sent.push(t.clone()),
            serde_json::Value::Array(blocks) => {
                for b in blocks {
                    match b["type"].as_str() {
                        Some("text") => sent.push(b["text"].as_str().unwrap_or("").to_string()),
                        Some("tool_use") => sent.push(format!(
                            "{} {}",
                            b["name"].as_str().unwrap_or(""),
                            b["input"]
                        )),
                        Some("tool_result") => sent.push(match &b["content"] {
                            serde_json::Value::String(t) => t.clone(),
                            serde_json::Value::Array(parts) => parts
                                .iter()
                                .filter_map(|p| p["text"].as_str())
                                .collect::<Vec<_>>()
                                .join("\n"),
                            _ => String::new(),
                        }),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out.push(SessionLine {
            raw: raw.to_string(),
            role,
            sent: if role.is_empty() {
                String::new()
            } else {
                sent.join("\n")
            },
        });
    }
    if !out.iter().any(|l| l.role == "user" && !l.sent.is_empty()) {
        return Err(anyhow!(
            "{}: no message from the user in it (Claude Code's records are read)",
            path.display()
        ));
    }
    Ok(out)
}

fn print_row(name: &str, budget: u32, m: &Measured) {
    let share = |t: &Totals| t.reused as f64 / t.turns.max(1) as f64;
    let per = |t: &Totals| t.evaluated as f64 / t.turns.max(1) as f64;
    let (r0, r1) = m
        .recall
        .map_or(("-".to_string(), "-".to_string()), |(a, b)| {
            (format!("{a:.3}"), format!("{b:.3}"))
        });
    println!(
        "{:<10} {:>6} {:>6} {:>7.0} % {:>6.0} % {:>8.3} {:>8.3} {:>8.0} {:>8.0} {:>7.2} {:>5} {:>7} {:>7}",
        name,
        budget,
        m.abridge.turns,
        share(&m.abridge) * 100.0,
        share(&m.full) * 100.0,
        m.abridge.billed / m.full.billed.max(1.0),
        m.recent.billed / m.full.billed.max(1.0),
        per(&m.abridge),
        per(&m.full),
        per(&m.abridge) / per(&m.full).max(1.0),
        m.folds,
        r0,
        r1,
    );
}

/// A conversation the bench posts: a chat's turns, or a coding session's transcript lines.
enum Chat {
    Turns(Conversation),
    Session(Vec<SessionLine>),
}

/// `abridge bench cache FILE…`: the conversations named (LoCoMo's JSON, or a coding session's
/// `.jsonl` transcript), then the generated chat.
pub async fn run(s: &Settings, paths: &[PathBuf]) -> Result<(), Failure> {
    let engine = super::commands::pure_engine(s)?;
    let mut convs: Vec<(String, Chat)> = Vec::new();
    for p in paths {
        let read = if super::bench_context::is_session(p) {
            session_lines(p).map(Chat::Session)
        } else {
            load(p).map(Chat::Turns)
        };
        match read {
            Ok(c) => convs.push((short(p), c)),
            Err(e) => println!("{}: not measured ({e:#})", p.display()),
        }
    }
    convs.push(("generated".into(), Chat::Turns(generated())));
    println!(
        "{:<10} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>7} {:>7}",
        "chat",
        "budget",
        "turns",
        "reuse",
        "full",
        "billed",
        "recent",
        "re-eval",
        "full",
        "ratio",
        "folds",
        "recall",
        "(q)"
    );
    let mut sums: std::collections::BTreeMap<u32, (f64, f64, f64, f64, f64)> =
        std::collections::BTreeMap::new();
    for (name, conv) in &convs {
        for budget in BUDGETS {
            let m = match conv {
                Chat::Turns(c) => measure(s, c, budget, &engine).await,
                Chat::Session(lines) => measure_session(s, lines, budget, &engine).await,
            }
            .map_err(|e| Failure::new(Exit::Internal, e))?;
            print_row(name, budget, &m);
            let e = sums.entry(budget).or_default();
            e.0 += m.abridge.reused as f64 / m.abridge.turns.max(1) as f64;
            e.1 += m.abridge.billed / m.full.billed.max(1.0);
            e.2 += m.recent.billed / m.full.billed.max(1.0);
            e.3 += (m.abridge.evaluated as f64) / (m.full.evaluated.max(1) as f64);
            e.4 += 1.0;
        }
    }
    for (b, (reuse, billed, recent, eval, n)) in &sums {
        println!(
            "mean       {b:>6}        {:>7.0} %          {:>8.3} {:>8.3}                   {:>7.2}",
            reuse / n * 100.0,
            billed / n,
            recent / n,
            eval / n
        );
    }
    println!(
        "reuse: turns whose prompt begins with the previous one for >= {MIN_CACHED} tokens (abridge, then the whole history); billed: input tokens with prefix caching (cached x{CACHED_PRICE}) over the whole history's, for abridge and for the most recent turns cut to the budget; re-eval: tokens a local runner evaluates per turn (prompt less the prefix shared with the previous one), abridge then the whole history, and their ratio; folds: fold jobs run; recall, (q): answer recall of the final context without and with the question as query (LoCoMo only)"
    );
    Ok(())
}

fn short(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        .chars()
        .take(10)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_line_sends_its_texts_tool_calls_and_results_and_the_user_calls_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let lines = [
            r#"{"type":"file-history-snapshot","snapshot":{}}"#,
            r#"{"type":"user","message":{"role":"user","content":"Fix the build"}}"#,
            r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Looking."},{"type":"tool_use","name":"Bash","input":{"command":"cargo build"}}]}}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"error[E0308]"}]}]}}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let read = session_lines(&path).unwrap();
        let got: Vec<(&str, &str)> = read.iter().map(|l| (l.role, l.sent.as_str())).collect();
        assert_eq!(
            got,
            [
                ("", ""),
                ("user", "Fix the build"),
                ("assistant", "Looking.\nBash {\"command\":\"cargo build\"}"),
                ("user", "error[E0308]"),
            ]
        );
        assert_eq!(read[2].raw, lines[2]);
        // A file with nothing from the user is refused with what the bench reads.
        std::fs::write(&path, lines[0]).unwrap();
        let e = session_lines(&path).err().unwrap().to_string();
        assert!(e.contains("no message from the user"), "{e}");
    }

    #[test]
    fn a_prefix_is_shared_up_to_the_first_difference() {
        assert_eq!(shared_prefix("abcdef", "abcxyz"), 3);
        assert_eq!(shared_prefix("abc", "abcdef"), 3);
        assert_eq!(shared_prefix("", "abc"), 0);
        assert_eq!(shared_prefix("é1", "é2"), "é".len());
    }

    #[test]
    fn a_cached_prefix_is_billed_at_a_tenth_from_the_minimum_on() {
        let mut m = Meter::new();
        m.turn("a".into(), 2000, 0);
        m.turn("b".into(), 2100, 2000);
        m.turn("c".into(), 2200, 500);
        let t = m.totals;
        assert_eq!((t.turns, t.reused), (3, 1));
        assert!((t.billed - (2000.0 + 200.0 + 100.0 + 2200.0)).abs() < 1e-9);
        assert_eq!(t.evaluated, 2000 + 100 + 1700);
    }

    #[test]
    fn the_generated_chat_is_the_same_every_run() {
        let a = generated();
        let b = generated();
        assert_eq!(a.turns.len(), GENERATED_TURNS);
        assert_eq!(a.turns, b.turns);
    }
}
