//! `abridge bench`: start-up, per-call, summary-pass and import figures, printed against the
//! targets in one run. Build with `--release`; a debug build prints a warning.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use async_trait::async_trait;
use clap::Args;

use abridge::types::{
    Config, Engine, Episode, Error, FinishReason, NewEpisode, Request, Response, Role,
    SessionStats, SummaryRow, SummaryWrite,
};
use abridge::{Abridge, ComponentSource, LlmBackend, Runtime, SqliteStore, Store};

use super::{Exit, Failure};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Episodes for the import benchmark
    #[arg(long, default_value_t = 100_000)]
    episodes: usize,
    /// Repetitions for the per-call and summary-pass figures
    #[arg(long, default_value_t = 2_000)]
    calls: usize,
    /// Also score the extractive summarizer on this DialogSum JSONL file (ROUGE F1 against
    /// the human summaries, with a lead-3 baseline), e.g. ../shared/data/dialogsum_test.jsonl
    #[arg(long, value_name = "PATH")]
    dialogsum: Option<std::path::PathBuf>,
}

/// A model that answers at once, so only engine work is measured.
struct InstantModel;

#[async_trait]
impl LlmBackend for InstantModel {
    async fn generate(&self, _req: Request) -> Result<Response, Error> {
        Ok(Response {
            text: "The user and the assistant planned the database upgrade and agreed on a maintenance window.".into(),
            finish_reason: FinishReason::Stop,
            prompt_tokens: Some(3000),
            output_tokens: Some(20),
        })
    }

    fn name(&self) -> &str {
        "instant"
    }
}

/// Wraps a store and adds up the time spent in it (host work, not guest work).
struct TimedStore {
    inner: SqliteStore,
    nanos: AtomicU64,
}

