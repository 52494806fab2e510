//! The freshness benchmark: what keeping a summary fresh costs, per mode, against
//! re-summarizing everything each time, and what the context saves.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use abridge_engine::types::{
    Config, ContextRequest, Engine, Error, FinishReason, Mode, NewEpisode, Request, Response, Role,
};
use abridge_engine::{Abridge, LlmBackend, ManualClock, Runtime};
use abridge_store::SqliteStore;

use crate::Failure;

/// A model that answers at once (the test server's deterministic summary) and adds up the
/// prompt tokens it was sent, counted the way the test server counts them.
#[derive(Default)]
struct CountingModel {
    prompt_tokens: AtomicU64,
    calls: AtomicU64,
}

#[async_trait]
impl LlmBackend for CountingModel {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let text = req.prompt.text();
        let n = abridge_test_llm::count_tokens(&text);
        self.prompt_tokens
            .fetch_add(u64::from(n), Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(Response {
            text: abridge_test_llm::summarize(&text),
            finish_reason: FinishReason::Stop,
            prompt_tokens: Some(n),
            output_tokens: Some(60),
            server_ms: None,
        })
    }

    fn name(&self) -> &str {
        "counting"
    }
}

impl CountingModel {
    fn take(&self) -> (u64, u64) {
        (
            self.prompt_tokens.swap(0, Ordering::Relaxed),
            self.calls.swap(0, Ordering::Relaxed),
        )
    }
}

const MINUTE: u64 = 60_000;
pub(crate) const HOUR: u64 = 60 * MINUTE;
pub(crate) const T0: u64 = 1_767_225_600_000;

/// When turn `i` of the synthetic conversations arrives: a turn a minute, and a two-hour
/// pause after every hundred turns (bursts of activity).
pub(crate) fn turn_time(i: usize) -> u64 {
    T0 + i as u64 * MINUTE + (i / 100) as u64 * 2 * HOUR
}

/// Turn `i` of a synthetic conversation, at [`turn_time`].
fn turn(i: usize) -> (u64, NewEpisode) {
    let at = turn_time(i);
    let topic = [
        "the schema migration",
        "the replica lag",
        "the release notes",
        "the on-call rota",
        "the cost report",
    ][(i / 37) % 5];
    let content = format!(
        "Turn {i} about {topic}: we compared option {} with option {}, agreed to measure the latency budget again on staging, and noted that the rollback plan needs an owner before Friday.",
        i % 7,
        (i * 3) % 11
    );
    (
        at,
        NewEpisode {
            role: if i.is_multiple_of(2) {
                Role::User
            } else {
                Role::Assistant
            },
            content,
            timestamp_ms: Some(at as i64),
            source_key: format!("t{i}"),
            tokens: 0,
            ..Default::default()
        },
    )
}

fn engine(
    runtime: &Arc<Runtime>,
    model: &Arc<CountingModel>,
    clock: &Arc<ManualClock>,
) -> Result<Abridge, Failure> {
    Abridge::builder()
        .runtime(runtime.clone())
        .store(Arc::new(SqliteStore::in_memory().unwrap()))
        .llm(model.clone())
        .clock(clock.clone())
        .build()
        .map_err(crate::fail)
}

/// Feed `turns` turns one by one in eager and idle mode and against the baseline; print the
/// prompt tokens each spent and the context saving at the end.
pub async fn run(runtime: Arc<Runtime>, turns: usize) -> Result<(), Failure> {
    let fail = crate::fail;
    let model = Arc::new(CountingModel::default());
    let clock = Arc::new(ManualClock::at(T0));
    let eager_cfg = Config {
        engine: Engine::Llm,
        ..Config::default()
    };
    let idle_cfg = Config {
        mode: Mode::Idle,
        ..eager_cfg.clone()
    };

    // Eager: the trigger after every turn (a summary pass every 5 new turns).
    let eager = engine(&runtime, &model, &clock)?;
    for i in 0..turns {
        let (at, ep) = turn(i);
        clock.set(at);
        eager.append("s", &[ep]).await.map_err(fail)?;
        eager
            .after_episode_written("s", &eager_cfg)
            .await
            .map_err(fail)?;
    }
    let (eager_tokens, eager_calls) = model.take();
    let window = eager
        .context(
            "s",
            ContextRequest {
                query: None,
                budget: 2000,
                pairs: 4,
                refresh_after: 8,
                pins: vec![],
                ..Default::default()
            },
            &eager_cfg,
        )
        .await
        .map_err(fail)?;

    // Idle: checked before every turn; a summary once a burst has been quiet for an hour.
    let idle = engine(&runtime, &model, &clock)?;
    for i in 0..turns {
        let (at, ep) = turn(i);
        clock.set(at);
        idle.refresh("s", &idle_cfg).await.map_err(fail)?;
        idle.append("s", &[ep]).await.map_err(fail)?;
    }
    clock.advance(2 * HOUR);
    idle.refresh("s", &idle_cfg).await.map_err(fail)?;
    let (idle_tokens, idle_calls) = model.take();
    let idle_chain = idle.chain("s").await.map_err(fail)?;
    if idle_chain.last().map(|r| r.last_episode) != Some(turns as u64) {
        return Err(crate::fail("the idle run did not end covered"));
    }

    // Baseline: at the same moments eager summarizes, summarize the whole history from
    // scratch (a fresh store each time, so no cached partial helps).
    let (mut at_turn, mut points) = (0usize, 0u32);
    while at_turn + 5 <= turns {
        at_turn += 5;
        points += 1;
        let base = engine(&runtime, &model, &clock)?;
        let history: Vec<NewEpisode> = (0..at_turn).map(|i| turn(i).1).collect();
        base.append("b", &history).await.map_err(fail)?;
        base.summarize_now("b", &eager_cfg).await.map_err(fail)?;
    }
    let (base_tokens, base_calls) = model.take();

    let k = |n: u64| format!("{:.1}k", n as f64 / 1000.0);
    println!(
        "freshness         {turns} turns fed one by one, prompt tokens to keep the summary fresh: eager {} ({eager_calls} calls) | idle {} ({idle_calls} calls) | re-summarize everything at each of eager's {points} passes {} ({base_calls} calls) | eager/baseline {:.3} | idle/baseline {:.3}",
        k(eager_tokens),
        k(idle_tokens),
        k(base_tokens),
        eager_tokens as f64 / base_tokens as f64,
        idle_tokens as f64 / base_tokens as f64,
    );
    let saving = 100.0 * (1.0 - f64::from(window.tokens) / window.full_tokens as f64);
    println!(
        "context           at {turns} turns, 2,000-token budget, 4 pairs: {} tokens ({} messages) vs the full history {} tokens = {saving:.1} % saved | target >= 80 %: {}",
        window.tokens,
        window.messages.len(),
        window.full_tokens,
        crate::verdict(saving >= 80.0)
    );
    Ok(())
}
