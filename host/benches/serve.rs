//! The `abridge serve` load benchmark: K clients post messages to M sessions over loopback
//! HTTP for S seconds against the test LLM server (200 ms per model call), once with no
//! summaries due (no background jobs) and once with summaries refreshing in the background.
//! Prints accepted messages per second, p50/p99 latency of `POST …/messages`, messages stored
//! ÷ messages acknowledged (must be exactly 1), 5xx count (must be 0), jobs completed, and the
//! p99 ratio of the two runs.
//!
//! ```text
//! cargo bench --bench serve -- [--clients 16] [--sessions 64] [--secs 30] [--delay-ms 200]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use abridge_app::{App, AppConfig, Limits};
use abridge_backend::Ollama;
use abridge_engine::types::Config;
use abridge_engine::{ComponentSource, Runtime, SystemClock};
use abridge_server::{ServeOptions, bind};
use abridge_test_llm::{Options, TestServer};

struct Args {
    clients: usize,
    sessions: usize,
    secs: u64,
    delay_ms: u64,
}

fn args() -> Args {
    let mut a = Args {
        clients: 16,
        sessions: 64,
        secs: 30,
        delay_ms: 200,
    };
    let v: Vec<String> = std::env::args().collect();
    let num = |i: usize| -> u64 {
        v.get(i + 1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{} needs a number", v[i]))
    };
    for (i, arg) in v.iter().enumerate() {
        match arg.as_str() {
            "--clients" => a.clients = num(i) as usize,
            "--sessions" => a.sessions = num(i) as usize,
            "--secs" => a.secs = num(i),
            "--delay-ms" => a.delay_ms = num(i),
            _ => {}
        }
    }
    a
}

struct Figures {
    acked: u64,
    stored: u64,
    errors_5xx: u64,
    other_errors: u64,
    latencies_ms: Vec<f64>,
    jobs_succeeded: u64,
    jobs_failed: u64,
    secs: f64,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn run(a: &Args, llm_url: &str, runtime: Arc<Runtime>, background: bool) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        // Without background work the trigger never fires; with it, every session is
        // summarized again after each 5 new messages over 200 tokens.
        threshold_tokens: if background { 200 } else { u32::MAX },
        ..Config::default()
    };
    let cfg = AppConfig {
        db: dir.path().join("bench.db"),
        config,
        llm: Arc::new(Ollama::new(llm_url, Duration::from_secs(60)).unwrap()),
        backend_name: "ollama".into(),
        batch_concurrency: 4,
        job_lease: Duration::from_secs(30),
        clock: Arc::new(SystemClock),
        runtime,
        log: Arc::new(|_, _| {}),
        limits: Limits::default(),
        events_kept: 1000,
        memory: Default::default(),
        embedder: None,
        master_key: None,
        seal_vectors: false,
    };
    let app = App::open(cfg).unwrap();
    let opts = ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 2,
        shutdown_grace: Duration::from_secs(1),
        ..ServeOptions::default()
    };
    let bound = bind(app.clone(), opts).await.unwrap();
    let addr = bound.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run(async move {
        let _ = stop_rx.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(a.secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let (sessions, base) = (a.sessions, format!("http://{addr}"));
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let (mut lat, mut acked, mut e5, mut eo) = (Vec::new(), 0u64, 0u64, 0u64);
            let mut n = 0usize;
            while Instant::now() < deadline {
                let session = (c + n * 7) % sessions;
                n += 1;
                let body = serde_json::json!({"role": if n % 2 == 1 { "user" } else { "assistant" },
                    "content": format!("client {c} message {n}: the billing service moves to the new cluster on Friday after the schema migration and the cache warm-up.")});
                let t = Instant::now();
                let r = client
                    .post(format!("{base}/v1/sessions/s{session}/messages"))
                    .body(body.to_string())
                    .send()
                    .await;
                match r {
                    Ok(resp) if resp.status().as_u16() == 202 => {
                        let v: serde_json::Value = resp.json().await.unwrap_or_default();
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                        acked += v["stored"].as_u64().unwrap_or(0);
                    }
                    Ok(resp) if resp.status().is_server_error() => e5 += 1,
                    _ => eo += 1,
                }
            }
            (lat, acked, e5, eo)
        }));
    }
    let mut f = Figures {
        acked: 0,
        stored: 0,
        errors_5xx: 0,
        other_errors: 0,
        latencies_ms: Vec::new(),
        jobs_succeeded: 0,
        jobs_failed: 0,
        secs: 0.0,
    };
    for t in tasks {
        let (lat, acked, e5, eo) = t.await.unwrap();
        f.latencies_ms.extend(lat);
        f.acked += acked;
        f.errors_5xx += e5;
        f.other_errors += eo;
    }
    f.secs = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
    let local = app.local();
    for s in local.session_ids().await.unwrap() {
        f.stored += local.session(&s).await.unwrap().episodes;
    }
    for (state, n) in app.job_counts().await.unwrap() {
        match state.as_str() {
            "succeeded" => f.jobs_succeeded += n,
            "failed" => f.jobs_failed += n,
            _ => {}
        }
    }
    if let Some(j) = local
        .list_jobs(None, 1000)
        .await
        .unwrap()
        .iter()
        .find(|j| j.state == "failed")
    {
        println!("  a failed job: {}", j.error.as_deref().unwrap_or("?"));
    }
    f.latencies_ms.sort_by(|x, y| x.total_cmp(y));
    f
}

