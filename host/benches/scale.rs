//! Costs that stay flat as the data grows (issue #26): each path is measured on a SQLite file
//! at a size and at ten times that size, in one run, and printed with its growth exponent —
//! log10(cost at 10× ÷ cost at 1×): 0 is flat, 1 is linear.
//!
//! ```text
//! cargo bench --bench scale -- [--sessions 1000] [--jobs 10000] [--calls 2000]
//! ```
//!
//! Paths measured so far:
//! - append to a caught-up session beside N other sessions (the change number an append
//!   takes was a `MAX` over every session);
//! - a tenant's queue check (its queued count and its session's queued job), job enqueue and
//!   job claim beside N finished jobs and N/10 queued jobs of other tenants;
//! - the freshness verdict of a session with N unsummarized episodes beyond its summary
//!   (idle mode's backlog; every append and every `context` asks it);
//! - the event bus's start (every CLI command and server opens one) beside N tenants' retained
//!   events;
//! - the finished-job retention (`jobs_prune`) bringing the table back to its bound;
//! - `context` and `summaries?coverage=true` of a session with N episodes (coverage beside
//!   the full read it replaced), whole-tenant recall over N memories (beside the exact scan);
//! - a write to a memory cluster of 200 and 2,000 members with its summary brought up to date
//!   (the refresh reads the members written since the summary, not the cluster);
//! - `abridge summarize`'s peak memory on a transcript of N and 10N MB (measured first);
//! - the first page of the session list, a search (`?q=`) with one match and one whose
//!   matches grow with the data, beside N sessions (a search reads a trigram index).

use std::sync::Arc;
use std::time::Instant;

use abridge_app::memories::Summaries;
use abridge_engine::types::{Config, Engine, Mode, NewEpisode, Role};
use abridge_engine::types::{MemoryFilter, MemoryIn, NewMemory, Scope};
use abridge_engine::{Abridge, ComponentSource, LlmBackend, Runtime};
use abridge_store::RecallStore;
use abridge_store::jobs::{Claim, JobState};
use abridge_store::tenant::Tenant;
use abridge_store::{EventRow, EventStore, JobStore, SourceStore, SqliteStore, Store, TenantCap};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Accepted and ignored: `cargo bench` passes it to every benchmark target
    #[arg(long, hide = true)]
    bench: bool,
    /// Sessions beside the measured one at 1× (10× is ten times this)
    #[arg(long, default_value_t = 1_000)]
    sessions: usize,
    /// Finished jobs at 1× (10× is ten times this)
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Calls timed per path and size
    #[arg(long, default_value_t = 2_000)]
    calls: usize,
    /// Unsummarized episodes beyond a session's summary at 1× (10× is ten times this); also
    /// the session size for context and coverage
    #[arg(long, default_value_t = 1_000)]
    backlog: usize,
    /// Memories of one tenant at 1× for recall (10× is ten times this)
    #[arg(long, default_value_t = 10_000)]
    memories: usize,
    /// Memories of one tenant at 1× for recall over HTTP against `abridge serve` (10× is ten
    /// times this; 0 skips it)
    #[arg(long, default_value_t = 5_000)]
    http_memories: usize,
    /// Transcript size in MB at 1× for `summarize`'s peak memory (10× is ten times this;
    /// 0 skips it)
    #[arg(long, default_value_t = 25)]
    summarize_mb: u64,
    /// Messages at 1× of a chat of short messages for `summarize`'s peak memory offline (the
    /// rolling path: thousands of folds and compactions; 10× is ten times this; 0 skips it)
    #[arg(long, default_value_t = 40_000)]
    summarize_messages: u64,
    /// Measure `summarize`'s peak memory only (both transcripts)
    #[arg(long)]
    only_summarize: bool,
    /// Messages of one tenant at 1× for full-text search and a context with a query (10× and
    /// 100× are ten and a hundred times this; 0 skips it)
    #[arg(long, default_value_t = 1_000)]
    messages: usize,
    /// Measure full-text search and a context with a query only
    #[arg(long)]
    only_full_text: bool,
    /// Measure what a request costs through `abridge serve` only: POST throughput and p99 at
    /// 1 and 16 clients, context p50/p99 with and without a query, and the guest instances
    /// and store calls per request (from `/metrics`)
    #[arg(long)]
    only_requests: bool,
    /// With `--only-requests`: an earlier build's `abridge` binary to measure beside this one,
    /// in the same run (alternating, two rounds each), with the ratios
    #[arg(long)]
    baseline: Option<std::path::PathBuf>,
    /// Internal: serve the test model in this process (the bench runs it as a child, so the
    /// answers it keeps do not count in the figures)
    #[arg(long, hide = true)]
    serve_llm: bool,
}

/// This process's resident memory (KB), from /proc.
fn own_rss_kb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// A JSON-lines transcript of about `mb` megabytes: alternating turns of ~60 words.
fn transcript(path: &std::path::Path, mb: u64) {
    lines(path, |size, _| size < mb << 20, |_| 60);
}

/// A JSON-lines chat of `messages` short messages (5 to 34 words), as a messaging app holds.
fn chat(path: &std::path::Path, messages: u64) {
    lines(path, |_, i| i < messages, |i| 5 + (i * 7) % 30);
}

/// Alternating turns while `more(bytes so far, turns so far)`, turn `i` of `words(i)` words.
fn lines(path: &std::path::Path, more: impl Fn(u64, u64) -> bool, length: impl Fn(u64) -> u64) {
    use std::io::Write;
    let words = [
        "the",
        "deploy",
        "of",
        "service",
        "moves",
        "to",
        "friday",
        "after",
        "review",
        "we",
        "agreed",
        "database",
        "migration",
        "needs",
        "a",
        "rollback",
        "plan",
        "and",
        "tests",
        "pass",
        "on",
        "staging",
    ];
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let (mut size, mut i, mut x) = (0u64, 0u64, 7u64);
    while more(size, i) {
        let mut text = format!("turn {i}:");
        for _ in 0..length(i) {
            // A small LCG: the same file every run.
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            text.push(' ');
            text.push_str(words[(x >> 33) as usize % words.len()]);
        }
        let role = if i.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        let line = serde_json::json!({"role": role, "content": text}).to_string() + "\n";
        f.write_all(line.as_bytes()).unwrap();
        size += line.len() as u64;
        i += 1;
    }
    f.flush().unwrap();
}

/// Peak resident memory (KB) of `abridge summarize FILE` against the test model server at
/// `url`, from the kernel's accounting of the finished child (`wait4`), and its wall time.
fn summarize_peak(dir: &std::path::Path, file: &std::path::Path, url: &str) -> (f64, f64) {
    peak_of("summarize", dir, file, Some(url))
}

/// Peak RSS (KB) and seconds of `abridge backfill` of the folder that holds `file`.
fn backfill_peak(dir: &std::path::Path, file: &std::path::Path, url: &str) -> (f64, f64) {
    peak_of("backfill", dir, file.parent().unwrap(), Some(url))
}

/// Peak RSS (KB) and seconds of `abridge COMMAND PATH` against the model at `url`, or offline
/// (the extractive backend) without one.
fn peak_of(
    command: &str,
    dir: &std::path::Path,
    path: &std::path::Path,
    url: Option<&str>,
) -> (f64, f64) {
    let db = dir.join(format!(
        "{command}-{}.db",
        path.file_stem().unwrap().to_string_lossy()
    ));
    let started = Instant::now();
    // Reaped by `wait4` below, which also reports its peak memory.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args(["--db", db.to_str().unwrap(), "-q", "--backend"])
        .arg(if url.is_some() {
            "ollama"
        } else {
            "extractive"
        })
        .arg(command)
        .arg(path)
        .env("EXTRACTION_URL", url.unwrap_or("http://127.0.0.1:9"))
        .env("HOME", dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for the child this process spawned.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "abridge {command} {} failed ({status})",
        path.display()
    );
    (usage.ru_maxrss as f64, started.elapsed().as_secs_f64())
}

