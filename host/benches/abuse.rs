//! `abridge serve` under abuse, the real binary on loopback, each figure beside the quiet case
//! measured in the same run:
//!
//! 1. **Memory**: the server's peak RSS (`VmHWM`) under three concurrent worst-case bodies —
//!    16 MiB of tiny JSON messages, 16 MiB of long messages, a 16 MiB transcript of tiny lines,
//!    a 15 MiB transcript of 99,000 lines (just under the upload's message limit) —
//!    against its peak after ordinary requests. Target: ≤ 300 MB.
//! 2. **Connections**: `/healthz` p99 while 1,000 connections are held open (half idle, half
//!    sending a header one byte at a time), against its p99 with none.
//! 3. **Fairness**: how long tenant B's one job waits in the queue while tenant A floods it,
//!    against its wait on a quiet server (the model takes `--delay-ms` per call).
//!
//! ```text
//! cargo bench --bench abuse -- [--connections 1000] [--delay-ms 100]
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use abridge_test_llm::{Options, TestServer};
use serde_json::{Value, json};

struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(env: &[(&str, &str)], args: &[&str]) -> (Server, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("abuse.db");
    let bin = env!("CARGO_BIN_EXE_abridge");
    let mut tokens = Vec::new();
    for tenant in ["flood", "quiet"] {
        let out = Command::new(bin)
            .args(["tokens", "create", "--tenant", tenant])
            .env("ABRIDGE_DB", &db)
            .output()
            .unwrap();
        tokens.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("ABRIDGE_DB", &db)
        .env("ABRIDGE_BACKEND", "extractive")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .trim_start_matches("listening on http://")
        .to_string();
    (
        Server {
            child,
            addr,
            _dir: dir,
        },
        tokens,
    )
}

/// One request; (status, body).
fn req(addr: &str, method: &str, path: &str, token: &str, ct: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body)
}

fn peak_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)]
}

fn healthz_p99(addr: &str, n: usize) -> f64 {
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let (status, _) = req(addr, "GET", "/healthz", "", "application/json", b"");
        assert_eq!(status, 200, "/healthz failed");
        t.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    p99(t)
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

fn chat(n: usize, len: usize) -> Value {
    let filler = "x".repeat(len);
    let ms: Vec<Value> = (0..n)
        .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("{i} {filler}")}))
        .collect();
    json!({ "messages": ms })
}