fn show(label: &str, f: &Figures) {
    println!(
        "{label:<22} {:>8.0} msg/s acknowledged | p50 {:6.2} ms | p99 {:6.2} ms | stored/acknowledged {}/{} = {:.4} | 5xx {} | other errors {} | jobs {} succeeded, {} failed",
        f.acked as f64 / f.secs,
        pct(&f.latencies_ms, 0.5),
        pct(&f.latencies_ms, 0.99),
        f.stored,
        f.acked,
        if f.acked == 0 {
            0.0
        } else {
            f.stored as f64 / f.acked as f64
        },
        f.errors_5xx,
        f.other_errors,
        f.jobs_succeeded,
        f.jobs_failed,
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = args();
    // reqwest is built without a default TLS provider (abridge picks ring); plain http here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if cfg!(debug_assertions) {
        println!("warning: a debug build; run `cargo bench --bench serve` for meaningful figures");
    }
    let llm = TestServer::start_with(Options {
        delay: Duration::from_millis(a.delay_ms),
        ..Options::default()
    });
    let runtime = Arc::new(
        Runtime::load(
            &ComponentSource::Embedded,
            abridge_engine::runtime::default_cache_dir().as_deref(),
        )
        .unwrap(),
    );
    println!(
        "abridge serve load: {} clients, {} sessions, {} s per run, model {} ms per call, {} cores",
        a.clients,
        a.sessions,
        a.secs,
        a.delay_ms,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let quiet = run(&a, &llm.url(), runtime.clone(), false).await;
    show("no background jobs", &quiet);
    let busy = run(&a, &llm.url(), runtime, true).await;
    show("background refreshes", &busy);
    let (p99q, p99b) = (
        pct(&quiet.latencies_ms, 0.99),
        pct(&busy.latencies_ms, 0.99),
    );
    let ok = |b: bool| if b { "met" } else { "MISSED" };
    println!(
        "targets: >= 1000 msg/s: {} | p99 <= 50 ms: {} | p99 with jobs / without = {:.2} (<= 2): {} | stored = acknowledged: {} | no 5xx: {}",
        ok(quiet.acked as f64 / quiet.secs >= 1000.0 && busy.acked as f64 / busy.secs >= 1000.0),
        ok(p99q <= 50.0 && p99b <= 50.0),
        p99b / p99q.max(1e-9),
        ok(p99b <= 2.0 * p99q),
        ok(quiet.stored == quiet.acked && busy.stored == busy.acked),
        ok(quiet.errors_5xx + busy.errors_5xx == 0),
    );
}
