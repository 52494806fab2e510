//! Several `abridge serve` processes (the real binary) on one PostgreSQL database, against the
//! test LLM server with a fixed delay: for 1, 2 and 3 instances, and for one instance on
//! SQLite, K clients post N sessions of 4 messages round-robin to the instances (each session
//! queues one summary job). Prints messages accepted per second, jobs completed per second,
//! the wait from queued to claimed p50/p99 (from the job rows), duplicate job runs (attempts
//! beyond the first, and summary rows beyond one per session: must be 0), and the latency of
//! the claim call itself with three workers racing for the same jobs.
//!
//! ```text
//! cargo bench --bench shared -- [--sessions 400] [--clients 8] [--delay-ms 20]
//! ```
//!
//! PostgreSQL is started by the harness (initdb in a temporary directory, a free loopback
//! port); without it the PostgreSQL runs are SKIPPED.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use abridge_test_llm::{Options, TestServer};

struct Args {
    sessions: usize,
    clients: usize,
    delay_ms: u64,
}

fn args() -> Args {
    let mut a = Args {
        sessions: 400,
        clients: 8,
        delay_ms: 20,
    };
    let v: Vec<String> = std::env::args().collect();
    for (i, arg) in v.iter().enumerate() {
        let num = || -> u64 {
            v.get(i + 1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--sessions" => a.sessions = num() as usize,
            "--clients" => a.clients = num() as usize,
            "--delay-ms" => a.delay_ms = num(),
            _ => {}
        }
    }
    a
}

/// One `abridge serve`, killed on drop.
struct Serve {
    child: Child,
    addr: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(db: &str, llm: &str, home: &std::path::Path) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_abridge"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "4",
            "--tenant-jobs",
            "64",
            "--tenant-model-requests",
            "64",
            "--model-requests",
            "64",
            "--context-length",
            "1024",
            "--max-output-tokens",
            "60",
            "--threshold-tokens",
            "40",
            "--min-new-episodes",
            "4",
            "--sweep-secs",
            "0",
        ])
        .env_clear()
        .env("HOME", home)
        .env("ABRIDGE_DB", db)
        .env("ABRIDGE_BACKEND", "ollama")
        .env("EXTRACTION_URL", llm)
        .env("ABRIDGE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn abridge serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("no address line: {line:?}"))
        .to_string();
    Serve { child, addr }
}

fn post(addr: &str, path: &str, body: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    raw.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn four(session: &str) -> String {
    let ms: Vec<serde_json::Value> = (1..=4)
        .map(|i| {
            serde_json::json!({
                "id": format!("{session}-{i}"),
                "role": if i % 2 == 1 { "user" } else { "assistant" },
                "content": format!("{session} message {i}: the billing service moves to cluster {i} on Friday."),
            })
        })
        .collect();
    serde_json::json!({ "messages": ms }).to_string()
}

struct Run {
    label: String,
    msgs_per_s: f64,
    jobs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    duplicates: i64,
    stored: i64,
}

/// Jobs' rows as (state, attempts, created, started) and the summary row count, read
/// through the database's own tool (psql for PostgreSQL, the store for SQLite).
trait Look {
    fn active(&self) -> i64;
    fn jobs(&self) -> Vec<(String, i64, i64, i64)>;
    fn summaries(&self) -> i64;
    fn episodes(&self) -> i64;
}

struct PgLook<'a> {
    srv: &'a abridge_test_pg::Server,
    db: String,
}

impl Look for PgLook<'_> {
    fn active(&self) -> i64 {
        self.srv
            .psql(
                &self.db,
                "SELECT count(*) FROM jobs WHERE state IN ('queued','running')",
            )
            .unwrap()
            .parse()
            .unwrap()
    }
    fn jobs(&self) -> Vec<(String, i64, i64, i64)> {
        self.srv
            .psql(
                &self.db,
                "SELECT state || ',' || attempts || ',' || created_ms || ',' || COALESCE(started_ms, 0) FROM jobs",
            )
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (
                    f[0].to_string(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                )
            })
            .collect()
    }
    fn summaries(&self) -> i64 {
        self.srv
            .psql(&self.db, "SELECT count(*) FROM summaries")
            .unwrap()
            .parse()
            .unwrap()
    }
    fn episodes(&self) -> i64 {
        self.srv
            .psql(&self.db, "SELECT count(*) FROM episodes")
            .unwrap()
            .parse()
            .unwrap()
    }
}

