//! `abridge bench cache FILE…`: what a context costs as it is really billed, when a chat app
//! sends it on every turn. Each conversation (LoCoMo's JSON, as `bench context` reads it, and
//! a generated 200-turn chat) is posted one message at a time to the app in process, with the
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

async fn measure(
    s: &Settings,
    conv: &Conversation,
    budget: u32,
    engine: &abridge_engine::Abridge,
) -> anyhow::Result<Measured> {
    let tmp = tempfile::tempdir()?;
    let mut ls = s.clone();
    ls.db = tmp.path().join("bench.db");
    ls.quiet = true;
    ls.backend = BackendChoice::Extractive;
    ls.config.engine = abridge_engine::types::Engine::Extractive;
    let backend = super::commands::choose_backend(&ls)
        .await
        .map_err(|f| f.error)?;
    let local = super::app::local(&ls, Some(&backend)).map_err(|f| f.error)?;
    let session = "bench-cache";
    let est = |text: String| async move { engine.estimate_tokens(&text).await.map(u64::from) };
    let mut abridge = Meter::new();
    let mut full = Meter::new();
    let mut recent = Meter::new();
    // The whole history as a chat app would send it, and each turn's rendering.
    let mut history: Vec<(String, u64)> = Vec::new();
    let mut folds = 0u64;
    let mut last_view = None;
    for turn in &conv.turns {
        let line = conv.message(turn);
        let role = line["role"].as_str().unwrap_or("user");
        let posted = local
            .append_jsonl(session, format!("{line}\n").into_bytes())
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if let Some(j) = posted.job {
            local.run_job(j.id).await.map_err(|e| anyhow!("{e}"))?;
            folds += 1;
        }
        let mut view = local
            .context(session, budget, 4, 8, None, None)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if let Some(j) = &view.job {
            local.run_job(j.id).await.map_err(|e| anyhow!("{e}"))?;
            folds += 1;
            view = local
                .context(session, budget, 4, 8, None, None)
                .await
                .map_err(|e| anyhow!("{e}"))?;
        }
        // abridge's prompt.
        let prompt = render(
            view.messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_str())),
        );
        let at = shared_prefix(&abridge.previous, &prompt);
        let shared = est(prompt[..at].to_string()).await?;
        let tokens = est(prompt.clone()).await?;
        abridge.turn(prompt, tokens, shared);
        // The whole history.
        let one = render([(role, turn.1.as_str())]);
        let t = est(one.clone()).await?;
        history.push((one, t));
        let prompt: String = history.iter().map(|(r, _)| r.as_str()).collect();
        let tokens: u64 = history.iter().map(|(_, t)| t).sum();
        let shared = tokens - t;
        full.turn(prompt, tokens, shared);
        // The most recent turns cut to the budget.
        let mut used = 0u64;
        let mut from = history.len();
        while from > 0 && used + history[from - 1].1 <= u64::from(budget) {
            used += history[from - 1].1;
            from -= 1;
        }
        let prompt: String = history[from..].iter().map(|(r, _)| r.as_str()).collect();
        let at = shared_prefix(&recent.previous, &prompt);
        let shared = est(prompt[..at].to_string()).await?;
        recent.turn(prompt, used, shared);
        last_view = Some(view);
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
                    .context(session, budget, 4, u32::MAX, None, Some(&qa.0))
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
                with += kept(&text(&v), std::slice::from_ref(qa));
            }
            Some((without, with / conv.qa.len() as f64))
        }
        _ => None,
    };
    Ok(Measured {
        abridge: abridge.totals,
        full: full.totals,
        recent: recent.totals,
        folds,
        recall,
    })
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

/// `abridge bench cache FILE…`: the LoCoMo conversations named, then the generated chat.
pub async fn run(s: &Settings, paths: &[PathBuf]) -> Result<(), Failure> {
    let engine = super::commands::pure_engine(s)?;
    let mut convs: Vec<(String, Conversation)> = Vec::new();
    for p in paths {
        match load(p) {
            Ok(c) => convs.push((short(p), c)),
            Err(e) => println!("{}: not measured ({e:#})", p.display()),
        }
    }
    convs.push(("generated".into(), generated()));
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
            let m = measure(s, conv, budget, &engine)
                .await
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