impl TimedStore {
    fn add(&self, started: Instant) {
        self.nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

macro_rules! timed {
    ($self:ident, $call:expr) => {{
        let t = Instant::now();
        let r = $call.await;
        $self.add(t);
        r
    }};
}

#[async_trait]
impl Store for TimedStore {
    async fn append_episodes(&self, s: &str, e: Vec<NewEpisode>) -> Result<u32, Error> {
        timed!(self, self.inner.append_episodes(s, e))
    }
    async fn stats(&self, s: &str) -> Result<SessionStats, Error> {
        timed!(self, self.inner.stats(s))
    }
    async fn episodes_after(&self, s: &str, after: u64, limit: u32) -> Result<Vec<Episode>, Error> {
        timed!(self, self.inner.episodes_after(s, after, limit))
    }
    async fn latest_summary(&self, s: &str) -> Result<Option<SummaryRow>, Error> {
        timed!(self, self.inner.latest_summary(s))
    }
    async fn summaries(&self, s: &str) -> Result<Vec<SummaryRow>, Error> {
        timed!(self, self.inner.summaries(s))
    }
    async fn write_summary(&self, s: &str, w: SummaryWrite) -> Result<SummaryRow, Error> {
        timed!(self, self.inner.write_summary(s, w))
    }
    async fn sessions(&self) -> Result<Vec<String>, Error> {
        timed!(self, self.inner.sessions())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

fn fail(e: impl std::fmt::Display) -> Failure {
    Failure::new(Exit::Internal, anyhow!("benchmark failed: {e}"))
}

/// Synthetic dialogue text of roughly `words` words.
fn sentence(i: usize, words: usize) -> String {
    const W: &[&str] = &[
        "database",
        "upgrade",
        "window",
        "replica",
        "the",
        "we",
        "should",
        "check",
        "backup",
        "before",
        "migration",
        "latency",
        "and",
        "index",
        "query",
        "plan",
        "rollout",
        "tomorrow",
        "staging",
        "cluster",
    ];
    let mut s = String::new();
    for k in 0..words {
        if k > 0 {
            s.push(' ');
        }
        s.push_str(W[(i * 7 + k * 13) % W.len()]);
    }
    s.push('.');
    s
}

pub async fn run(a: BenchArgs) -> Result<(), Failure> {
    if cfg!(debug_assertions) {
        println!(
            "warning: this is a debug build; run `cargo run --release -- bench` for meaningful figures\n"
        );
    }
    println!(
        "abridge bench ({} cores)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    // 1. Component start: cold compile vs the on-disk cache.
    let dir = tempfile::tempdir().map_err(fail)?;
    let mut cold = Vec::new();
    for _ in 0..3 {
        let rt = Runtime::load(&ComponentSource::Embedded, None).map_err(fail)?;
        cold.push(rt.report().millis);
    }
    Runtime::load(&ComponentSource::Embedded, Some(dir.path())).map_err(fail)?;
    let mut warm = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let rt = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).map_err(fail)?;
        warm.push(t.elapsed().as_secs_f64() * 1e3);
        if !rt.report().from_cache {
            return Err(fail("the disk cache was not used"));
        }
    }
    let (cold, warm) = (median(cold), median(warm));
    println!(
        "component start   cold compile {cold:8.2} ms | from disk cache {warm:6.2} ms (incl. linking) | ratio {:.1}x | target cache <= 20 ms: {}",
        cold / warm,
        verdict(warm <= 20.0)
    );

    let runtime =
        Arc::new(Runtime::load(&ComponentSource::Embedded, Some(dir.path())).map_err(fail)?);

    // 2. A fresh instance per call.
    let engine = Abridge::builder()
        .runtime(runtime.clone())
        .store(Arc::new(SqliteStore::in_memory().map_err(fail)?))
        .build()
        .map_err(fail)?;
    let t = Instant::now();
    for _ in 0..a.calls {
        engine.estimate_tokens("x").await.map_err(fail)?;
    }
    let per_call = t.elapsed().as_secs_f64() * 1e6 / a.calls as f64;
    let big = "word ".repeat(50 * 1024 / 5);
    let t = Instant::now();
    for _ in 0..200 {
        engine.estimate_tokens(&big).await.map_err(fail)?;
    }
    let big_call = t.elapsed().as_secs_f64() * 1e6 / 200.0;
    println!(
        "call overhead     fresh instance + tiny call {per_call:6.1} µs | with a 50 KiB string {big_call:6.1} µs | target <= 100 µs: {}",
        verdict(per_call <= 100.0)
    );

    // 3. Guest work for one summary pass over ~3,000 tokens (LLM and store time excluded).
    let timed = Arc::new(TimedStore {
        inner: SqliteStore::in_memory().map_err(fail)?,
        nanos: AtomicU64::new(0),
    });
    let engine = Abridge::builder()
        .runtime(runtime.clone())
        .store(timed.clone())
        .llm(Arc::new(InstantModel))
        .build()
        .map_err(fail)?;
    let cfg = Config {
        context_length: 8192,
        engine: Engine::Llm,
        ..Config::default()
    };
    let episodes: Vec<NewEpisode> = (0..20)
        .map(|i| NewEpisode {
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            content: sentence(i, 80),
            timestamp_ms: None,
            source_key: format!("{i}"),
            tokens: 0,
        })
        .collect();
    let input_tokens: u32 = {
        let mut n = 0;
        for e in &episodes {
            n += engine.estimate_tokens(&e.content).await.map_err(fail)?;
        }
        n
    };
    let passes = (a.calls / 10).max(20);
    let (mut total, mut host) = (Duration::ZERO, 0u64);
    for i in 0..passes {
        let session = format!("pass-{i}");
        engine.append(&session, &episodes).await.map_err(fail)?;
        let before = timed.nanos.load(Ordering::Relaxed);
        let t = Instant::now();
        let out = engine.summarize_now(&session, &cfg).await.map_err(fail)?;
        total += t.elapsed();
        host += timed.nanos.load(Ordering::Relaxed) - before;
        if out.passes != 1 {
            return Err(fail(format!("expected one pass, got {}", out.passes)));
        }
    }
    let total_ms = total.as_secs_f64() * 1e3 / passes as f64;
    let store_ms = host as f64 / 1e6 / passes as f64;
    let guest_ms = total_ms - store_ms;
    println!(
        "summary pass      {input_tokens} input tokens: whole call {total_ms:6.3} ms, of which store {store_ms:6.3} ms | guest work {guest_ms:6.3} ms | target <= 1 ms: {}",
        verdict(guest_ms <= 1.0)
    );

    // 4. Import rate into a SQLite file (tokens estimated by the guest).
    let db = dir.path().join("import.db");
    let store = Arc::new(SqliteStore::open(&db).map_err(fail)?);
    let engine = Abridge::builder()
        .runtime(runtime)
        .store(store)
        .build()
        .map_err(fail)?;
    let all: Vec<NewEpisode> = (0..a.episodes)
        .map(|i| NewEpisode {
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            content: sentence(i, 12 + i % 20),
            timestamp_ms: Some(1_700_000_000_000 + i as i64),
            source_key: format!("k{i}"),
            tokens: 0,
        })
        .collect();
    let t = Instant::now();
    let mut added = 0;
    for chunk in all.chunks(5_000) {
        added += engine.append("import", chunk).await.map_err(fail)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = added as f64 / secs;
    println!(
        "import            {added} episodes in {secs:.2} s = {rate:9.0} episodes/s | target >= 50,000/s: {}",
        verdict(rate >= 50_000.0)
    );
    Ok(())
}
