//! Summaries that do not drift, measured in one run: identifier retention (the facts ledger
//! against the prose alone), the second level's coverage at 1,000 turns, and what keeping a
//! chat summarized message by message costs in prompt characters per transcript character,
//! every mode side by side (the default first) at 200 and 2,000 turns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use abridge_engine::types::{
    Config, ContextRequest, ContextWindow, Engine, Error, FinishReason, Mode, NewEpisode, Request,
    Response, Role,
};
use abridge_engine::{Abridge, LlmBackend, ManualClock, Runtime};
use abridge_store::SqliteStore;

use crate::Failure;

/// The test server's deterministic summarizer (topics and the last words, nothing else: it
/// drops every earlier fact), counting the prompt characters it was sent.
#[derive(Default)]
struct Model {
    chars: AtomicU64,
    calls: AtomicU64,
}

#[async_trait]
impl LlmBackend for Model {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let text = req.prompt.text();
        self.chars
            .fetch_add(text.chars().count() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(Response {
            text: abridge_test_llm::summarize(&text),
            finish_reason: FinishReason::Stop,
            prompt_tokens: Some(abridge_test_llm::count_tokens(&text)),
            output_tokens: Some(60),
            server_ms: None,
        })
    }

    fn name(&self) -> &str {
        "counting"
    }
}

impl Model {
    fn take(&self) -> (u64, u64) {
        (
            self.chars.swap(0, Ordering::Relaxed),
            self.calls.swap(0, Ordering::Relaxed),
        )
    }
}

fn engine(runtime: &Arc<Runtime>, model: &Arc<Model>) -> Result<Abridge, Failure> {
    Abridge::builder()
        .runtime(runtime.clone())
        .store(Arc::new(SqliteStore::in_memory().unwrap()))
        .llm(model.clone())
        .build()
        .map_err(crate::fail)
}

fn episode(i: usize, role: Role, content: String) -> NewEpisode {
    NewEpisode {
        role,
        content,
        source_key: format!("t{i}"),
        tokens: 0,
        ..Default::default()
    }
}

/// Message `i` of a synthetic chat with planted identifiers: a user asks (about 150
/// characters) and the assistant answers (about 400).
fn chat(i: usize) -> NewEpisode {
    if i.is_multiple_of(2) {
        episode(
            i,
            Role::User,
            format!(
                "Can you check why job {} in services/worker{}/queue.rs retries {} times before it gives up? It started after release v3.{}.0.",
                i * 13,
                i % 9,
                3 + i % 4,
                i % 17
            ),
        )
    } else {
        episode(
            i,
            Role::Assistant,
            format!(
                "The retry loop reads its limit from the environment, so the deploy on 2026-{:02}-{:02} changed it: the old value was {} and the new one is {}. \
                 I would set it back, add a test that pins the limit, and watch the p99 latency, which went from {} ms to {} ms after that release. \
                 Ticket OPS-{} tracks the follow-up.",
                1 + i % 12,
                1 + i % 28,
                3 + i % 4,
                5 + i % 4,
                120 + i,
                180 + i,
                400 + i
            ),
        )
    }
}