/// Recall over HTTP, as a client of `abridge serve` sees it: `n` and `10 n` memories of one
/// tenant imported with `abridge memory import` (ten to a subject, so each subject's cluster
/// has its summary), then `POST /v1/recall` (whole tenant, k = 10) on a fresh server (which
/// builds the recall graph and saves it) and on a restarted one (which loads it). Prints the
/// steady p50 at each size, its ratio, the time from the server's start until it is ready
/// (`/readyz`: the saved graphs loaded), the first recall after that, and the time until
/// recall is at its steady cost.
async fn http_recall(dir: &std::path::Path, n: usize) {
    let bin = env!("CARGO_BIN_EXE_abridge");
    let services = [
        "billing",
        "search",
        "auth",
        "payments",
        "ingest",
        "reports",
        "mailer",
        "gateway",
        "cache",
        "scheduler",
    ];
    let days = ["monday", "tuesday", "wednesday", "thursday", "friday"];
    let queries = [
        "which host runs service 42 on friday",
        "billing deploys on monday",
        "where does the gateway run",
        "review 7 of the cache service",
        "auth service host-3",
    ];
    // Plain HTTP on loopback; reqwest still wants a TLS provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let mut steady = [0.0; 2];
    let mut timeline = Vec::new();
    for (k, n) in [n, n * 10].into_iter().enumerate() {
        let file = dir.join(format!("http-memories-{n}.jsonl"));
        let mut text = String::new();
        for i in 0..n {
            let g = i / 10;
            let line = serde_json::json!({
                "id": format!("m{i}"), "user": format!("u{}", g % 10), "project": "p",
                "environment": "e", "type": "fact", "key": format!("k{g}"),
                "text": format!(
                    "fact {i}: the {} service {} runs on host-{} and deploys on {} after review {}",
                    services[g % 10], g % 97, g % 13, days[i % 5], i % 31
                ),
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
        std::fs::write(&file, text).unwrap();
        let db = dir.join(format!("http-{n}.db"));
        let status = std::process::Command::new(bin)
            .args(["--db", db.to_str().unwrap(), "-q", "memory", "import"])
            .arg(&file)
            .env("ABRIDGE_BACKEND", "extractive")
            .env("HOME", dir)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "memory import of {n}");
        for (run, secs) in [("first start", 40.0), ("restart", 15.0)] {
            let started = Instant::now();
            let (mut server, url) = serve(dir, &db, &client, &[]).await;
            let ready = started.elapsed().as_secs_f64();
            let mut calls: Vec<(f64, f64)> = Vec::new();
            let mut i = 0;
            while started.elapsed().as_secs_f64() < secs {
                let t = Instant::now();
                let r = client
                    .post(format!("{url}/v1/recall"))
                    .json(&serde_json::json!({"query": queries[i % queries.len()], "k": 10}))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "recall: {}", r.status());
                r.bytes().await.unwrap();
                calls.push((
                    started.elapsed().as_secs_f64(),
                    t.elapsed().as_secs_f64() * 1e3,
                ));
                i += 1;
            }
            let _ = server.kill();
            let _ = server.wait();
            let tail: Vec<f64> = calls.iter().rev().take(300).map(|c| c.1).collect();
            let p = p50(tail);
            // Steady from the first call after which five in a row cost at most 1.5× it.
            let from = calls
                .windows(5)
                .find(|w| w.iter().all(|c| c.1 <= 1.5 * p))
                .map_or(f64::NAN, |w| w[0].0);
            if run == "restart" {
                steady[k] = p;
            }
            timeline.push((n, run, ready, calls[0].1, p, from));
        }
    }
    row(
        "recall over HTTP, whole tenant, k=10 (memories)",
        "ms",
        steady[0],
        steady[1],
        n,
        Some(0.3),
    );
    println!(
        "{:<44} {:>9.2} (target <= 2: {})",
        "  ratio, 10x / 1x",
        steady[1] / steady[0],
        if steady[1] <= 2.0 * steady[0] {
            "ok"
        } else {
            "MISSED"
        }
    );
    for (n, run, ready, first, p, from) in timeline {
        println!(
            "  {n:>6} memories, {run:<11}: ready {ready:>4.1} s after the start, first recall {first:>7.1} ms ({:.1}x steady), steady p50 {p:>6.2} ms from {from:>5.1} s",
            first / p
        );
    }
}

/// No model: the app runs with the extractive summarizer.
struct NoModel;

#[async_trait::async_trait]
impl LlmBackend for NoModel {
    async fn generate(
        &self,
        _: abridge_engine::types::Request,
    ) -> Result<abridge_engine::types::Response, abridge_engine::types::Error> {
        Err(abridge_engine::types::Error::Unreachable(
            "the scale bench runs without a model".into(),
        ))
    }

    fn name(&self) -> &str {
        "none"
    }
}

/// The app over `store`, summarizing without a model.
fn app_on(store: Arc<SqliteStore>, runtime: Arc<Runtime>) -> abridge_app::App {
    abridge_app::App::open_with(
        abridge_app::AppConfig {
            db: "scale".into(),
            config: Config {
                engine: Engine::Extractive,
                ..Config::default()
            },
            llm: Arc::new(NoModel),
            backend_name: "extractive".into(),
            batch_concurrency: 2,
            job_lease: std::time::Duration::from_secs(30),
            clock: Arc::new(abridge_engine::ManualClock::at(1_767_225_600_000)),
            runtime,
            log: Arc::new(|_, _| {}),
            limits: abridge_app::Limits::unlimited(),
            events_kept: 100,
            memory: Default::default(),
            embedder: None,
            master_key: None,
            seal_vectors: false,
        },
        store,
    )
    .unwrap()
}

fn ep(key: &str) -> NewEpisode {
    NewEpisode {
        role: Role::User,
        content: "a message of a caught-up session".into(),
        source_key: key.into(),
        tokens: 8,
        ..Default::default()
    }
}

/// Median of `xs` in microseconds.
fn p50(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// 99th percentile of `xs`.
fn p99(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[(xs.len() * 99 / 100).min(xs.len() - 1)]
}

fn exponent(small: f64, large: f64) -> f64 {
    (large / small).log10()
}

/// One path's figures; `target` is `None` for the cost as it was before the fix (shown for
/// comparison, measured in the same run).
fn row(path: &str, unit: &str, small: f64, large: f64, n: usize, target: Option<f64>) {
    let e = exponent(small, large);
    let verdict = match target {
        Some(t) => format!("target <= {t}: {}", if e <= t { "ok" } else { "MISSED" }),
        None => "as it was before the fix".into(),
    };
    println!(
        "{path:<44} {small:>9.1} {unit} at {n:>7} | {large:>9.1} {unit} at {:>7} | exponent {e:>5.2} ({verdict})",
        n * 10,
    );
}

/// A store with `n` sessions of one episode each, beside the session the bench appends to.
async fn with_sessions(dir: &std::path::Path, n: usize) -> Arc<SqliteStore> {
    let s = Arc::new(SqliteStore::open(&dir.join(format!("sessions-{n}.db"))).unwrap());
    for i in 0..n {
        s.append_episodes(&format!("other-{i}"), vec![ep("k")])
            .await
            .unwrap();
    }
    // One named session: a search by its title matches it alone at any size.
    s.set_session_label(
        "other-7",
        Some(r#"{"title":"Quarterly deploy review","project":"web"}"#),
    )
    .await
    .unwrap();
    // A tenant of its own with 20 sessions, beside the n of the local tenant.
    let mine = abridge_store::AppStore::for_tenant(&*s, &Tenant::new("mine").unwrap());
    for i in 0..20 {
        mine.append_episodes(&format!("s{i}"), vec![ep("k")])
            .await
            .unwrap();
    }
    s
}

/// p50 of appending one episode to a caught-up session.
async fn append_cost(s: &SqliteStore, calls: usize) -> f64 {
    let mut t = Vec::with_capacity(calls);
    for i in 0..calls {
        let e = ep(&format!("m{i}"));
        let started = Instant::now();
        s.append_episodes("measured", vec![e]).await.unwrap();
        t.push(started.elapsed().as_secs_f64() * 1e6);
    }
    p50(t)
}

/// A store with `n` finished jobs and `n / 10` queued ones spread over 100 tenants (written
/// in one transaction, as if the server had run them).
fn with_jobs(dir: &std::path::Path, n: usize) -> Arc<SqliteStore> {
    let path = dir.join(format!("jobs-{n}.db"));
    drop(SqliteStore::open(&path).unwrap());
    let mut c = rusqlite::Connection::open(&path).unwrap();
    let tx = c.transaction().unwrap();
    {
        let mut st = tx
            .prepare(
                "INSERT INTO jobs (id, session, target, key, state, config, created_ms, updated_ms, finished_ms, tenant) VALUES (?1, ?2, 1, ?3, 'succeeded', '{}', ?4, ?4, ?4, ?5)",
            )
            .unwrap();
        for i in 0..n {
            let session = format!("t{}\u{1f}s{i}", i % 100);
            st.execute(rusqlite::params![
                i as i64 + 1,
                session,
                format!("{session}@1"),
                1_000 + i as i64,
                format!("t{}", i % 100)
            ])
            .unwrap();
        }
    }
    {
        // Other tenants' queues: a tenth as many queued jobs, over the same 100 tenants.
        let mut st = tx
            .prepare(
                "INSERT INTO jobs (id, session, target, key, state, config, created_ms, updated_ms, tenant) VALUES (?1, ?2, 1, ?3, 'queued', '{}', ?4, ?4, ?5)",
            )
            .unwrap();
        for i in 0..n / 10 {
            let session = format!("t{}\u{1f}q{i}", i % 100);
            st.execute(rusqlite::params![
                (n + i) as i64 + 1,
                session,
                format!("{session}@1"),
                1_000 + i as i64,
                format!("t{}", i % 100)
            ])
            .unwrap();
        }
    }
    tx.commit().unwrap();
    drop(c);
    Arc::new(SqliteStore::open(&path).unwrap())
}

/// p50s of a tenant's queue check, an enqueue, and a claim (with the tenant cap), beside the
/// store's finished jobs.
async fn job_costs(s: &SqliteStore, calls: usize) -> (f64, f64, f64) {
    let tenant = Tenant::new("busy").unwrap();
    let (mut queue, mut enqueue, mut claim) = (Vec::new(), Vec::new(), Vec::new());
    let live = |_: &abridge_store::jobs::Job| false;
    let view = abridge_store::AppStore::for_tenant(s, &tenant);
    for i in 0..calls {
        let session = format!("s{}", i % 50);
        let started = Instant::now();
        let n = view.jobs_queued().await.unwrap();
        let mine = view.job_active_for(&session).await.unwrap();
        queue.push(started.elapsed().as_secs_f64() * 1e6);
        assert!(n <= 50 && mine.is_none_or(|j| j.tenant == tenant && j.session == session));
        let started = Instant::now();
        let (job, _) = view
            .job_enqueue(&session, 10 + i as u64, "{}", 2_000_000 + i as u64)
            .await
            .unwrap();
        enqueue.push(started.elapsed().as_secs_f64() * 1e6);
        let cap = TenantCap {
            tenant: &tenant,
            max: 2,
        };
        let now = 2_000_000 + i as u64;
        let started = Instant::now();
        let got = s
            .job_claim(job.id, "bench:1", now, now + 60_000, &live, Some(cap))
            .await
            .unwrap();
        claim.push(started.elapsed().as_secs_f64() * 1e6);
        if let Claim::Taken(j) = got {
            s.job_finish(j.id, JobState::Succeeded, None, now)
                .await
                .unwrap();
        }
    }
    (p50(queue), p50(enqueue), p50(claim))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = Args::parse();
    if a.serve_llm {
        let llm = abridge_test_llm::TestServer::start();
        println!("{}", llm.url());
        std::io::Write::flush(&mut std::io::stdout()).unwrap();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    if cfg!(debug_assertions) {
        println!("warning: a debug build; run `cargo bench --bench scale` for meaningful figures");
    }
    let dir = tempfile::tempdir().unwrap();
    if a.only_requests {
        requests(dir.path(), a.baseline.as_deref()).await;
        let runtime = Arc::new(Runtime::load(&ComponentSource::Embedded, None).unwrap());
        idle_backlog(dir.path(), runtime, &a).await;
        return;
    }
    if a.only_full_text {
        let runtime = Arc::new(Runtime::load(&ComponentSource::Embedded, None).unwrap());
        full_text(dir.path(), runtime, a.messages.max(1), a.calls).await;
        return;
    }
    println!(
        "abridge scale bench: each path at 1x and 10x in one run; exponent = log10(cost at 10x / cost at 1x)\n"
    );

    // `summarize`'s peak memory on a transcript of N and 10N MB, against the test model server
    // (the map-reduce path): the file is read twice, a megabyte at a time, and stored as it
    // is parsed; planning reads sizes, the map stage one wave of chunks at a time. Measured
    // first: a child's peak as the kernel reports it is at least this process's size when it
    // was spawned, and this process grows as the other paths build their data.
    if a.summarize_mb > 0 {
        // The test model server in a child process: it keeps every request it answers.
        let mut server = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--serve-llm")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let url = {
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(server.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            line.trim().to_string()
        };
        // A first run compiles the component into the cache (a one-off cost, not measured).
        let warm = dir.path().join("warm.jsonl");
        transcript(&warm, 1);
        summarize_peak(dir.path(), &warm, &url);
        let mut peak = [0.0; 2];
        let mut backfill = [0.0; 2];
        for (k, mb) in [a.summarize_mb, a.summarize_mb * 10]
            .into_iter()
            .enumerate()
        {
            // Alone in a folder: `backfill` takes the folder.
            let folder = dir.path().join(format!("t{mb}"));
            std::fs::create_dir_all(&folder).unwrap();
            let file = folder.join(format!("t{mb}.jsonl"));
            transcript(&file, mb);
            let floor = own_rss_kb() / 1024.0;
            let (kb, secs) = summarize_peak(dir.path(), &file, &url);
            let (bkb, bsecs) = backfill_peak(dir.path(), &file, &url);
            std::fs::remove_file(&file).unwrap();
            println!(
                "  summarize {mb:>4} MB transcript: peak RSS {:.1} MB in {secs:.1} s; backfill of it {:.1} MB in {bsecs:.1} s (this process held {floor:.1} MB when it spawned them: a floor on the figures)",
                kb / 1024.0,
                bkb / 1024.0
            );
            peak[k] = kb / 1024.0;
            backfill[k] = bkb / 1024.0;
        }
        server.kill().unwrap();
        server.wait().unwrap();
        row(
            "summarize peak RSS (transcript MB)",
            "MB",
            peak[0],
            peak[1],
            a.summarize_mb as usize,
            Some(0.15),
        );
        row(
            "backfill peak RSS (transcript MB)",
            "MB",
            backfill[0],
            backfill[1],
            a.summarize_mb as usize,
            Some(0.15),
        );
        println!(
            "summarize peak RSS at {} MB: {:.1} MB (target <= 80 MB: {})",
            a.summarize_mb * 10,
            peak[1],
            if peak[1] <= 80.0 { "ok" } else { "MISSED" }
        );
    }

    // The same offline on a chat of many short messages (the rolling path: one fold per
    // ~60 messages, a row every two folds, the chain compacted as it grows).
    if a.summarize_messages > 0 {
        let warm = dir.path().join("warm-chat.jsonl");
        chat(&warm, 100);
        peak_of("summarize", dir.path(), &warm, None);
        let mut peak = [0.0; 2];
        for (k, n) in [a.summarize_messages, a.summarize_messages * 10]
            .into_iter()
            .enumerate()
        {
            let file = dir.path().join(format!("chat{n}.jsonl"));
            chat(&file, n);
            let mb = std::fs::metadata(&file).unwrap().len() as f64 / f64::from(1 << 20);
            let (kb, secs) = peak_of("summarize", dir.path(), &file, None);
            std::fs::remove_file(&file).unwrap();
            println!(
                "  summarize offline, {n} messages ({mb:.1} MB): peak RSS {:.1} MB in {secs:.1} s",
                kb / 1024.0
            );
            peak[k] = kb / 1024.0;
        }
        row(
            "summarize offline peak RSS (messages)",
            "MB",
            peak[0],
            peak[1],
            a.summarize_messages as usize,
            Some(0.15),
        );
        println!(
            "summarize offline peak RSS at {} messages: {:.1} MB (target <= 100 MB: {})",
            a.summarize_messages * 10,
            peak[1],
            if peak[1] <= 100.0 { "ok" } else { "MISSED" }
        );
    }
    if a.only_summarize {
        return;
    }

    if a.http_memories > 0 {
        http_recall(dir.path(), a.http_memories).await;
    }

    let small = with_sessions(dir.path(), a.sessions).await;
    let large = with_sessions(dir.path(), a.sessions * 10).await;
    let (s1, s10) = (
        append_cost(&small, a.calls).await,
        append_cost(&large, a.calls).await,
    );
    row(
        "append, caught up (sessions beside it)",
        "us",
        s1,
        s10,
        a.sessions,
        Some(0.15),
    );
    // The same without migration 24's index (as before it): the change number is a scan.
    for n in [a.sessions, a.sessions * 10] {
        rusqlite::Connection::open(dir.path().join(format!("sessions-{n}.db")))
            .unwrap()
            .execute_batch("DROP INDEX sessions_by_change")
            .unwrap();
    }
    let (b1, b10) = (
        append_cost(&small, a.calls).await,
        append_cost(&large, a.calls).await,
    );
    row(
        "  before (no index on the change number)",
        "us",
        b1,
        b10,
        a.sessions,
        None,
    );

    // The idle backlog: a summary over the first 20 episodes, then N more.
    let runtime = Arc::new(Runtime::load(&ComponentSource::Embedded, None).unwrap());
    if a.messages > 0 {
        full_text(dir.path(), runtime.clone(), a.messages, a.calls).await;
    }
    idle_backlog(dir.path(), runtime.clone(), &a).await;

    // The event bus's start beside 10 and 100 tenants' retained logs (1,000 events each).
    let mut start = [0.0; 2];
    let mut read_all = [0.0; 2];
    for (k, tenants) in [10usize, 100].into_iter().enumerate() {
        let store =
            Arc::new(SqliteStore::open(&dir.path().join(format!("events-{tenants}.db"))).unwrap());
        for t in 0..tenants {
            let name = format!("t{t}");
            let rows: Vec<EventRow> = (0..1_000)
                .map(|i| EventRow {
                    tenant: name.clone(),
                    id: 0,
                    kind: "job.progress".into(),
                    at_ms: i,
                    session_key: None,
                    job: Some(i),
                    data: r#"{"stage":"map","level":0,"done":1,"total":9,"answers":1}"#.into(),
                })
                .collect();
            store.append_events(&name, 0, &rows, 1_000).await.unwrap();
        }
        let mut t = Vec::new();
        for _ in 0..50 {
            let started = Instant::now();
            let bus = abridge_app::events::EventBus::new(1_000, store.clone(), Arc::new(|_, _| {}));
            bus.flush().await;
            t.push(started.elapsed().as_secs_f64() * 1e6);
        }
        start[k] = p50(t);
        // Before: the start read every tenant's retained events.
        let mut t = Vec::new();
        for _ in 0..10 {
            let started = Instant::now();
            let all = store.recent_events(1_000).await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert_eq!(all.len(), tenants * 1_000);
        }
        read_all[k] = p50(t);
    }
    row(
        "event bus start (tenants' logs beside it)",
        "us",
        start[0],
        start[1],
        10,
        Some(0.15),
    );
    row(
        "  before (every retained event read)",
        "us",
        read_all[0],
        read_all[1],
        10,
        None,
    );

    // Measured as they are (issue #26 open on them): a session's context and coverage, the
    // session list, recall.
    let mut ctx = [0.0; 2];
    let mut cov = [0.0; 2];
    let mut cov_before = [0.0; 2];
    for (k, n) in [a.backlog, a.backlog * 10].into_iter().enumerate() {
        let store = Arc::new(SqliteStore::open(&dir.path().join(format!("app-{n}.db"))).unwrap());
        let app = app_on(store, runtime.clone());
        let me = app.local();
        let eps: Vec<NewEpisode> = (0..n)
            .map(|i| NewEpisode {
                role: if i.is_multiple_of(2) {
                    Role::User
                } else {
                    Role::Assistant
                },
                content: format!("turn {i}: the deploy of service {} moves to friday", i % 7),
                timestamp_ms: Some(1_000 + i as i64),
                source_key: format!("t{i}"),
                tokens: 0,
                ..Default::default()
            })
            .collect();
        for chunk in eps.chunks(5_000) {
            me.append("s", chunk.to_vec(), Vec::new()).await.unwrap();
        }
        let cfg = me.session_config("s").await.unwrap();
        me.run_or_join("s", u64::MAX, &cfg).await.unwrap();
        let mut t = Vec::new();
        for _ in 0..a.calls.min(100) {
            let started = Instant::now();
            me.context(
                "s",
                abridge_app::ContextAsk {
                    refresh_after: u32::MAX,
                    ..abridge_app::ContextAsk::new(2_000)
                },
            )
            .await
            .unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
        }
        ctx[k] = p50(t);
        let mut t = Vec::new();
        for _ in 0..a.calls.min(20) {
            let started = Instant::now();
            let rows = me.summaries("s").await.unwrap();
            me.with_coverage("s", rows).await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
        }
        cov[k] = p50(t);
        // Before: coverage read every episode of the session to sum its bytes.
        let mut t = Vec::new();
        for _ in 0..a.calls.min(20) {
            let started = Instant::now();
            let (mut after, mut bytes) = (0u64, 0u64);
            loop {
                let page = me.messages("s", after, 1000).await.unwrap();
                let Some(last) = page.messages.last() else {
                    break;
                };
                after = last.id;
                bytes += page
                    .messages
                    .iter()
                    .map(|e| e.content.len() as u64)
                    .sum::<u64>();
            }
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(bytes > 0);
        }
        cov_before[k] = p50(t);
    }
    row(
        "context, caught up (episodes in the session)",
        "us",
        ctx[0],
        ctx[1],
        a.backlog,
        Some(0.15),
    );
    row(
        "summaries with coverage (episodes)",
        "us",
        cov[0],
        cov[1],
        a.backlog,
        Some(0.15),
    );
    row(
        "  before (every episode read to sum its bytes)",
        "us",
        cov_before[0],
        cov_before[1],
        a.backlog,
        None,
    );

    // A write to a hot memory cluster, through the app as a server's inline path runs it: the
    // memory stored, then the cluster's summary brought up to its members (extractive), at
    // 200 and 2,000 members.
    let (mut hot, mut hot_p99) = ([0.0; 2], [0.0; 2]);
    for (k, n) in [200usize, 2_000].into_iter().enumerate() {
        let store =
            Arc::new(SqliteStore::open(&dir.path().join(format!("cluster-{n}.db"))).unwrap());
        let app = app_on(store, runtime.clone());
        let me = app.local();
        let fact = |i: usize| MemoryIn {
            id: format!("f{i}"),
            scope: Scope {
                user: "alice".into(),
                project: "web".into(),
                environment: "prod".into(),
                kind: "preference".into(),
                key: "editor".into(),
            },
            text: format!("Alice keeps the dark editor theme, with font setting {i}"),
            importance: None,
            replaces: None,
        };
        let mut cluster = None;
        for start in (0..n).step_by(100) {
            for r in me
                .remember(
                    (start..(start + 100).min(n)).map(fact).collect(),
                    Summaries::Leave,
                )
                .await
                .unwrap()
                .memories
            {
                assert_eq!(*cluster.get_or_insert(r.cluster), r.cluster, "one cluster");
            }
        }
        let cluster = cluster.unwrap();
        me.summarize_cluster(cluster).await.unwrap();
        let mut t = Vec::new();
        for i in n..n + a.calls.min(300) {
            let started = Instant::now();
            let r = me
                .remember(vec![fact(i)], Summaries::Leave)
                .await
                .unwrap()
                .memories;
            assert!(r[0].cluster == cluster && r[0].due);
            for o in me.summarize_due(&[cluster]).await {
                let o = o.unwrap().unwrap();
                assert_eq!(o.summary.unwrap().covered as usize, i + 1);
            }
            t.push(started.elapsed().as_secs_f64() * 1e6);
        }
        hot[k] = p50(t.clone());
        hot_p99[k] = p99(t);
    }
    row(
        "cluster write + summary refresh (members)",
        "us",
        hot[0],
        hot[1],
        200,
        Some(0.15),
    );
    println!(
        "{:<44} {:>9.1} us at {:>7} | {:>9.1} us at {:>7} | exponent {:>5.2} (the issue measured 7 -> 39 ms before, over HTTP)",
        "  its p99",
        hot_p99[0],
        200,
        hot_p99[1],
        2_000,
        exponent(hot_p99[0], hot_p99[1])
    );
    let mut list = [0.0; 2];
    let mut search = [0.0; 2];
    let mut titled = [0.0; 2];
    let mut first_search = [0.0; 2];
    let mut small = [0.0; 2];
    let mut small_before = [0.0; 2];
    let mut unknown = [0.0; 2];
    for (k, n) in [a.sessions, a.sessions * 10].into_iter().enumerate() {
        let fresh = dir.path().join("list");
        std::fs::create_dir_all(&fresh).unwrap();
        let store = with_sessions(&fresh, n).await;
        let app = app_on(store.clone(), runtime.clone());
        let me = app.local();
        let mine = app.tenant(&Tenant::new("mine").unwrap());
        // The first search indexes the sessions it has not seen (all of them here, once).
        let started = Instant::now();
        me.sessions(0, 20, Some("quarterly")).await.unwrap();
        first_search[k] = started.elapsed().as_secs_f64() * 1e6;
        let (mut t, mut q, mut w) = (Vec::new(), Vec::new(), Vec::new());
        let (mut x, mut y, mut z) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.calls.min(50) {
            // A small tenant's whole list beside the others' sessions, and what reading it
            // cost before (every tenant's session ids, then its own picked out).
            let started = Instant::now();
            let (page, total) = mine.sessions(0, 20, None).await.unwrap();
            x.push(started.elapsed().as_secs_f64() * 1e6);
            assert_eq!((page.len(), total), (20, 20));
            let started = Instant::now();
            let all = abridge_store::SessionRows::sessions(&*store).await.unwrap();
            let own = all.iter().filter(|k| k.starts_with("mine\u{1f}")).count();
            y.push(started.elapsed().as_secs_f64() * 1e6);
            assert_eq!(own, 20);
            // A session id nobody has (any client can ask): a 404 from a key range.
            let started = Instant::now();
            assert!(me.resolve("no-such-session").await.is_err());
            z.push(started.elapsed().as_secs_f64() * 1e6);
            let started = Instant::now();
            let (page, total) = me.sessions(0, 20, None).await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(page.len() == 20 && total >= n);
            let started = Instant::now();
            me.sessions(0, 20, Some("other-12")).await.unwrap();
            q.push(started.elapsed().as_secs_f64() * 1e6);
            let started = Instant::now();
            let (found, total) = me.sessions(0, 20, Some("QUARTERLY")).await.unwrap();
            w.push(started.elapsed().as_secs_f64() * 1e6);
            assert_eq!((found.len(), total), (1, 1));
        }
        titled[k] = p50(w);
        list[k] = p50(t);
        search[k] = p50(q);
        small[k] = p50(x);
        small_before[k] = p50(y);
        unknown[k] = p50(z);
    }
    row(
        "an unknown session id, 404 (sessions)",
        "us",
        unknown[0],
        unknown[1],
        a.sessions,
        Some(0.15),
    );
    row(
        "a tenant's list of 20 (others' sessions)",
        "us",
        small[0],
        small[1],
        a.sessions,
        Some(0.15),
    );
    row(
        "  before (every tenant's session ids read)",
        "us",
        small_before[0],
        small_before[1],
        a.sessions,
        None,
    );
    row(
        "session list, first page of 20 (sessions)",
        "us",
        list[0],
        list[1],
        a.sessions,
        Some(0.15),
    );
    row(
        "session search ?q=, one match (sessions)",
        "us",
        titled[0],
        titled[1],
        a.sessions,
        Some(0.15),
    );
    println!(
        "{:<44} {:>9.1} us at {:>7} | {:>9.1} us at {:>7} | exponent {:>5.2} (its matches grow with the data: 11 -> 111)",
        "session search ?q=other-12",
        search[0],
        a.sessions,
        search[1],
        a.sessions * 10,
        exponent(search[0], search[1])
    );
    println!(
        "{:<44} {:>9.1} ms at {:>7} | {:>9.1} ms at {:>7} | once: the sessions not yet in the trigram index are added",
        "  the first search",
        first_search[0] / 1000.0,
        a.sessions,
        first_search[1] / 1000.0,
        a.sessions * 10
    );
    let mut recall = [0.0; 2];
    let mut exact = [0.0; 2];
    let mut build = [0.0; 2];
    let mut first = [0.0; 2];
    for (k, n) in [a.memories, a.memories * 10].into_iter().enumerate() {
        let store = SqliteStore::open(&dir.path().join(format!("memories-{n}.db"))).unwrap();
        for i in 0..n {
            let text = format!(
                "fact {i}: the service {} runs on host {} and deploys on {}",
                i % 97,
                i % 13,
                ["monday", "tuesday", "friday"][i % 3]
            );
            let m = NewMemory {
                id: format!("m{i}"),
                scope: Scope {
                    user: format!("u{}", i % 10),
                    project: "p".into(),
                    environment: "e".into(),
                    kind: "fact".into(),
                    key: format!("k{}", i % 50),
                },
                vector: abridge_guest::embed::lexical(&text, abridge_guest::embed::LEXICAL_DIM),
                text,
                importance: 0.5,
                tokens: 12,
                created_ms: i as u64,
                model: "abridge-lexical-v1".into(),
                cluster: None,
                fact_key: String::new(),
                replaces: None,
            };
            store.put_memory("acme", m).await.unwrap();
        }
        let q = abridge_guest::embed::lexical(
            "which host runs service 42 on friday",
            abridge_guest::embed::LEXICAL_DIM,
        );
        let search = |f: MemoryFilter| {
            let (store, q) = (&store, &q);
            async move {
                let started = Instant::now();
                store
                    .search("acme", q, "abridge-lexical-v1", &f, 10)
                    .await
                    .unwrap();
                started.elapsed().as_secs_f64() * 1e6
            }
        };
        // The first search starts the index's build on a thread of its own and answers by
        // the exact scan; the build's time is until the index is ready.
        let started = Instant::now();
        first[k] = search(MemoryFilter::default()).await;
        // (A tenant under the index's minimum is always scanned: nothing to wait for.)
        while n >= abridge_store::ann::ANN_MIN && !store.ann_ready("acme", "abridge-lexical-v1") {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        build[k] = started.elapsed().as_secs_f64() * 1e6;
        // The built graph is saved on a thread of its own: measured after, not beside it.
        while n >= abridge_store::ann::ANN_MIN
            && store
                .ann_saved("acme", "abridge-lexical-v1")
                .unwrap()
                .is_none()
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut t = Vec::new();
        let mut x = Vec::new();
        for _ in 0..a.calls.min(50) {
            t.push(search(MemoryFilter::default()).await);
            x.push(
                search(MemoryFilter {
                    exact: true,
                    ..MemoryFilter::default()
                })
                .await,
            );
        }
        recall[k] = p50(t);
        exact[k] = p50(x);
    }
    row(
        "recall, whole tenant (memories; HNSW index)",
        "us",
        recall[0],
        recall[1],
        a.memories,
        Some(0.35),
    );
    row(
        "  before (the exact scan, `exact: true`)",
        "us",
        exact[0],
        exact[1],
        a.memories,
        None,
    );
    println!(
        "{:<44} {:>9.1} ms at {:>7} | {:>9.1} ms at {:>7} | answered by the exact scan while the index builds",
        "  the first recall",
        first[0] / 1000.0,
        a.memories,
        first[1] / 1000.0,
        a.memories * 10
    );
    println!(
        "{:<44} {:>9.1} ms at {:>7} | {:>9.1} ms at {:>7} | once per process and tenant, on a thread of its own",
        "  the index's build (until it answers)",
        build[0] / 1000.0,
        a.memories,
        build[1] / 1000.0,
        a.memories * 10
    );

    let small = with_jobs(dir.path(), a.jobs);
    let large = with_jobs(dir.path(), a.jobs * 10);
    let (q1, e1, c1) = job_costs(&small, a.calls).await;
    let (q10, e10, c10) = job_costs(&large, a.calls).await;
    row(
        "tenant queue check (others' jobs beside it)",
        "us",
        q1,
        q10,
        a.jobs,
        Some(0.15),
    );
    // Before: the queue check read every tenant's active jobs and counted in the app.
    let mut before = [0.0; 2];
    for (k, s) in [&small, &large].iter().enumerate() {
        let mut t = Vec::new();
        for _ in 0..a.calls.min(200) {
            let started = Instant::now();
            let all = s.jobs_active().await.unwrap();
            let n = all
                .iter()
                .filter(|j| j.state == JobState::Queued && j.tenant.name() == "busy")
                .count();
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(n <= 50);
        }
        before[k] = p50(t);
    }
    row(
        "  before (every tenant's active jobs read)",
        "us",
        before[0],
        before[1],
        a.jobs,
        None,
    );
    row(
        "job enqueue (others' jobs beside it)",
        "us",
        e1,
        e10,
        a.jobs,
        Some(0.15),
    );
    row(
        "job claim, tenant cap (others' jobs)",
        "us",
        c1,
        c10,
        a.jobs,
        Some(0.15),
    );

    // A worker's poll: each tenant's next two queued jobs and the running ones, beside the
    // whole active set it read before.
    let mut poll = [0.0; 2];
    let mut all = [0.0; 2];
    for (k, s) in [&small, &large].iter().enumerate() {
        let (mut t, mut x) = (Vec::new(), Vec::new());
        for _ in 0..a.calls.min(200) {
            let started = Instant::now();
            let got = s.jobs_runnable(2).await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(got.len() <= 2 * 101 + 50, "{}", got.len());
            let started = Instant::now();
            let every = s.jobs_active().await.unwrap();
            x.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(every.len() >= got.len());
        }
        poll[k] = p50(t);
        all[k] = p50(x);
    }
    row(
        "worker poll (each tenant's next 2 queued)",
        "us",
        poll[0],
        poll[1],
        a.jobs,
        Some(0.15),
    );
    row(
        "  before (every active job read per poll)",
        "us",
        all[0],
        all[1],
        a.jobs,
        None,
    );

    // Retention: the 10x table back to each tenant's newest 1,000 finished jobs, and what a
    // second pass costs once it is there.
    let before = large.job_counts().await.unwrap();
    let started = Instant::now();
    let gone = large.jobs_prune(0, 1_000).await.unwrap();
    let first = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let again = large.jobs_prune(0, 1_000).await.unwrap();
    let second = started.elapsed().as_secs_f64() * 1e3;
    let after = large.job_counts().await.unwrap();
    println!(
        "retention (each tenant's newest 1,000)       {before:?} -> {after:?}: {gone} deleted in {first:.1} ms; a second pass deletes {again} in {second:.1} ms"
    );
}

/// A deterministic xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A rank in `0..n` by Zipf's law (exponent 1), as words are used.
    fn zipf(&mut self, n: usize) -> usize {
        // Inverse of the harmonic CDF, approximately: n^u - 1.
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((n as f64).powf(u) - 1.0).min(n as f64 - 1.0) as usize
    }
}

/// The `i`-th word of a synthetic vocabulary: pronounceable, distinct.
fn word(i: usize) -> String {
    const ON: &[&str] = &[
        "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr",
    ];
    const NU: &[&str] = &["a", "e", "i", "o", "u", "ai", "ou"];
    let mut w = String::new();
    let mut x = i + 1;
    while x > 0 {
        w.push_str(ON[x % ON.len()]);
        x /= ON.len();
        w.push_str(NU[x % NU.len()]);
        x /= NU.len();
    }
    w
}

/// A message of 8 to 30 words drawn by Zipf's law from a 20,000-word vocabulary.
fn sentence(r: &mut Rng) -> String {
    let n = 8 + (r.next() % 23) as usize;
    (0..n)
        .map(|_| word(r.zipf(20_000)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Full-text search of a tenant's messages and a context with a query, at 1×, 10× and 100×
/// messages (sessions of 1,000): p50 and p99 of each, the growth exponent per tenfold, the
/// index's size per message, and what a posted message costs with the index against without.
async fn full_text(dir: &std::path::Path, runtime: Arc<Runtime>, base: usize, calls: usize) {
    println!(
        "\nfull-text search and a context with a query, {base} / {} / {} messages in one tenant (sessions of 1,000):",
        base * 10,
        base * 100
    );
    let sizes = [base, base * 10, base * 100];
    let mut search = [(0.0, 0.0); 3];
    let mut context = [(0.0, 0.0); 3];
    let mut queries_rng = Rng(0x5eed_cafe);
    let queries: Vec<String> = (0..200)
        .map(|_| {
            let n = 3 + (queries_rng.next() % 4) as usize;
            let words: Vec<String> = (0..n).map(|_| word(queries_rng.zipf(20_000))).collect();
            format!("What did we say about {}?", words.join(" "))
        })
        .collect();
    let mut per_message = 0.0;
    let mut write = (0.0, 0.0, 0.0, 0.0);
    let mut http_posted = 0.0;
    for (k, n) in sizes.into_iter().enumerate() {
        let store = Arc::new(SqliteStore::open(&dir.join(format!("fts-{n}.db"))).unwrap());
        let app = app_on(store.clone(), runtime.clone());
        let me = app.local();
        let mut r = Rng(0x1234_5678 + n as u64);
        let mut written = 0usize;
        let mut session = 0usize;
        while written < n {
            let m = (n - written).min(1_000);
            let eps: Vec<NewEpisode> = (0..m)
                .map(|i| NewEpisode {
                    role: if i.is_multiple_of(2) {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    content: sentence(&mut r),
                    timestamp_ms: Some(1_767_225_600_000 + (written + i) as i64 * 60_000),
                    source_key: format!("m{i}"),
                    tokens: 0,
                    ..Default::default()
                })
                .collect();
            me.append(&format!("s{session}"), eps, Vec::new())
                .await
                .unwrap();
            written += m;
            session += 1;
        }
        // The session a context is asked of: summarized (offline), as a chat app's would be.
        let cfg = me.session_config("s0").await.unwrap();
        me.run_or_join("s0", u64::MAX, &cfg).await.unwrap();
        let (mut ts, mut tc) = (Vec::new(), Vec::new());
        for i in 0..calls.min(400) {
            let q = &queries[i % queries.len()];
            let started = Instant::now();
            let hits = me.search(q, None, 0, 10).await.unwrap();
            ts.push(started.elapsed().as_secs_f64() * 1e3);
            assert!(hits.complete);
            let started = Instant::now();
            me.context(
                "s0",
                abridge_app::ContextAsk {
                    refresh_after: u32::MAX,
                    query: Some(q),
                    ..abridge_app::ContextAsk::new(2_000)
                },
            )
            .await
            .unwrap();
            tc.push(started.elapsed().as_secs_f64() * 1e3);
        }
        search[k] = (p50(ts.clone()), p99(ts));
        context[k] = (p50(tc.clone()), p99(tc));
        println!(
            "  {n:>7} messages: search p50 {:.2} ms, p99 {:.2} ms; context with a query p50 {:.2} ms, p99 {:.2} ms",
            search[k].0, search[k].1, context[k].0, context[k].1
        );
        if k == 1 {
            // What the index holds per message: its hashed terms and FTS5's blocks.
            per_message = store.index_bytes().await.unwrap() as f64 / n as f64;
            // A posted message, through the app (the guest takes its terms, the store indexes
            // them in the same transaction), against the same without the index: the store's
            // append with and without terms on this database, and the guest's terms alone.
            let mut app_t = Vec::new();
            for i in 0..2_000 {
                let e = NewEpisode {
                    role: Role::User,
                    content: sentence(&mut r),
                    source_key: format!("w{i}"),
                    tokens: 0,
                    ..Default::default()
                };
                let started = Instant::now();
                me.append("posted", vec![e], Vec::new()).await.unwrap();
                app_t.push(started.elapsed().as_secs_f64() * 1e6);
            }
            let engine = Abridge::builder()
                .runtime(runtime.clone())
                .store(store.clone())
                .build()
                .unwrap();
            let mut with = Vec::new();
            let mut without = Vec::new();
            for i in 0..2_000 {
                let content = sentence(&mut r);
                let terms = engine
                    .index_terms(&[(None, content.clone())])
                    .await
                    .unwrap();
                for (label, t, into) in [
                    ("a", terms[0].clone(), &mut with),
                    ("b", String::new(), &mut without),
                ] {
                    let e = NewEpisode {
                        terms: t,
                        role: Role::User,
                        content: content.clone(),
                        source_key: format!("{label}{i}"),
                        tokens: 10,
                        ..Default::default()
                    };
                    let started = Instant::now();
                    store
                        .append_episodes(&format!("direct-{label}"), vec![e])
                        .await
                        .unwrap();
                    into.push(started.elapsed().as_secs_f64() * 1e6);
                }
            }
            // The guest's work on a message's terms (inside its `append` on the real path),
            // in batches of 200 so a call's own cost is not counted.
            let batch: Vec<(Option<String>, String)> =
                (0..200).map(|_| (None, sentence(&mut r))).collect();
            let mut guest = Vec::new();
            for _ in 0..20 {
                let started = Instant::now();
                engine.index_terms(&batch).await.unwrap();
                guest.push(started.elapsed().as_secs_f64() * 1e6 / batch.len() as f64);
            }
            // Means: a write's cost includes the merges and checkpoints it sets off now and then.
            let mean = |xs: Vec<f64>| xs.iter().sum::<f64>() / xs.len() as f64;
            write = (mean(app_t), mean(with), mean(without), p50(guest));
            http_posted = posted_over_http(dir, &dir.join(format!("fts-{n}.db")), &mut r).await;
        }
    }
    let decades =
        |xs: &[(f64, f64); 3], p: fn(&(f64, f64)) -> f64| exponent(p(&xs[0]), p(&xs[2])) / 2.0;
    println!(
        "  search: exponent per tenfold {:.2} (p50), {:.2} (p99); target p50 <= 20 ms at {} and exponent <= 0.15: {}",
        decades(&search, |x| x.0),
        decades(&search, |x| x.1),
        base * 100,
        if search[2].0 <= 20.0 && decades(&search, |x| x.0) <= 0.15 {
            "ok"
        } else {
            "MISSED"
        }
    );
    println!(
        "  context with a query: exponent per tenfold {:.2} (p50), {:.2} (p99); target p50 <= 20 ms at {} and exponent <= 0.15: {}",
        decades(&context, |x| x.0),
        decades(&context, |x| x.1),
        base * 100,
        if context[2].0 <= 20.0 && decades(&context, |x| x.0) <= 0.15 {
            "ok"
        } else {
            "MISSED"
        }
    );
    let (app_t, with, without, guest) = write;
    let index_cost = (with - without) + guest;
    let ratio = app_t / (app_t - index_cost).max(1.0);
    println!(
        "  index size: {per_message:.0} bytes per message (hashed terms and FTS5 blocks, at {} messages)",
        base * 10
    );
    println!(
        "  a posted message (app, mean of 2,000): {app_t:.1} us; the index's part: the store's append {with:.1} us with terms vs {without:.1} us without (means), the guest's terms {guest:.1} us; with / without the index {ratio:.2} (target <= 1.3: {})",
        if ratio <= 1.3 { "ok" } else { "MISSED" }
    );
    let ratio = http_posted / (http_posted - index_cost).max(1.0);
    println!(
        "  a posted message over HTTP (POST /v1/sessions/{{id}}/messages, one message, mean of 2,000, idle mode): {http_posted:.1} us; with / without the index {ratio:.2} (target <= 1.3: {})",
        if ratio <= 1.3 { "ok" } else { "MISSED" }
    );
}

/// The mean time of `POST /v1/sessions/{id}/messages` with one message, 2,000 times, against
/// `abridge serve` on `db` (idle mode: no refresh runs beside the writes), in microseconds.
async fn posted_over_http(dir: &std::path::Path, db: &std::path::Path, r: &mut Rng) -> f64 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let (mut server, url) = serve(dir, db, &client, &[("ABRIDGE_MODE", "idle")]).await;
    let mut t = Vec::new();
    for _ in 0..2_000 {
        let body = serde_json::json!({"messages": [{"role": "user", "content": sentence(r)}]});
        let started = Instant::now();
        let resp = client
            .post(format!("{url}/v1/sessions/http-posted/messages"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "post: {}", resp.status());
        resp.bytes().await.unwrap();
        t.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let _ = server.kill();
    let _ = server.wait();
    t.iter().sum::<f64>() / t.len() as f64
}

/// Idle mode's backlog (a summary over the first 20 episodes, then N and 10N more): what the
/// verdict and a context of it cost.
async fn idle_backlog(dir: &std::path::Path, runtime: Arc<Runtime>, a: &Args) {
    let cfg = Config {
        engine: Engine::Extractive,
        mode: Mode::Idle,
        ..Config::default()
    };
    let mut verdict = [0.0; 2];
    let mut idle_context = [0.0; 2];
    let mut read_all = [0.0; 2];
    for (k, n) in [a.backlog, a.backlog * 10].into_iter().enumerate() {
        let store = Arc::new(SqliteStore::open(&dir.join(format!("backlog-{n}.db"))).unwrap());
        let engine = Abridge::builder()
            .runtime(runtime.clone())
            .store(store.clone())
            .build()
            .unwrap();
        let turn = |i: usize| NewEpisode {
            role: if i.is_multiple_of(2) {
                Role::User
            } else {
                Role::Assistant
            },
            content: format!(
                "turn {i}: the deploy of service {} moves to friday after the review",
                i % 7
            ),
            timestamp_ms: Some(1_000 + i as i64),
            source_key: format!("t{i}"),
            ..Default::default()
        };
        let first: Vec<NewEpisode> = (0..20).map(turn).collect();
        engine.append("s", &first).await.unwrap();
        engine.summarize_now("s", &cfg).await.unwrap();
        let rest: Vec<NewEpisode> = (20..20 + n).map(turn).collect();
        for chunk in rest.chunks(5_000) {
            engine.append("s", chunk).await.unwrap();
        }
        let mut t = Vec::new();
        for _ in 0..a.calls.min(500) {
            let started = Instant::now();
            let f = engine.freshness("s", &cfg).await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(f.episodes > f.covered);
        }
        verdict[k] = p50(t);
        // A context of it (what a read costs while idle mode waits to fold the backlog).
        let mut t = Vec::new();
        for _ in 0..a.calls.min(200) {
            let req = abridge_engine::types::ContextRequest {
                budget: 2_000,
                refresh_after: u32::MAX,
                ..Default::default()
            };
            let started = Instant::now();
            let w = engine.context("s", req, &cfg).await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(w.tokens > 0);
        }
        idle_context[k] = p50(t);
        // Before: the verdict paged through every unsummarized episode to sum its tokens.
        let mut t = Vec::new();
        for _ in 0..a.calls.min(50) {
            let started = Instant::now();
            let (mut after, mut sum) = (20u64, 0u64);
            loop {
                let page = store.episodes_after("s", after, 256).await.unwrap();
                let Some(last) = page.last() else { break };
                after = last.id;
                sum += page.iter().map(|e| u64::from(e.tokens)).sum::<u64>();
            }
            t.push(started.elapsed().as_secs_f64() * 1e6);
            assert!(sum > 0);
        }
        read_all[k] = p50(t);
    }
    row(
        "freshness, idle backlog beyond the summary",
        "us",
        verdict[0],
        verdict[1],
        a.backlog,
        Some(0.15),
    );
    row(
        "  before (the backlog read to sum it)",
        "us",
        read_all[0],
        read_all[1],
        a.backlog,
        None,
    );
    row(
        "context at 2,000 tokens, idle backlog beyond the summary",
        "us",
        idle_context[0],
        idle_context[1],
        a.backlog,
        Some(0.15),
    );
}

/// The guest instances and store calls `abridge serve` has made, from its `/metrics`.
async fn work_done(client: &reqwest::Client, url: &str) -> (f64, f64) {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            // An earlier build (a baseline) may not count it.
            .unwrap_or(f64::NAN)
    };
    (
        value("abridge_guest_instances_total"),
        value("abridge_store_calls_total"),
    )
}

/// The `p`th percentile of `t` (sorted here).
fn percentile(t: &mut [f64], p: f64) -> f64 {
    t.sort_by(f64::total_cmp);
    let at = ((t.len() as f64 - 1.0) * p / 100.0).round() as usize;
    t[at.min(t.len() - 1)]
}

/// What one request costs through `abridge serve` (idle mode, so no job runs beside the
/// requests): POST of one message by 1 and by 16 clients at once (throughput and p99), and a
/// context of a 1,000-message session with and without a query (p50 and p99), each with the
/// guest instances and store calls it made, counted by the server.
async fn requests(dir: &std::path::Path, baseline: Option<&std::path::Path>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let this = std::path::Path::new(env!("CARGO_BIN_EXE_abridge"));
    println!("What a request costs through abridge serve (idle mode, extractive):");
    // Two rounds, alternating this build and the baseline, each on a database of its own;
    // each figure is its best round (the most posts per second, the lowest latencies).
    let mut best: [Option<Costs>; 2] = [None, None];
    for round in 0..2 {
        for (k, bin) in [Some(this), baseline].into_iter().enumerate() {
            let Some(bin) = bin else { continue };
            let db = dir.join(format!("requests-{k}-{round}.db"));
            let c = request_costs(dir, bin, &db).await;
            best[k] = Some(match best[k].take() {
                None => c,
                Some(b) => b.best(c),
            });
        }
    }
    let now = best[0].take().expect("this build ran");
    now.print("this build");
    if let Some(base) = best[1].take() {
        base.print(&format!("baseline {}", baseline.unwrap().display()));
        let ratio = |label: &str, n: f64, b: f64| {
            println!("  {label}: {b:.1} -> {n:.1} (x{:.2})", n / b);
        };
        println!("  this build against the baseline, in the same run:");
        for (k, clients) in [1, 16].into_iter().enumerate() {
            ratio(
                &format!("POST posts/s, {clients:>2} client(s)"),
                now.posts[k].rate,
                base.posts[k].rate,
            );
            ratio(
                &format!("POST p99 us, {clients:>2} client(s)"),
                now.posts[k].p99,
                base.posts[k].p99,
            );
        }
        for (k, what) in ["no query", "with a query"].into_iter().enumerate() {
            ratio(
                &format!("context p50 us, {what}"),
                now.contexts[k].p50,
                base.contexts[k].p50,
            );
            ratio(
                &format!("context p99 us, {what}"),
                now.contexts[k].p99,
                base.contexts[k].p99,
            );
        }
    }
}

/// One workload's figures: requests per second, p50 and p99 (µs), and per request the guest
/// instances and store calls `/metrics` counted (NaN where a build does not count them).
#[derive(Clone, Copy, Debug)]
struct Cost {
    rate: f64,
    p50: f64,
    p99: f64,
    instances: f64,
    calls: f64,
}

/// What [`request_costs`] measures: POSTs at 1 and 16 clients, contexts without and with a
/// query.
#[derive(Clone, Copy, Debug)]
struct Costs {
    posts: [Cost; 2],
    contexts: [Cost; 2],
}

impl Cost {
    fn best(self, o: Cost) -> Cost {
        Cost {
            rate: self.rate.max(o.rate),
            p50: self.p50.min(o.p50),
            p99: self.p99.min(o.p99),
            ..self
        }
    }
}

impl Costs {
    fn best(self, o: Costs) -> Costs {
        Costs {
            posts: [
                self.posts[0].best(o.posts[0]),
                self.posts[1].best(o.posts[1]),
            ],
            contexts: [
                self.contexts[0].best(o.contexts[0]),
                self.contexts[1].best(o.contexts[1]),
            ],
        }
    }

    fn print(&self, who: &str) {
        println!("  {who}:");
        for (k, clients) in [1, 16].into_iter().enumerate() {
            let c = self.posts[k];
            println!(
                "    POST one message, {clients:>2} client(s): {:.0} posts/s, p50 {:.0} us, p99 {:.0} us; per post {:.2} guest instances, {:.2} store calls",
                c.rate, c.p50, c.p99, c.instances, c.calls
            );
        }
        for (k, what) in ["no query", "with a query"].into_iter().enumerate() {
            let c = self.contexts[k];
            println!(
                "    context of 1,000 messages at 2,000 tokens, {what}: p50 {:.0} us, p99 {:.0} us; per context {:.2} guest instances, {:.2} store calls",
                c.p50, c.p99, c.instances, c.calls
            );
        }
    }
}

/// The request workload against `abridge serve` from `bin` on a new database `db`.
async fn request_costs(
    dir: &std::path::Path,
    bin: &std::path::Path,
    db: &std::path::Path,
) -> Costs {
    let client = reqwest::Client::new();
    let (mut server, url) = serve_bin(bin, dir, db, &client, &[("ABRIDGE_MODE", "idle")]).await;
    let mut posts = Vec::new();
    let mut contexts = Vec::new();
    let mut r = Rng(0x5eed_2026);
    let post = |client: reqwest::Client, url: String, session: String, text: String| async move {
        let body = serde_json::json!({"messages": [{"role": "user", "content": text}]});
        let started = Instant::now();
        let resp = client
            .post(format!("{url}/v1/sessions/{session}/messages"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "post: {}", resp.status());
        resp.bytes().await.unwrap();
        started.elapsed().as_secs_f64() * 1e6
    };
    // Warm: the component compiled, the connection open.
    for _ in 0..50 {
        post(client.clone(), url.clone(), "warm".into(), sentence(&mut r)).await;
    }
    for clients in [1usize, 16] {
        let per = 1_600 / clients;
        let texts: Vec<Vec<String>> = (0..clients)
            .map(|_| (0..per).map(|_| sentence(&mut r)).collect())
            .collect();
        let before = work_done(&client, &url).await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (c, texts) in texts.into_iter().enumerate() {
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let mut t = Vec::with_capacity(texts.len());
                for text in texts {
                    t.push(post(client.clone(), url.clone(), format!("post-{c}"), text).await);
                }
                t
            }));
        }
        let mut t: Vec<f64> = Vec::new();
        for task in tasks {
            t.extend(task.await.unwrap());
        }
        let secs = started.elapsed().as_secs_f64();
        let after = work_done(&client, &url).await;
        let n = t.len() as f64;
        posts.push(Cost {
            rate: n / secs,
            p50: percentile(&mut t, 50.0),
            p99: percentile(&mut t, 99.0),
            instances: (after.0 - before.0) / n,
            calls: (after.1 - before.1) / n,
        });
    }
    // A 1,000-message session for the contexts.
    for chunk in 0..10 {
        let messages: Vec<serde_json::Value> = (0..100)
            .map(|i| {
                let role = if (chunk * 100 + i) % 2 == 0 {
                    "user"
                } else {
                    "assistant"
                };
                serde_json::json!({"role": role, "content": sentence(&mut r)})
            })
            .collect();
        let resp = client
            .post(format!("{url}/v1/sessions/ctx/messages"))
            .json(&serde_json::json!({ "messages": messages }))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "post: {}", resp.status());
    }
    // A query of four words the session's messages use (drawn as they were).
    let q: String = sentence(&mut r)
        .split(' ')
        .take(4)
        .collect::<Vec<_>>()
        .join(" ");
    for query in [None, Some(q.as_str())] {
        let path = match query {
            None => "/v1/sessions/ctx/context?budget=2000".to_string(),
            Some(q) => format!(
                "/v1/sessions/ctx/context?budget=2000&query={}",
                q.replace(' ', "%20")
            ),
        };
        for _ in 0..20 {
            client.get(format!("{url}{path}")).send().await.unwrap();
        }
        let before = work_done(&client, &url).await;
        let mut t = Vec::new();
        for _ in 0..400 {
            let started = Instant::now();
            let resp = client.get(format!("{url}{path}")).send().await.unwrap();
            assert!(resp.status().is_success(), "context: {}", resp.status());
            resp.bytes().await.unwrap();
            t.push(started.elapsed().as_secs_f64() * 1e6);
        }
        let after = work_done(&client, &url).await;
        let n = t.len() as f64;
        contexts.push(Cost {
            rate: n / t.iter().sum::<f64>() * 1e6,
            p50: percentile(&mut t, 50.0),
            p99: percentile(&mut t, 99.0),
            instances: (after.0 - before.0) / n,
            calls: (after.1 - before.1) / n,
        });
    }
    let _ = server.kill();
    let _ = server.wait();
    Costs {
        posts: [posts[0], posts[1]],
        contexts: [contexts[0], contexts[1]],
    }
}

/// `abridge serve` on `db` (extractive, `HOME` in `dir`, `env` besides) on a free loopback
/// port, once `/readyz` answers (the recall indexes the last run saved are loaded: what a load
/// balancer waits for); the child and its URL, which the caller kills and waits for.
#[allow(clippy::zombie_processes)] // the child is returned, or killed and waited for
async fn serve(
    dir: &std::path::Path,
    db: &std::path::Path,
    client: &reqwest::Client,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    serve_bin(
        std::path::Path::new(env!("CARGO_BIN_EXE_abridge")),
        dir,
        db,
        client,
        env,
    )
    .await
}

/// [`serve`] with the binary `bin` (the requests bench runs an earlier build beside this one).
#[allow(clippy::zombie_processes)] // the child is returned, or killed and waited for
async fn serve_bin(
    bin: &std::path::Path,
    dir: &std::path::Path,
    db: &std::path::Path,
    client: &reqwest::Client,
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let mut server = std::process::Command::new(bin)
        .args(["--db", db.to_str().unwrap(), "serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .env("ABRIDGE_BACKEND", "extractive")
        .env("HOME", dir)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    loop {
        let r = client.get(format!("{url}/readyz")).send().await;
        if r.is_ok_and(|r| r.status().is_success()) {
            return (server, url);
        }
        if started.elapsed().as_secs() >= 60 {
            let _ = server.kill();
            let _ = server.wait();
            panic!("abridge serve never got ready");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