fn memory() {
    const MIB16: usize = 16 << 20;
    let tiny = {
        let one = r#"{"role":"user","content":"a"},"#;
        let mut s = String::from("[");
        while s.len() + one.len() < MIB16 - 8 {
            s.push_str(one);
        }
        s.pop();
        s.push(']');
        s.into_bytes()
    };
    let long = chat(10_000, 1_500).to_string().into_bytes();
    let lines = {
        let mut s = String::new();
        let mut i = 0;
        while s.len() < MIB16 - 200 {
            s.push_str(&format!(
                "{{\"role\":\"user\",\"content\":\"line {i} of the upload\"}}\n"
            ));
            i += 1;
        }
        s.into_bytes()
    };
    // The most an upload may hold (100,000 messages), filling the body limit.
    let most = {
        let pad = "y".repeat(120);
        let mut s = String::new();
        for i in 0..99_000 {
            s.push_str(&format!(
                "{{\"role\":\"user\",\"content\":\"line {i} {pad}\"}}\n"
            ));
        }
        s.into_bytes()
    };
    println!("## 1. Peak server RSS (VmHWM), three concurrent bodies of each kind");
    let (quiet_srv, tok) = start(&[], &[]);
    let (a, t) = (quiet_srv.addr.clone(), tok[0].clone());
    req(
        &a,
        "POST",
        "/v1/sessions/q/messages",
        &t,
        "application/json",
        chat(20, 100).to_string().as_bytes(),
    );
    let quiet = peak_mb(quiet_srv.child.id());
    println!("quiet (ordinary requests)                 {quiet:8.1} MB");
    drop(quiet_srv);
    for (name, path, ct, body) in [
        (
            "16 MiB of tiny JSON messages",
            "/v1/sessions/s{}/messages",
            "application/json",
            &tiny,
        ),
        (
            "16 MiB of 10,000 long messages",
            "/v1/sessions/s{}/messages",
            "application/json",
            &long,
        ),
        (
            "16 MiB transcript of tiny lines",
            "/v1/transcripts?format=jsonl&session=t{}",
            "application/x-ndjson",
            &lines,
        ),
        (
            "15 MiB transcript of 99,000 lines",
            "/v1/transcripts?format=jsonl&session=u{}",
            "application/x-ndjson",
            &most,
        ),
    ] {
        let (srv, tok) = start(&[], &[]);
        let statuses: Vec<u16> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|i| {
                    let (a, t, p) = (
                        srv.addr.clone(),
                        tok[0].clone(),
                        path.replace("{}", &i.to_string()),
                    );
                    s.spawn(move || req(&a, "POST", &p, &t, ct, body).0)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let peak = peak_mb(srv.child.id());
        println!(
            "{name:<42}{peak:8.1} MB  ×{:.2} of quiet  (answers {statuses:?}; target ≤ 300 MB)",
            peak / quiet
        );
    }
}

fn connections(n: usize) {
    println!("\n## 2. /healthz p99 while {n} connections are held (half idle, half slow headers)");
    raise_fd_limit();
    let (srv, _) = start(&[], &[]);
    let quiet = healthz_p99(&srv.addr, 300);
    let mut held = Vec::new();
    for i in 0..n {
        match TcpStream::connect(&srv.addr) {
            Ok(mut s) => {
                if i % 2 == 1 {
                    let _ = s.write_all(b"GET /v1/sessions HTTP/1.1\r\nX-Slow: ");
                }
                held.push(s);
            }
            Err(e) => {
                println!("(stopped opening at {i}: {e})");
                break;
            }
        }
    }
    // Keep the slow ones trickling while /healthz is measured.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        let mut slow: Vec<TcpStream> = held
            .iter()
            .skip(1)
            .step_by(2)
            .map(|s| s.try_clone().unwrap())
            .collect();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for s in &mut slow {
                    let _ = s.write_all(b"a");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let loaded = healthz_p99(&srv.addr, 300);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = trickle.join();
    println!(
        "quiet p99 {quiet:.2} ms; with {} held: p99 {loaded:.2} ms  ×{:.2}",
        held.len(),
        loaded / quiet.max(0.001)
    );
}

fn fairness(delay_ms: u64) {
    println!(
        "\n## 3. Tenant B's queue wait while tenant A floods (model {delay_ms} ms a call, 2 workers)"
    );
    let llm = TestServer::start_with(Options {
        delay: Duration::from_millis(delay_ms),
        ..Options::default()
    });
    let url = llm.url();
    let wait_of_b = |flood: bool| -> (f64, usize) {
        let (srv, tok) = start(
            &[("ABRIDGE_BACKEND", "ollama"), ("EXTRACTION_URL", &url)],
            &["--workers", "2"],
        );
        let (a, flood_tok, quiet_tok) = (&srv.addr, &tok[0], &tok[1]);
        let mut refused = 0;
        if flood {
            for i in 0..150 {
                let (st, _) = req(
                    a,
                    "POST",
                    &format!("/v1/sessions/f{i}/messages"),
                    flood_tok,
                    "application/json",
                    chat(30, 80).to_string().as_bytes(),
                );
                if st == 429 {
                    refused += 1;
                }
            }
        }
        let (_, body) = req(
            a,
            "POST",
            "/v1/sessions/b/messages",
            quiet_tok,
            "application/json",
            chat(30, 80).to_string().as_bytes(),
        );
        let id = serde_json::from_str::<Value>(&body).unwrap()["job"]["id"]
            .as_u64()
            .expect("B's job");
        loop {
            let (_, body) = req(
                a,
                "GET",
                &format!("/v1/jobs/{id}"),
                quiet_tok,
                "application/json",
                b"",
            );
            let j: Value = serde_json::from_str(&body).unwrap();
            if let (Some(c), Some(s)) = (j["created_ms"].as_u64(), j["started_ms"].as_u64()) {
                return ((s - c) as f64, refused);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let (quiet, _) = wait_of_b(false);
    let (flooded, refused) = wait_of_b(true);
    println!(
        "quiet wait {quiet:.0} ms; while A floods ({refused} of A's 150 posts refused with 429): {flooded:.0} ms  ×{:.2} of quiet, {:.2} of one model call",
        flooded / quiet.max(1.0),
        flooded / delay_ms as f64
    );
}

fn main() {
    let v: Vec<String> = std::env::args().collect();
    let num = |flag: &str, default: u64| {
        v.iter()
            .position(|a| a == flag)
            .and_then(|i| v.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    };
    if v.iter().any(|a| a == "--list") {
        return;
    }
    // `--only memory|connections|fairness` runs one part.
    let only = v
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| v.get(i + 1).cloned());
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);
    if run("memory") {
        memory();
    }
    if run("connections") {
        connections(num("--connections", 1000) as usize);
    }
    if run("fairness") {
        fairness(num("--delay-ms", 100));
    }
}