fn text_of(w: &ContextWindow) -> String {
    w.messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers of `texts` found in `context` (by the guest's own extraction rules).
async fn retention(
    e: &Abridge,
    texts: &[String],
    context: &str,
) -> Result<(usize, usize), Failure> {
    let mut all = std::collections::BTreeSet::new();
    for t in texts {
        for id in e.identifiers(t).await.map_err(crate::fail)? {
            all.insert(id.text);
        }
    }
    let kept = all.iter().filter(|x| context.contains(x.as_str())).count();
    Ok((all.len(), kept))
}

/// Feed `episodes` one by one under `cfg`, then measure retention in the final context
/// (ledger and prose) and in the prose alone.
async fn retention_run(
    runtime: &Arc<Runtime>,
    model: &Arc<Model>,
    episodes: Vec<NewEpisode>,
    cfg: &Config,
) -> Result<(usize, usize, usize, u32, u32), Failure> {
    let fail = crate::fail;
    let e = engine(runtime, model)?;
    let texts: Vec<String> = episodes.iter().map(|x| x.content.clone()).collect();
    for ep in episodes {
        e.append("r", &[ep]).await.map_err(fail)?;
        e.after_episode_written("r", cfg).await.map_err(fail)?;
    }
    e.summarize_now("r", cfg).await.map_err(fail)?;
    // A context of half the history's tokens: one the history does not fit (a history that
    // fits is the context verbatim, which would measure nothing).
    let req = ContextRequest {
        query: None,
        budget: 1_000_000,
        pairs: 1,
        refresh_after: 8,
        pins: vec![],
        ..Default::default()
    };
    let whole = e.context("r", req.clone(), cfg).await.map_err(fail)?;
    let req = ContextRequest {
        budget: (whole.full_tokens / 2).clamp(64, u64::from(u32::MAX)) as u32,
        ..req
    };
    let w = e.context("r", req, cfg).await.map_err(fail)?;
    let (all, with_ledger) = retention(&e, &texts, &text_of(&w)).await?;
    let prose = e
        .chain("r")
        .await
        .map_err(fail)?
        .iter()
        .map(|r| r.content.clone())
        .collect::<Vec<_>>()
        .join("\n");
    let (_, prose_only) = retention(&e, &texts, &prose).await?;
    model.take();
    Ok((
        all,
        with_ledger,
        prose_only,
        w.identifiers,
        folds_of(&e).await?,
    ))
}

async fn folds_of(e: &Abridge) -> Result<u32, Failure> {
    Ok(e.history("r").await.map_err(crate::fail)?.len() as u32)
}

/// The real transcripts under `../shared/data/transcripts`, as episode lists (none when the
/// folder is absent).
async fn real_transcripts(e: &Abridge) -> Vec<(String, Vec<NewEpisode>)> {
    let root = crate::from_root(std::path::Path::new("../shared/data/transcripts"));
    let mut out = Vec::new();
    let Ok(pure) = abridge_app::Pure::new(e.runtime().clone(), std::sync::Arc::new(|_, _| {}))
    else {
        return out;
    };
    for sub in [
        "claude_code/obra-episodic-memory/long-conversation.jsonl",
        "claude_code/simonw-claude-code-transcripts/sample_session.jsonl",
        "chatgpt_export/mitkury-chatgpt-export-parser/example-conversation.json",
    ] {
        let path = root.join(sub);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(parsed) = abridge_app::transcript::parse_bytes(
            &pure,
            sub,
            &bytes,
            None,
            abridge_app::transcript::Options::default(),
        )
        .await
        else {
            continue;
        };
        let eps: Vec<NewEpisode> = parsed
            .conversations
            .into_iter()
            .flat_map(|c| c.episodes)
            .collect();
        if !eps.is_empty() {
            out.push((sub.to_string(), eps));
        }
    }
    out
}

pub async fn run(runtime: Arc<Runtime>) -> Result<(), Failure> {
    let fail = crate::fail;
    let model = Arc::new(Model::default());
    let base = Config {
        engine: Engine::Llm,
        ledger_tokens: 4000,
        ..Config::default()
    };

    // 1. Identifier retention after the whole conversation.
    let synthetic: Vec<NewEpisode> = (0..300).map(chat).collect();
    let (all, kept, prose, in_ctx, rows) =
        retention_run(&runtime, &model, synthetic, &base).await?;
    println!(
        "ledger retention  300-message chat with planted identifiers, test model that keeps only topics and the last words: identifiers in a context of half the history's tokens {kept}/{all} = {:.1} % (ledger {in_ctx} entries, ledger budget 4,000 tokens) vs the prose alone {prose}/{all} = {:.1} % ({rows} summary rows) | target 100 % within budget: {}",
        100.0 * kept as f64 / all.max(1) as f64,
        100.0 * prose as f64 / all.max(1) as f64,
        crate::verdict(kept == all)
    );
    let probe = engine(&runtime, &model)?;
    let real = real_transcripts(&probe).await;
    if real.is_empty() {
        println!(
            "ledger retention  real transcripts: SKIPPED (../shared/data/transcripts not found)"
        );
    }
    for (name, eps) in real {
        let n = eps.len();
        let (all, kept, prose, in_ctx, _) = retention_run(&runtime, &model, eps, &base).await?;
        println!(
            "ledger retention  {name} ({n} episodes): a context of half the history's tokens {kept}/{all} = {:.1} % (ledger {in_ctx} entries) vs prose alone {prose}/{all} = {:.1} %",
            100.0 * kept as f64 / all.max(1) as f64,
            100.0 * prose as f64 / all.max(1) as f64,
        );
    }

    // 2. The second level: 1,000 turns, rows closing often, a 2,000-token context.
    let e = engine(&runtime, &model)?;
    let cfg = Config {
        max_summary_tokens: 60,
        summary_budget_tokens: 1000,
        ledger_tokens: 300,
        ..base.clone()
    };
    for i in 0..1000 {
        e.append("c", &[chat(i)]).await.map_err(fail)?;
        e.after_episode_written("c", &cfg).await.map_err(fail)?;
    }
    let req = ContextRequest {
        query: None,
        budget: 2000,
        pairs: 4,
        refresh_after: 8,
        pins: vec![],
        ..Default::default()
    };
    let w = e.context("c", req, &cfg).await.map_err(fail)?;
    let history = e.history("c").await.map_err(fail)?;
    let active = e.chain("c").await.map_err(fail)?;
    let (calls_chars, calls) = model.take();
    println!(
        "second level      1,000 turns, rows closing at 60 tokens, chain budget 1,000, 2,000-token context: {} tokens, covers episodes {}-1000 (omitted {:?}), summary level {}, {} active rows of {} written ({calls} calls, {:.1}k prompt chars) | full coverage within budget: {}",
        w.tokens,
        w.covered_from,
        w.omitted_ranges
            .iter()
            .map(|r| (r.first, r.last))
            .collect::<Vec<_>>(),
        w.level,
        active.len(),
        history.len(),
        calls_chars as f64 / 1000.0,
        crate::verdict(w.covered_from == 1 && w.omitted_ranges.is_empty() && w.tokens <= 2000)
    );

    // 3. Prompt characters per transcript character, a chat fed message by message in each
    // mode, at 200 and 2,000 turns: a message a minute, two quiet hours every 100 messages.
    for turns in [200usize, 2000] {
        fold_cost(&runtime, &model, turns, 4096).await?;
    }
    // The window target needs folds large beside their fixed part (instructions and summary):
    // the same chat with a model context of 8,192 tokens.
    fold_cost(&runtime, &model, 2000, 8192).await?;
    Ok(())
}

/// The chat's message `i` with its time: a message a minute, two quiet hours after every 100.
fn timed(i: usize) -> (u64, NewEpisode) {
    let at = crate::fresh::turn_time(i);
    let mut ep = chat(i);
    ep.timestamp_ms = Some(at as i64);
    (at, ep)
}

/// One row of the fold-cost table: each mode (the default first) keeps a `turns`-message chat
/// summarized message by message, with a context read after every message; prompt characters
/// per transcript character, calls, and messages ever missing from a context.
async fn fold_cost(
    runtime: &Arc<Runtime>,
    model: &Arc<Model>,
    turns: usize,
    context_length: u32,
) -> Result<(), Failure> {
    let transcript: u64 = (0..turns)
        .map(|i| chat(i).content.chars().count() as u64)
        .sum();
    // The context runs the fold its own verdict makes due first (as every front end does: the
    // command line inline, a service as a job it may wait for), so the turns since the last
    // fold stay within the context's high-water mark.
    let ctx = ContextRequest {
        query: None,
        budget: 6000,
        pairs: 4,
        refresh_after: 8,
        pins: vec![],
        ..Default::default()
    };
    // The defaults (300-token ledger in every fold prompt), with a model configured.
    let defaults = Config {
        engine: Engine::Llm,
        context_length,
        ..Config::default()
    };
    // At another context than the default's, window mode alone.
    let mut modes = if context_length == Config::default().context_length {
        vec![Mode::Eager, Mode::Idle, Mode::Window]
    } else {
        vec![Mode::Window]
    };
    modes.sort_by_key(|m| *m != defaults.mode);
    let mut cells = Vec::new();
    let mut default_ratio = f64::MAX;
    let mut window_ratio = f64::MAX;
    let mut all_complete = true;
    for mode in modes {
        let cfg = Config {
            mode,
            ..defaults.clone()
        };
        let clock = Arc::new(ManualClock::at(crate::fresh::T0));
        let e = Abridge::builder()
            .runtime(runtime.clone())
            .store(Arc::new(SqliteStore::in_memory().unwrap()))
            .llm(model.clone())
            .clock(clock.clone())
            .build()
            .map_err(crate::fail)?;
        let mut missing = 0u64;
        for i in 0..turns {
            let (at, ep) = timed(i);
            clock.set(at);
            e.append("w", &[ep]).await.map_err(crate::fail)?;
            e.after_episode_written("w", &cfg)
                .await
                .map_err(crate::fail)?;
            let w = e
                .context("w", ctx.clone(), &cfg)
                .await
                .map_err(crate::fail)?;
            missing += w.omitted;
            if i % 100 == 99 {
                // The quiet hours: what a scheduler's idle pass would do.
                clock.set(at + 2 * crate::fresh::HOUR - 1);
                e.after_episode_written("w", &cfg)
                    .await
                    .map_err(crate::fail)?;
            }
        }
        let (chars, calls) = model.take();
        let ratio = chars as f64 / transcript as f64;
        let name = match mode {
            Mode::Eager => "eager",
            Mode::Idle => "idle",
            Mode::Window => "window",
        };
        if mode == defaults.mode {
            default_ratio = ratio;
            all_complete &= missing == 0;
        }
        if mode == Mode::Window {
            window_ratio = ratio;
        }
        let tag = if mode == defaults.mode {
            " (default)"
        } else {
            ""
        };
        cells.push(format!(
            "{name}{tag} {ratio:.3} ({calls} calls, {missing} missing)"
        ));
    }
    if context_length != Config::default().context_length {
        println!(
            "fold cost         {turns}-turn chat at a {context_length}-token model context, prompt chars per transcript char: {} | target window <= 1.10: {}",
            cells.join(" | "),
            crate::verdict(window_ratio <= 1.10)
        );
        return Ok(());
    }
    println!(
        "fold cost         {turns}-turn chat ({:.1}k transcript chars), prompt chars per transcript char: {} | targets default <= 1.30 with none missing, window <= 1.10: {}",
        transcript as f64 / 1000.0,
        cells.join(" | "),
        crate::verdict(default_ratio <= 1.30 && all_complete && window_ratio <= 1.10)
    );
    Ok(())
}
