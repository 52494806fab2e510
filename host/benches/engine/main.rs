//! `cargo bench --bench engine`: start-up, per-call, summary-pass, import, long-transcript
//! and freshness figures, printed against the targets in one run (`-- --help` for the
//! options). Relative paths are taken from the repository root.

mod drift;
mod fresh;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use async_trait::async_trait;
use clap::Parser;

use abridge_engine::types::{
    Config, Engine, Episode, Error, FinishReason, NewEpisode, Request, Response, Role,
    SessionStats, SummaryRow, SummaryWrite,
};
use abridge_engine::{Abridge, ComponentSource, LlmBackend, Runtime, Store};
use abridge_store::SqliteStore;

/// What a benchmark step returns: a failure ends the run with its message.
type Failure = anyhow::Error;

#[derive(Parser, Debug)]
#[command(
    name = "cargo bench --bench engine --",
    about = "abridge's engine benchmarks"
)]
pub struct BenchArgs {
    /// Accepted and ignored: `cargo bench` passes it to every benchmark target
    #[arg(long, hide = true)]
    bench: bool,
    /// Episodes for the import benchmark
    #[arg(long, default_value_t = 100_000)]
    episodes: usize,
    /// Turns of the synthetic conversation for the freshness benchmark
    #[arg(long, default_value_t = 1000)]
    turns: usize,
    /// Repetitions for the per-call and summary-pass figures
    #[arg(long, default_value_t = 2_000)]
    calls: usize,
    /// Also score the extractive summarizer on this dialogue set (ROUGE F1 against the human
    /// summaries, beside the LEAD-3 and LONGEST-3 baselines); repeat for several sets. JSON
    /// lines or one JSON array of objects with `dialogue` ("Speaker: text" lines) and
    /// `summary`, `summaries` or `summary1`..`summary3`: DialogSum's and SAMSum's files,
    /// e.g. ../shared/data/dialogsum_test.jsonl
    #[arg(long, value_name = "PATH")]
    dialogsum: Vec<std::path::PathBuf>,
    /// Run only the summary-quality figures (every --dialogsum set)
    #[arg(long)]
    summaries_only: bool,
    /// Also compare with the JavaScript host (needs Node >= 24 as `node` or $ABRIDGE_NODE,
    /// and `npm run build` done in this folder)
    #[arg(long, value_name = "JS_DIR", num_args = 0..=1, default_missing_value = "js")]
    js: Option<std::path::PathBuf>,
    /// Model delay for the summarize-session comparison, in milliseconds
    #[arg(long, default_value_t = 50)]
    delay_ms: u64,
    /// The large real transcript for the peak-memory figure
    #[arg(
        long,
        default_value = "../shared/data/transcripts/claude_code/obra-episodic-memory/large-conversation.jsonl"
    )]
    transcript: std::path::PathBuf,
    /// Run only the drift figures (ledger retention, second-level coverage, fold cost)
    #[arg(long)]
    drift_only: bool,
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
            server_ms: None,
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
    async fn episodes(&self, s: &str, ids: &[u64]) -> Result<Vec<Episode>, Error> {
        timed!(self, self.inner.episodes(s, ids))
    }
    async fn bytes_through(&self, s: &str, id: u64) -> Result<Option<(u64, Option<i64>)>, Error> {
        timed!(self, self.inner.bytes_through(s, id))
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
    async fn summary_history(&self, s: &str) -> Result<Vec<SummaryRow>, Error> {
        timed!(self, self.inner.summary_history(s))
    }
    async fn compact_summaries(
        &self,
        s: &str,
        c: abridge_engine::types::Compaction,
    ) -> Result<SummaryRow, Error> {
        timed!(self, self.inner.compact_summaries(s, c))
    }
    async fn partial(&self, k: &str) -> Result<Option<abridge_engine::types::CachedAnswer>, Error> {
        timed!(self, self.inner.partial(k))
    }
    async fn failure(
        &self,
        s: &str,
    ) -> Result<Option<abridge_engine::types::FailureMarker>, Error> {
        timed!(self, self.inner.failure(s))
    }
    async fn set_failure(
        &self,
        s: &str,
        m: Option<abridge_engine::types::FailureMarker>,
    ) -> Result<(), Error> {
        timed!(self, self.inner.set_failure(s, m))
    }
    async fn reset_session(&self, s: &str) -> Result<(), Error> {
        timed!(self, self.inner.reset_session(s))
    }
    async fn put_partial(
        &self,
        k: &str,
        t: &abridge_engine::types::CachedAnswer,
    ) -> Result<(), Error> {
        timed!(self, self.inner.put_partial(k, t))
    }
    async fn calibration(
        &self,
        m: &str,
    ) -> Result<Option<abridge_engine::types::Calibration>, Error> {
        timed!(self, self.inner.calibration(m))
    }
    async fn record_calibration(&self, m: &str, e: u32, r: u32) -> Result<(), Error> {
        timed!(self, self.inner.record_calibration(m, e, r))
    }
    async fn search_episodes(
        &self,
        t: Option<&str>,
        s: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<abridge_engine::types::TermMatches, Error> {
        timed!(self, self.inner.search_episodes(t, s, terms, limit))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

pub(crate) fn fail(e: impl std::fmt::Display) -> Failure {
    anyhow!("benchmark failed: {e}")
}

/// A path named on the command line or by default, taken from the repository root (cargo
/// runs benchmarks in the package's folder).
pub(crate) fn from_root(p: &std::path::Path) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the package lives in the repository")
        .join(p)
}

fn main() -> std::process::ExitCode {
    let mut a = BenchArgs::parse();
    a.transcript = from_root(&a.transcript);
    a.dialogsum = a.dialogsum.iter().map(|p| from_root(p)).collect();
    a.js = a.js.as_deref().map(from_root);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(a)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("abridge bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `n` alternating user/assistant episodes; episode `i` has `words(i)` words.
fn synthetic(n: usize, words: impl Fn(usize) -> usize) -> Vec<NewEpisode> {
    (0..n)
        .map(|i| NewEpisode {
            role: if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            },
            content: sentence(i, words(i)),
            timestamp_ms: Some(1_700_000_000_000 + i as i64),
            source_key: i.to_string(),
            tokens: 0,
            ..Default::default()
        })
        .collect()
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

async fn run(a: BenchArgs) -> Result<(), Failure> {
    if cfg!(debug_assertions) {
        println!(
            "warning: this is a debug build; run `cargo bench --bench engine` for meaningful figures\n"
        );
    }
    println!(
        "abridge bench ({} cores)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if a.drift_only {
        let rt = Runtime::load(&ComponentSource::Embedded, None).map_err(fail)?;
        return drift::run(Arc::new(rt)).await;
    }
    if a.summaries_only {
        if a.dialogsum.is_empty() {
            return Err(anyhow!(
                "--summaries-only scores the --dialogsum sets; name at least one, e.g. --dialogsum ../shared/data/dialogsum_test.jsonl"
            ));
        }
        let rt = Arc::new(Runtime::load(&ComponentSource::Embedded, None).map_err(fail)?);
        for path in &a.dialogsum {
            dialogsum(rt.clone(), path).await?;
        }
        return Ok(());
    }

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
    let episodes = synthetic(20, |_| 80);
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
    // The transcript as a file would hold it (JSON lines), parsed in the sandbox and stored.
    let all = synthetic(a.episodes, |i| 12 + i % 20);
    let mut jsonl = Vec::new();
    for e in &all {
        serde_json::to_writer(
            &mut jsonl,
            &serde_json::json!({"role": e.role.as_str(), "content": e.content, "id": e.source_key}),
        )
        .map_err(fail)?;
        jsonl.push(b'\n');
    }
    let pure =
        abridge_app::Pure::new(engine.runtime().clone(), Arc::new(|_, _| {})).map_err(fail)?;
    let t = Instant::now();
    let parsed = abridge_app::transcript::parse_bytes(
        &pure,
        "bench.jsonl",
        &jsonl,
        Some(abridge_app::transcript::Format::Jsonl),
        abridge_app::transcript::Options::default(),
    )
    .await
    .map_err(fail)?;
    let parse_secs = t.elapsed().as_secs_f64();
    let mut added = 0;
    for chunk in parsed.conversations[0].episodes.chunks(5_000) {
        added += engine.append("import", chunk).await.map_err(fail)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = added as f64 / secs;
    println!(
        "import            {added} episodes ({:.1} MB of JSON lines) parsed in the sandbox and stored in {secs:.2} s (parse {parse_secs:.2} s) = {rate:9.0} episodes/s | target >= 50,000/s: {}",
        jsonl.len() as f64 / 1e6,
        verdict(rate >= 50_000.0)
    );

    long_transcripts(engine.runtime().clone(), &a.transcript).await?;
    fresh::run(engine.runtime().clone(), a.turns).await?;
    drift::run(engine.runtime().clone()).await?;

    for path in &a.dialogsum {
        dialogsum(engine.runtime().clone(), path).await?;
    }
    if let Some(dir) = &a.js {
        // The JS host's fixed cost per session shows at a fast model and fades at a slower one.
        js_comparison(engine.runtime().clone(), dir, a.delay_ms, true).await?;
        js_comparison(engine.runtime().clone(), dir, a.delay_ms * 4, false).await?;
    }
    Ok(())
}

/// The same measurements through wasmtime and through Node (js/scripts/bench.mjs), against
/// one test server with a fixed model delay.
async fn js_comparison(
    runtime: Arc<Runtime>,
    js_dir: &std::path::Path,
    delay_ms: u64,
    print_calls: bool,
) -> Result<(), Failure> {
    use abridge_test_llm::{Options, TestServer};
    let node = std::env::var("ABRIDGE_NODE").unwrap_or_else(|_| "node".into());
    let version = std::process::Command::new(&node).arg("--version").output();
    let major = version.as_ref().ok().and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .trim_start_matches('v')
            .split('.')
            .next()?
            .parse::<u32>()
            .ok()
    });
    if major.is_none_or(|m| m < 24) {
        println!(
            "js host           SKIPPED: Node >= 24 not found as '{node}' (set ABRIDGE_NODE; .ci/run installs one)"
        );
        return Ok(());
    }
    let server = TestServer::start_with(Options {
        delay: Duration::from_millis(delay_ms),
        ..Options::default()
    });
    let (episodes, runs) = (40usize, 3usize);

    // wasmtime: the same steps as the JS script.
    let store = Arc::new(SqliteStore::in_memory().map_err(fail)?);
    let llm = Arc::new(
        abridge_backend::Ollama::new(&server.url(), Duration::from_secs(60)).map_err(fail)?,
    );
    let engine = Abridge::builder()
        .runtime(runtime)
        .store(store)
        .llm(llm)
        .build()
        .map_err(fail)?;
    const N: u32 = 300;
    for _ in 0..20 {
        engine.instantiate_only().await.map_err(fail)?;
    }
    let t = Instant::now();
    for _ in 0..N {
        engine.instantiate_only().await.map_err(fail)?;
    }
    let inst_ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(N);
    let big = "word ".repeat(50 * 1024 / 5);
    let t = Instant::now();
    for _ in 0..N {
        engine.estimate_tokens(&big).await.map_err(fail)?;
    }
    let call_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(N);
    const WORDS: &[&str] = &[
        "database",
        "upgrade",
        "window",
        "replica",
        "backup",
        "migration",
        "latency",
        "index",
        "query",
        "rollout",
    ];
    let sentence = |i: usize, n: usize| {
        let mut s = (0..n)
            .map(|k| WORDS[(i * 7 + k * 3) % WORDS.len()])
            .collect::<Vec<_>>()
            .join(" ");
        s.push('.');
        s
    };
    let cfg = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..Config::default()
    };
    let mut times = Vec::new();
    let mut passes = 0;
    for r in 0..runs {
        // A fresh store per run: cached partial summaries and calibration must not carry over.
        let engine = Abridge::builder()
            .runtime(engine.runtime().clone())
            .store(Arc::new(abridge_store::SqliteStore::in_memory().unwrap()))
            .llm(engine.llm().clone())
            .build()
            .map_err(fail)?;
        let session = format!("bench-{r}");
        // The same text as js/scripts/bench.mjs generates (its own word list), so both hosts
        // summarize identical sessions.
        let eps: Vec<NewEpisode> = (0..episodes)
            .map(|i| NewEpisode {
                role: if i % 2 == 1 {
                    Role::Assistant
                } else {
                    Role::User
                },
                content: sentence(i, 60),
                source_key: i.to_string(),
                tokens: 0,
                ..Default::default()
            })
            .collect();
        engine.append(&session, &eps).await.map_err(fail)?;
        let t = Instant::now();
        passes = engine
            .summarize_now(&session, &cfg)
            .await
            .map_err(fail)?
            .passes;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let rust_ms = median(times);

    // Node: same server, same scenario.
    let script = js_dir.join("scripts/bench.mjs");
    let out = tokio::process::Command::new(&node)
        .arg(&script)
        .args([
            "--url",
            &server.url(),
            "--episodes",
            &episodes.to_string(),
            "--runs",
            &runs.to_string(),
        ])
        .output()
        .await
        .map_err(|e| fail(format!("running {} {}: {e}", node, script.display())))?;
    if !out.status.success() {
        return Err(fail(format!(
            "the JS benchmark failed (did you run 'npm install && npm run build' in {}?):\n{}",
            js_dir.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(out.stdout.trim_ascii())
        .map_err(|e| fail(format!("the JS benchmark printed no JSON: {e}")))?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let (js_inst, js_call, js_ms) = (f("instantiate_ms"), f("call50k_us"), f("summarize_ms"));
    if v["passes"].as_u64() != Some(u64::from(passes)) {
        return Err(fail(format!(
            "the hosts disagree on the number of passes: wasmtime {passes}, node {}",
            v["passes"]
        )));
    }
    let node_version = v["node"].as_str().unwrap_or("?");
    if print_calls {
        println!(
            "js host (node {node_version})  instantiate only: wasmtime {:.3} ms | node {js_inst:.3} ms | ratio {:.1}x",
            inst_ms,
            js_inst / inst_ms
        );
        println!(
            "                  fresh instance + 50 KiB string call: wasmtime {call_us:.1} µs | node {js_call:.1} µs | ratio {:.1}x",
            js_call / call_us
        );
    }
    let ratio = js_ms / rust_ms;
    println!(
        "                  summarize session ({episodes} episodes, {passes} passes, {delay_ms} ms model delay): wasmtime {rust_ms:.1} ms | node {js_ms:.1} ms | ratio {ratio:.3} | target <= 1.10: {}",
        verdict(ratio <= 1.10)
    );
    Ok(())
}
/// Lower-case word tokens for ROUGE.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// ROUGE-N F1 (multiset n-gram overlap).
fn rouge_n(cand: &[String], refr: &[String], n: usize) -> f64 {
    use std::collections::BTreeMap;
    let grams = |w: &[String]| {
        let mut m: BTreeMap<Vec<String>, usize> = BTreeMap::new();
        for g in w.windows(n) {
            *m.entry(g.to_vec()).or_default() += 1;
        }
        m
    };
    let (c, r) = (grams(cand), grams(refr));
    let overlap: usize = c
        .iter()
        .map(|(g, k)| (*k).min(*r.get(g).unwrap_or(&0)))
        .sum();
    f1(overlap, c.values().sum(), r.values().sum())
}

/// ROUGE-L F1 (longest common subsequence).
fn rouge_l(cand: &[String], refr: &[String]) -> f64 {
    let mut prev = vec![0usize; refr.len() + 1];
    for c in cand {
        let mut cur = vec![0usize; refr.len() + 1];
        for (j, r) in refr.iter().enumerate() {
            cur[j + 1] = if c == r {
                prev[j] + 1
            } else {
                cur[j].max(prev[j + 1])
            };
        }
        prev = cur;
    }
    f1(prev[refr.len()], cand.len(), refr.len())
}

fn f1(overlap: usize, cand: usize, refr: usize) -> f64 {
    if overlap == 0 || cand == 0 || refr == 0 {
        return 0.0;
    }
    let (p, r) = (overlap as f64 / cand as f64, overlap as f64 / refr as f64);
    2.0 * p * r / (p + r)
}

/// ROUGE-1, ROUGE-2 and ROUGE-L F1 of `cand`, each the best over the references.
fn rouge(cand: &[String], refs: &[Vec<String>]) -> [f64; 3] {
    let best = |f: &dyn Fn(&[String]) -> f64| refs.iter().map(|r| f(r)).fold(0.0, f64::max);
    [
        best(&|r| rouge_n(cand, r, 1)),
        best(&|r| rouge_n(cand, r, 2)),
        best(&|r| rouge_l(cand, r)),
    ]
}

/// The records of a dialogue set: JSON lines, or one JSON array (SAMSum's files).
fn dialogue_records(path: &std::path::Path) -> Result<Vec<serde_json::Value>, Failure> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text).map_err(|e| {
            anyhow!(
                "{}: {e} (expected a JSON array of dialogues, or JSON lines)",
                path.display()
            )
        });
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| anyhow!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Score the extractive engine on a dialogue set: ROUGE-1/2/L F1 against each dialogue's human
/// summaries (best of the references), next to the LEAD-3 baseline (the first three turns)
/// and LONGEST-3 (the three longest).
async fn dialogsum(runtime: Arc<Runtime>, path: &std::path::Path) -> Result<(), Failure> {
    let records = dialogue_records(path)?;
    let store = Arc::new(SqliteStore::in_memory().map_err(fail)?);
    let engine = Abridge::builder()
        .runtime(runtime)
        .store(store)
        .build()
        .map_err(fail)?;
    let cfg = Config {
        engine: Engine::Extractive,
        ..Config::default()
    };
    let (mut ours, mut lead, mut longest, mut n, mut out_words) =
        ([0.0f64; 3], [0.0f64; 3], [0.0f64; 3], 0usize, 0usize);
    for (i, v) in records.iter().enumerate() {
        let mut refs: Vec<Vec<String>> = v["summaries"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str()).map(words).collect())
            .unwrap_or_default();
        for key in ["summary", "summary1", "summary2", "summary3"] {
            refs.extend(v[key].as_str().map(words));
        }
        if refs.is_empty() {
            continue;
        }
        // "Speaker: text" lines ("#Person1#: …" in DialogSum, "Amanda: …" in SAMSum), each turn
        // attributed to its named speaker; whoever speaks first plays the user.
        let said_lines: Vec<(&str, &str)> = v["dialogue"]
            .as_str()
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.split_once(": "))
            .collect();
        let first = said_lines.first().map(|(who, _)| who.trim()).unwrap_or("");
        let turns: Vec<(Role, String, String)> = said_lines
            .iter()
            .map(|(who, said)| {
                (
                    if who.trim() == first {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    said.trim().to_string(),
                    who.trim().to_string(),
                )
            })
            .collect();
        if turns.is_empty() {
            continue;
        }
        let episodes: Vec<NewEpisode> = turns
            .iter()
            .enumerate()
            .map(|(k, (role, said, who))| NewEpisode {
                role: *role,
                content: said.clone(),
                source_key: k.to_string(),
                tokens: 0,
                speaker: Some(who.clone()),
                ..Default::default()
            })
            .collect();
        let session = format!("dialogsum-{i}");
        engine.append(&session, &episodes).await.map_err(fail)?;
        let out = engine.summarize_now(&session, &cfg).await.map_err(fail)?;
        let summary = out
            .written
            .last()
            .map(|r| r.content.clone())
            .unwrap_or_default();
        // Every system is scored as it would be read: lines attributed to their speakers
        // ("#Person1#: …"), the summary's list marks aside.
        let plain: Vec<&str> = summary
            .lines()
            .map(|l| l.trim_start_matches("- "))
            .collect();
        let plain = words(&plain.join(" "));
        let said = |k: usize| format!("{}: {}", turns[k].2, turns[k].1);
        let lead3 = words(
            &(0..turns.len().min(3))
                .map(said)
                .collect::<Vec<_>>()
                .join(" "),
        );
        // LONGEST-3: the three longest turns, in conversation order.
        let mut by_len: Vec<usize> = (0..turns.len()).collect();
        by_len.sort_by_key(|&k| std::cmp::Reverse(turns[k].1.split_whitespace().count()));
        let mut top: Vec<usize> = by_len.into_iter().take(3).collect();
        top.sort_unstable();
        let longest3 = words(&top.iter().map(|&k| said(k)).collect::<Vec<_>>().join(" "));
        for (acc, got) in [
            (&mut ours, rouge(&plain, &refs)),
            (&mut lead, rouge(&lead3, &refs)),
            (&mut longest, rouge(&longest3, &refs)),
        ] {
            for k in 0..3 {
                acc[k] += got[k];
            }
        }
        out_words += plain.len();
        n += 1;
    }
    if n == 0 {
        return Err(anyhow!(
            "{} holds no dialogues with summaries",
            path.display()
        ));
    }
    let pct = |x: f64| 100.0 * x / n as f64;
    println!(
        "dialogues         {} ({n} dialogues), ROUGE F1 R-1/R-2/R-L: extractive {:.1}/{:.1}/{:.1} ({} words avg) | lead-3 {:.1}/{:.1}/{:.1} | longest-3 {:.1}/{:.1}/{:.1} | beats both on all three: {}",
        path.file_name().map_or(path.display().to_string(), |f| f
            .to_string_lossy()
            .into_owned()),
        pct(ours[0]),
        pct(ours[1]),
        pct(ours[2]),
        out_words / n,
        pct(lead[0]),
        pct(lead[1]),
        pct(lead[2]),
        pct(longest[0]),
        pct(longest[1]),
        pct(longest[2]),
        verdict((0..3).all(|k| ours[k] > lead[k] && ours[k] > longest[k]))
    );
    Ok(())
}

/// A summarize_now through the test server: wall time, map calls and reduce calls per level.
async fn timed_map_reduce(
    runtime: Arc<Runtime>,
    server: &abridge_test_llm::TestServer,
    lockstep: bool,
    episodes: &[NewEpisode],
) -> Result<(f64, usize, Vec<usize>), Failure> {
    let lines: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    let engine = Abridge::builder()
        .runtime(runtime)
        .store(Arc::new(abridge_store::SqliteStore::in_memory().unwrap()))
        .llm(Arc::new(
            abridge_backend::Ollama::new(&server.url(), Duration::from_secs(60)).map_err(fail)?,
        ))
        .batch_concurrency(6)
        .lockstep_batches(lockstep)
        .log(move |_, m| sink.lock().unwrap().push(m.to_string()))
        .build()
        .map_err(fail)?;
    let cfg = Config {
        context_length: 1024,
        max_output_tokens: 200,
        ..Config::default()
    };
    engine.append("mr", episodes).await.map_err(fail)?;
    let before = server.generations().len();
    let t = Instant::now();
    engine.summarize_now("mr", &cfg).await.map_err(fail)?;
    let wall = t.elapsed().as_secs_f64();
    let gens = server.generations();
    let maps = gens[before..]
        .iter()
        .filter(|g| {
            g.body["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .starts_with("You write summaries")
        })
        .count();
    // "session mr: reduce level N: k/total done" lines give each level's call count.
    let mut levels: Vec<usize> = Vec::new();
    for l in lines.lock().unwrap().iter() {
        if let Some(rest) = l.split("reduce level ").nth(1) {
            let level: usize = rest
                .split(':')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let total: usize = rest
                .rsplit('/')
                .next()
                .and_then(|t| t.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            if levels.len() < level {
                levels.resize(level, 0);
            }
            levels[level - 1] = total;
        }
    }
    Ok((wall, maps, levels))
}

/// Long transcripts: map-reduce against the ideal critical path, the sliding window against
/// lockstep batches under a heavy tail, planning 100,000 episodes, and peak memory.
async fn long_transcripts(
    runtime: Arc<Runtime>,
    transcript: &std::path::Path,
) -> Result<(), Failure> {
    use abridge_test_llm::{Options, TestServer};
    const L: u64 = 100;
    const C: usize = 6;
    // 48 episodes of ~400 estimated tokens: one chunk each in a 1,024-token context.
    let episodes = synthetic(48, |_| 200);
    let fixed = TestServer::start_with(Options {
        delay: Duration::from_millis(L),
        ..Options::default()
    });
    let (wall, maps, levels) = timed_map_reduce(runtime.clone(), &fixed, false, &episodes).await?;
    let waves = maps.div_ceil(C) + levels.iter().map(|n| n.div_ceil(C)).sum::<usize>();
    let ideal = waves as f64 * L as f64 / 1e3;
    println!(
        "map-reduce        {maps} chunks + reduce levels {levels:?}, concurrency {C}, {L} ms per call: {:.0} ms vs ideal critical path {:.0} ms ({waves} waves) | ratio {:.3} | target <= 1.05: {}",
        wall * 1e3,
        ideal * 1e3,
        wall / ideal,
        verdict(wall / ideal <= 1.05)
    );

    // Heavy tail: every 7th request takes 8x as long (7 is coprime with the window of 6).
    let opts = || Options {
        delay: Duration::from_millis(L),
        tail: Some((7, Duration::from_millis(8 * L))),
        ..Options::default()
    };
    let sliding = TestServer::start_with(opts());
    let (s_wall, _, _) = timed_map_reduce(runtime.clone(), &sliding, false, &episodes).await?;
    let lockstep = TestServer::start_with(opts());
    let (l_wall, _, _) = timed_map_reduce(runtime.clone(), &lockstep, true, &episodes).await?;
    println!(
        "heavy tail        every 7th call {}x slower: sliding window {:.0} ms | lockstep batches {:.0} ms | lockstep / sliding {:.2}x",
        8,
        s_wall * 1e3,
        l_wall * 1e3,
        l_wall / s_wall
    );

    // Planning a 100,000-episode session (the guest reads every episode through the store).
    let engine = Abridge::builder()
        .runtime(runtime)
        .store(Arc::new(abridge_store::SqliteStore::in_memory().unwrap()))
        .build()
        .map_err(fail)?;
    let big = synthetic(100_000, |i| 12 + i % 20);
    for chunk in big.chunks(10_000) {
        engine.append("plan", chunk).await.map_err(fail)?;
    }
    let cfg = Config {
        context_length: 8192,
        ..Config::default()
    };
    let t = Instant::now();
    let plan = engine.plan("plan", &cfg).await.map_err(fail)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "plan 100k         {} episodes -> {} chunks, levels {:?}: {ms:.1} ms (whole call, store reads included) | target <= 100 ms: {}",
        plan.episodes,
        plan.chunks,
        plan.levels,
        verdict(ms <= 100.0)
    );

    // Peak memory of `abridge summarize` on the large real transcript, in a child process.
    if !transcript.exists() {
        println!(
            "peak memory       SKIPPED: {} not found",
            transcript.display()
        );
        return Ok(());
    }
    let dir = tempfile::tempdir().map_err(fail)?;
    // Each child reports its own peak (VmHWM): getrusage's figure for children can include
    // this process's memory copied at fork.
    let run = |db: &str, cache: &std::path::Path| -> Result<(f64, i32), Failure> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_abridge"))
            .args(["summarize", "-q", "--backend", "ollama", "--json"])
            .arg(transcript)
            .arg("--db")
            .arg(dir.path().join(db))
            .env("EXTRACTION_URL", fixed.url())
            .env("ABRIDGE_CACHE_DIR", cache)
            .env("ABRIDGE_REPORT_PEAK_RSS", "1")
            .output()
            .map_err(fail)?;
        let err = String::from_utf8_lossy(&out.stderr);
        let kb: f64 = err
            .lines()
            .find_map(|l| l.strip_prefix("abridge: peak RSS "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| fail(format!("the child did not report its peak memory: {err}")))?;
        Ok((kb / 1024.0, out.status.code().unwrap_or(-1)))
    };
    let warm_cache = dir.path().join("warm");
    Runtime::load(&ComponentSource::Embedded, Some(&warm_cache)).map_err(fail)?;
    let (warm, code) = run("warm.db", &warm_cache)?;
    let (cold, _) = run("cold.db", &dir.path().join("cold"))?;
    println!(
        "peak memory       summarize {} ({} bytes, exit {code}): {warm:.1} MB max RSS (cold first run, compiling the component: {cold:.1} MB) | target <= 100 MB: {}",
        transcript.file_name().unwrap_or_default().to_string_lossy(),
        std::fs::metadata(transcript).map_or(0, |m| m.len()),
        verdict(warm <= 100.0)
    );
    Ok(())
}