struct SqliteLook(std::path::PathBuf);

impl SqliteLook {
    fn q<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> T) -> T {
        let c = rusqlite::Connection::open(&self.0).unwrap();
        c.busy_timeout(Duration::from_secs(30)).unwrap();
        f(&c)
    }
}

impl Look for SqliteLook {
    fn active(&self) -> i64 {
        self.q(|c| {
            c.query_row(
                "SELECT count(*) FROM jobs WHERE state IN ('queued','running')",
                [],
                |r| r.get(0),
            )
            .unwrap()
        })
    }
    fn jobs(&self) -> Vec<(String, i64, i64, i64)> {
        self.q(|c| {
            let mut st = c
                .prepare("SELECT state, attempts, created_ms, COALESCE(started_ms, 0) FROM jobs")
                .unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        })
    }
    fn summaries(&self) -> i64 {
        self.q(|c| {
            c.query_row("SELECT count(*) FROM summaries", [], |r| r.get(0))
                .unwrap()
        })
    }
    fn episodes(&self) -> i64 {
        self.q(|c| {
            c.query_row("SELECT count(*) FROM episodes", [], |r| r.get(0))
                .unwrap()
        })
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn run(label: &str, db: &str, look: &dyn Look, instances: usize, a: &Args, llm: &str) -> Run {
    let home = tempfile::tempdir().unwrap();
    let servers: Vec<Serve> = (0..instances)
        .map(|_| serve(db, llm, home.path()))
        .collect();
    let addrs: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.addr.clone()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let n = a.sessions;
    let t0 = Instant::now();
    let clients: Vec<_> = (0..a.clients)
        .map(|_| {
            let (addrs, next) = (addrs.clone(), next.clone());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let session = format!("b{i}");
                    let addr = &addrs[i % addrs.len()];
                    let code = post(
                        addr,
                        &format!("/v1/sessions/{session}/messages"),
                        &four(&session),
                    );
                    assert_eq!(code, 202, "POST to {addr}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let posted = t0.elapsed().as_secs_f64();
    while look.active() > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = t0.elapsed().as_secs_f64();
    let jobs = look.jobs();
    let mut waits: Vec<f64> = jobs
        .iter()
        .filter(|j| j.3 > 0)
        .map(|j| (j.3 - j.2) as f64)
        .collect();
    waits.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let succeeded = jobs.iter().filter(|j| j.0 == "succeeded").count();
    assert_eq!(succeeded, n, "{label}: every job succeeds");
    let extra_attempts: i64 = jobs.iter().map(|j| (j.1 - 1).max(0)).sum();
    let duplicates = extra_attempts + (look.summaries() - n as i64).max(0);
    drop(servers);
    Run {
        label: label.into(),
        msgs_per_s: (4 * n) as f64 / posted,
        jobs_per_s: n as f64 / done,
        p50_ms: pct(&waits, 0.5),
        p99_ms: pct(&waits, 0.99),
        duplicates,
        stored: look.episodes(),
    }
}

fn main() {
    let a = args();
    let llm = TestServer::start_with(Options {
        delay: Duration::from_millis(a.delay_ms),
        ..Options::default()
    });
    println!(
        "shared store: {} sessions × 4 messages, {} clients, model delay {} ms, 4 workers per instance",
        a.sessions, a.clients, a.delay_ms
    );
    let mut runs = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    runs.push(run(
        "SQLite, 1 instance",
        &path.display().to_string(),
        &SqliteLook(path.clone()),
        1,
        &a,
        &llm.url(),
    ));
    match abridge_test_pg::shared() {
        None => println!(
            "SKIPPED: the PostgreSQL runs (install: {})",
            abridge_test_pg::INSTALL
        ),
        Some(srv) => {
            for k in 1..=3 {
                let url = srv.database(&format!("bench{k}"));
                let look = PgLook {
                    srv,
                    db: url.rsplit('/').next().unwrap().to_string(),
                };
                runs.push(run(
                    &format!("PostgreSQL, {k} instance{}", if k > 1 { "s" } else { "" }),
                    &url,
                    &look,
                    k,
                    &a,
                    &llm.url(),
                ));
            }
        }
    }
    println!(
        "{:<24} {:>12} {:>10} {:>14} {:>14} {:>11} {:>9}",
        "store", "msgs/s", "jobs/s", "wait p50 ms", "wait p99 ms", "duplicates", "stored"
    );
    for r in &runs {
        println!(
            "{:<24} {:>12.0} {:>10.1} {:>14.0} {:>14.0} {:>11} {:>9}",
            r.label, r.msgs_per_s, r.jobs_per_s, r.p50_ms, r.p99_ms, r.duplicates, r.stored
        );
        assert_eq!(r.duplicates, 0, "{}: duplicate job runs", r.label);
        assert_eq!(
            r.stored,
            4 * a.sessions as i64,
            "{}: every message stored once",
            r.label
        );
    }
    if let Some(srv) = abridge_test_pg::shared() {
        claims(srv);
    }
    if runs.len() == 4 {
        println!(
            "ratios: PostgreSQL 2 vs 1 instance jobs/s {:.2}×, 3 vs 1 {:.2}×; PostgreSQL vs SQLite (1 instance) jobs/s {:.2}×, msgs/s {:.2}×",
            runs[2].jobs_per_s / runs[1].jobs_per_s,
            runs[3].jobs_per_s / runs[1].jobs_per_s,
            runs[1].jobs_per_s / runs[0].jobs_per_s,
            runs[1].msgs_per_s / runs[0].msgs_per_s,
        );
    }
}

/// The claim itself: three workers (three connection pools, as three instances) take 300
/// queued jobs at once through `FOR UPDATE SKIP LOCKED`; each claim call is timed.
fn claims(srv: &abridge_test_pg::Server) {
    use abridge_app::jobs::{Claim, Jobs};
    let url = srv.database("claims");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stores: Vec<Arc<abridge_store::PgStore>> = futures::future::join_all(
            (0..3).map(|_| async { Arc::new(abridge_store::PgStore::connect(&url).await.unwrap()) }),
        )
        .await;
        let cfg = abridge_engine::types::Config::default();
        let lease = Duration::from_secs(60);
        let first = Jobs::new(stores[0].clone(), lease);
        let local = abridge_store::AppStore::for_tenant(
            &*stores[0],
            &abridge_store::tenant::Tenant::local(),
        );
        let mut ids = Vec::new();
        for i in 0..300 {
            ids.push(first.enqueue(&*local, &format!("c{i}"), 1, &cfg).await.unwrap().0.id);
        }
        let ids = Arc::new(ids);
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(w, s)| {
                let jobs = Jobs::new(s.clone(), lease).with_owner(&format!("bench:{w}"));
                let ids = ids.clone();
                tokio::spawn(async move {
                    let (mut taken, mut times) = (Vec::new(), Vec::new());
                    for id in ids.iter() {
                        let t = Instant::now();
                        let c = jobs.claim(*id).await.unwrap();
                        times.push(t.elapsed().as_secs_f64() * 1000.0);
                        if let Claim::Taken(j) = c {
                            taken.push(j.id);
                        }
                    }
                    (taken, times)
                })
            })
            .collect();
        let (mut taken, mut times) = (Vec::new(), Vec::new());
        for t in tasks {
            let (a, b) = t.await.unwrap();
            taken.extend(a);
            times.extend(b);
        }
        times.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let unique: std::collections::BTreeSet<u64> = taken.iter().copied().collect();
        println!(
            "claim calls (3 workers racing for 300 jobs on PostgreSQL): p50 {:.2} ms, p99 {:.2} ms; jobs taken {}, taken twice {}",
            pct(&times, 0.5),
            pct(&times, 0.99),
            unique.len(),
            taken.len() - unique.len()
        );
        assert_eq!(unique.len(), 300);
        assert_eq!(taken.len(), unique.len(), "a job claimed twice");
    });
}
