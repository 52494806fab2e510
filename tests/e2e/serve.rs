//! `abridge serve`: the real binary on a free loopback port, spoken to over raw HTTP/1.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use abridge_test_llm::Options;
use serde_json::{Value, json};

use crate::harness::*;

/// A running `abridge serve`, killed on drop.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
}

impl Server {
    pub(crate) fn start(env: &Env, extra: &[&str]) -> Server {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = if n == 0 {
            "serve.log".to_string()
        } else {
            format!("serve-{n}.log")
        };
        let name = if env.dir.path().join("serve.log").exists() {
            name
        } else {
            "serve.log".to_string()
        };
        let log = std::fs::File::create(env.dir.path().join(&name)).unwrap();
        let mut child = env
            .command(&args)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn abridge serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| {
                panic!(
                    "no address line: {line:?}\n{}",
                    std::fs::read_to_string(env.dir.path().join(&name)).unwrap()
                )
            })
            .to_string();
        Server { child, addr }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct Resp {
    pub(crate) status: u16,
    pub(crate) headers: String,
    pub(crate) body: String,
}

impl Resp {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
    #[track_caller]
    pub(crate) fn expect(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        self.json()
    }
}

pub(crate) fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Resp {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a));
    }
    request_with(addr, method, path, &headers, body)
}

/// A request with exactly these headers (besides Host, Content-Length and Connection).
pub(crate) fn request_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before it reads everything; a failed write is then fine.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {text:?}"));
    Resp {
        status,
        headers: headers.to_string(),
        body: body.to_string(),
    }
}

pub(crate) fn get(addr: &str, path: &str, token: Option<&str>) -> Resp {
    request(addr, "GET", path, token, b"")
}

pub(crate) fn post(addr: &str, path: &str, token: Option<&str>, body: &Value) -> Resp {
    request(addr, "POST", path, token, body.to_string().as_bytes())
}

/// Read an SSE stream until `stop` holds for an event (or the stream ends); returns the
/// (event, data) pairs.
pub(crate) fn sse(
    addr: &str,
    path: &str,
    token: Option<&str>,
    last_id: Option<u64>,
    stop: impl Fn(&str) -> bool,
) -> Vec<(String, Value)> {
    sse_until(addr, path, token, last_id, |k, _| stop(k))
}

/// [`sse`] that stops on an event of a kind and data `stop` accepts.
pub(crate) fn sse_until(
    addr: &str,
    path: &str,
    token: Option<&str>,
    last_id: Option<u64>,
    stop: impl Fn(&str, &Value) -> bool,
) -> Vec<(String, Value)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let last = last_id
        .map(|i| format!("Last-Event-ID: {i}\r\n"))
        .unwrap_or_default();
    // HTTP/1.0: the stream comes unchunked and ends when the server closes it.
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}{last}Accept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut events = Vec::new();
    let (mut kind, mut data) = (String::new(), String::new());
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return events;
        }
        let l = line.trim_end();
        if let Some(k) = l.strip_prefix("event: ") {
            kind = k.to_string();
        } else if let Some(d) = l.strip_prefix("data: ") {
            data = d.to_string();
        } else if l.is_empty() && !kind.is_empty() {
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            let done = stop(&kind, &v);
            events.push((std::mem::take(&mut kind), v));
            if done {
                return events;
            }
        }
    }
}

/// `POST /v1/sessions/{session}/messages` with `body`.
pub(crate) fn post_messages(addr: &str, token: Option<&str>, session: &str, body: &Value) -> Resp {
    post(
        addr,
        &format!("/v1/sessions/{session}/messages"),
        token,
        body,
    )
}

pub(crate) fn messages(prefix: &str, n: usize, with_ids: bool) -> Value {
    let ms: Vec<Value> = (1..=n)
        .map(|i| {
            let mut m = json!({
                "role": if i % 2 == 1 { "user" } else { "assistant" },
                "content": format!("{prefix} message {i}: the deployment of the billing service moves to the new cluster on Friday after the schema migration."),
            });
            if with_ids {
                m["id"] = json!(format!("{prefix}-{i}"));
            }
            m
        })
        .collect();
    json!({ "messages": ms })
}

pub(crate) fn token(env: &Env, tenant: &str, extra: &[&str]) -> String {
    let mut args = vec!["tokens", "create", "--tenant", tenant];
    args.extend_from_slice(extra);
    let r = env.run(&args);
    r.assert_ok();
    r.stdout.trim().to_string()
}

pub(crate) fn wait_job(addr: &str, token: Option<&str>, id: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = get(addr, &format!("/v1/jobs/{id}"), token).expect(200);
        if !matches!(j["state"].as_str(), Some("queued" | "running")) {
            return j;
        }
        assert!(Instant::now() < deadline, "job {id} did not end: {j}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn extractive() -> Env {
    Env::new().with("ABRIDGE_BACKEND", "extractive")
}

#[test]
fn tokens_are_required_and_two_tenants_with_the_same_session_id_see_only_their_own() {
    let env = extractive();
    let a = token(&env, "acme", &[]);
    let b = token(&env, "globex", &[]);
    let ro = token(&env, "acme", &["--read-only"]);
    let srv = Server::start(&env, &[]);
    let addr = srv.addr.as_str();

    // No token, a malformed header, an unknown token: 401 with a hint.
    let r = post_messages(addr, None, "s", &messages("x", 2, false));
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(
        r.headers
            .to_lowercase()
            .contains("www-authenticate: bearer")
    );
    assert!(
        r.json()["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("abridge tokens create")
    );
    assert_eq!(get(addr, "/v1/sessions", Some("abr_wrong")).status, 401);
    assert_eq!(request(addr, "GET", "/v1/sessions", None, b"").status, 401);
    // Liveness, readiness and the document need no token.
    assert_eq!(get(addr, "/healthz", None).status, 200);
    assert_eq!(get(addr, "/readyz", None).status, 200);

    // Same session id in both tenants: two sessions.
    let ra = post_messages(addr, Some(&a), "s", &messages("acme", 12, true)).expect(202);
    let rb = post_messages(addr, Some(&b), "s", &messages("globex", 14, true)).expect(202);
    assert_eq!(
        (ra["episodes"].as_u64(), rb["episodes"].as_u64()),
        (Some(12), Some(14))
    );
    let ja = ra["job"]["id"]
        .as_u64()
        .expect("a refresh is due for 12 messages");
    assert_eq!(wait_job(addr, Some(&a), ja)["state"], "succeeded");
    let sa = get(addr, "/v1/sessions/s/summaries", Some(&a)).expect(200);
    assert!(
        sa["summaries"][0]["content"]
            .as_str()
            .unwrap()
            .contains("acme")
    );
    assert!(!sa.to_string().contains("globex"));
    let sb = get(addr, "/v1/sessions/s", Some(&b)).expect(200);
    assert_eq!(sb["episodes"], 14);
    let listed = get(addr, "/v1/sessions", Some(&b)).expect(200);
    assert_eq!(listed["total"], 1);
    let ctx = get(addr, "/v1/sessions/s/context?budget=400", Some(&b)).expect(200);
    assert!(!ctx.to_string().contains("acme"), "{ctx}");

    // Every route with the other tenant's ids: 404, exactly like a missing one.
    post_messages(addr, Some(&a), "only-acme", &messages("acme", 2, false)).expect(202);
    for (m, p) in [
        ("GET", format!("/v1/jobs/{ja}")),
        ("POST", format!("/v1/jobs/{ja}/cancel")),
        ("GET", format!("/v1/jobs/{ja}/events")),
        ("GET", "/v1/sessions/only-acme".to_string()),
    ] {
        let foreign = request(addr, m, &p, Some(&b), b"");
        assert_eq!(foreign.status, 404, "{m} {p}: {}", foreign.body);
        assert_eq!(foreign.json()["error"]["code"], "not_found");
    }
    for p in ["summaries", "context", "refresh", "mode"] {
        let m = match p {
            "refresh" => "POST",
            "mode" => "PUT",
            _ => "GET",
        };
        let body = if p == "mode" {
            br#"{"mode":"idle"}"#.as_slice()
        } else {
            b""
        };
        let r = request(
            addr,
            m,
            &format!("/v1/sessions/only-acme/{p}"),
            Some(&b),
            body,
        );
        assert_eq!(r.status, 404, "{m} {p}: {}", r.body);
    }
    assert_eq!(
        request(addr, "DELETE", "/v1/sessions/only-acme", Some(&b), b"").status,
        404
    );
    // Provenance, focus and pins are tenant-scoped too.
    let row = sa["summaries"][0]["id"].as_u64().unwrap();
    let x = get(
        addr,
        &format!("/v1/sessions/s/summaries/{row}/expand"),
        Some(&a),
    )
    .expect(200);
    let ids = crate::harness::expanded_ids(&x);
    let last = sa["summaries"][0]["last_episode"].as_u64().unwrap();
    assert_eq!(ids, (1..=last).collect::<Vec<_>>());
    assert!(!x.to_string().contains("globex"));
    for (m, p, body) in [
        (
            "GET",
            format!("/v1/sessions/s/summaries/{row}/expand"),
            b"".as_slice(),
        ),
        (
            "GET",
            "/v1/sessions/only-acme/summaries/1/expand".to_string(),
            b"".as_slice(),
        ),
        (
            "PUT",
            "/v1/sessions/only-acme/focus".to_string(),
            br#"{"focus":"x"}"#.as_slice(),
        ),
        (
            "GET",
            "/v1/sessions/only-acme/pins".to_string(),
            b"".as_slice(),
        ),
        (
            "PUT",
            "/v1/sessions/only-acme/pins/1".to_string(),
            b"".as_slice(),
        ),
    ] {
        let r = request(addr, m, &p, Some(&b), body);
        assert_eq!(r.status, 404, "{m} {p}: {}", r.body);
    }
    let f = request(
        addr,
        "PUT",
        "/v1/sessions/s/focus",
        Some(&a),
        br#"{"focus":"keep file paths"}"#,
    );
    assert_eq!(f.status, 200, "{}", f.body);
    assert_eq!(f.json()["focus"], "keep file paths");
    let pins = request(addr, "PUT", "/v1/sessions/s/pins/2", Some(&a), b"");
    assert_eq!(pins.json()["pins"], serde_json::json!([2]));
    // A budget the history (447 tokens) does not fit: a history that fits is the context
    // verbatim, pins and all.
    let ctx = get(addr, "/v1/sessions/s/context?budget=300", Some(&a)).expect(200);
    assert_eq!(ctx["pinned"], 1, "{ctx}");
    assert_eq!(
        request(addr, "DELETE", "/v1/sessions/s/pins/2", Some(&a), b"").json()["pins"],
        serde_json::json!([])
    );
    let jobs_b = get(addr, "/v1/jobs", Some(&b)).expect(200);
    assert!(
        jobs_b["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["id"] != ja)
    );
    // The other tenant's events never reach this one.
    let jb = rb["job"]["id"]
        .as_u64()
        .expect("a refresh is due for 14 messages");
    wait_job(addr, Some(&b), jb);
    let evs = sse(addr, "/v1/events", Some(&b), Some(0), |k| {
        k == "job.succeeded"
    });
    assert!(
        evs.iter()
            .all(|(_, d)| d["session"] == "s" && d["job"] != ja),
        "{evs:?}"
    );

    // A read-only token reads but does not write.
    assert_eq!(get(addr, "/v1/sessions/s", Some(&ro)).status, 200);
    let r = post_messages(addr, Some(&ro), "s", &messages("ro", 1, false));
    assert_eq!(r.status, 403, "{}", r.body);

    // A revoked token stops working at once.
    let listed = env.run(&["tokens", "list", "--json"]);
    let id = listed.json().as_array().unwrap()[1]["id"].as_u64().unwrap();
    assert!(
        !listed.stdout.contains(&b[4..]),
        "tokens list shows only prefixes"
    );
    env.run(&["tokens", "revoke", &id.to_string()]).assert_ok();
    assert_eq!(get(addr, "/v1/sessions", Some(&b)).status, 401);
    assert_eq!(get(addr, "/v1/sessions", Some(&a)).status, 200);
    // The token itself is in neither the database nor the log.
    let db = std::fs::read(env.db()).unwrap();
    assert!(!String::from_utf8_lossy(&db).contains(&a[4..]));
    let log = std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap();
    assert!(!log.contains(&a[4..]));
}

#[test]
fn reposting_with_client_ids_is_idempotent_and_bad_bodies_get_honest_statuses() {
    let env = extractive();
    let srv = Server::start(&env, &["--max-body-mib", "1"]);
    let addr = srv.addr.as_str();
    let first = post_messages(addr, None, "chat%2F1", &messages("m", 4, true)).expect(202);
    assert_eq!(
        (first["stored"].as_u64(), first["duplicates"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(first["ids"][0], "m-1");
    let again = post_messages(addr, None, "chat%2F1", &messages("m", 4, true)).expect(202);
    assert_eq!(
        (
            again["stored"].as_u64(),
            again["duplicates"].as_u64(),
            again["episodes"].as_u64()
        ),
        (Some(0), Some(4), Some(4))
    );
    // The id percent-decodes to the session the CLI sees.
    env.run(&["summaries", "chat/1", "--json"]).assert_ok();

    let r = request(
        addr,
        "POST",
        "/v1/sessions/s/messages",
        None,
        br#"{"messages": [{"role": "user", "content": "hi"},]}"#,
    );
    let e = r.expect(400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 1 column"),
        "{e}"
    );
    let r = request(
        addr,
        "POST",
        "/v1/sessions/s/messages",
        None,
        br#"{"messages": [{"role": "user"}]}"#,
    );
    assert_eq!(r.status, 422, "{}", r.body);
    let r = request(
        addr,
        "POST",
        "/v1/sessions/s/messages",
        None,
        br#"[{"role": "narrator", "content": "x"}]"#,
    );
    let e = r.expect(400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("message 1"),
        "{e}"
    );
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(2 << 20)}]});
    let r = post_messages(addr, None, "s", &big);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "too_large");
    // Nothing of the refused bodies was stored.
    assert_eq!(get(addr, "/v1/sessions/s", None).status, 404);
    let r = request(
        addr,
        "POST",
        "/v1/sessions/%01bad/messages",
        None,
        messages("m", 1, false).to_string().as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.body);

    // A body in no format it knows: the message names the query parameter that fixes it.
    let r = request(
        addr,
        "POST",
        "/v1/transcripts",
        None,
        b"{\"neither\": 1}\n{\"nor\": 2}\n",
    );
    let said = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        r.status >= 400 && said.contains("?format=") && !said.contains("--format"),
        "{} {}",
        r.status,
        r.body
    );

    // A transcript in another format: one job per conversation.
    let t = std::fs::read(fixture("claude-code.jsonl")).unwrap();
    let r = request(
        addr,
        "POST",
        "/v1/transcripts?format=claude-code&session=imported",
        None,
        &t,
    )
    .expect(202);
    let job = r["conversations"][0]["job"]["id"].as_u64().unwrap();
    assert_eq!(wait_job(addr, None, job)["state"], "succeeded");
    let ctx = get(addr, "/v1/sessions/imported/context?budget=500", None).expect(200);
    assert!(!ctx["refresh_pending"].as_bool().unwrap());
    // Never more than the history: the whole history when it fits and is cheaper.
    let full = ctx["full_tokens"].as_u64().unwrap();
    assert!(ctx["tokens"].as_u64().unwrap() <= full, "{ctx}");
    assert!(ctx["saving_percent"].as_f64().unwrap() >= 0.0, "{ctx}");
    // A budget the history does not fit: within it, every turn reflected (the dialogue since
    // the last fold is shown verbatim; a context shows no tool output).
    let ctx = get(
        addr,
        &format!("/v1/sessions/imported/context?budget={}", full - 1),
        None,
    )
    .expect(200);
    assert!(ctx["tokens"].as_u64().unwrap() < full, "{ctx}");
    assert_eq!(ctx["omitted"], 0, "{ctx}");

    // The OpenAPI document lists every route the server answers; every answer names the
    // server's version (what a client checks its own against).
    let r = get(addr, "/openapi.json", None);
    let version = format!("abridge-version: {}", env!("CARGO_PKG_VERSION"));
    assert!(
        r.headers.to_ascii_lowercase().contains(&version),
        "{}",
        r.headers
    );
    let doc = r.expect(200);
    let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    for p in [
        "/v1/sessions/{id}/messages",
        "/v1/transcripts",
        "/v1/sessions",
        "/v1/sessions/{id}/context",
        "/v1/jobs/{id}/events",
        "/v1/events",
        "/metrics",
    ] {
        assert!(paths.iter().any(|x| *x == p), "{p} missing from {paths:?}");
    }
    // A parameter documented "in: path" is a segment of its route; the rest are queries
    // (a client generated from the document must send them where the server reads them).
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap();
                let segment = path.contains(&format!("{{{name}}}"));
                let place = p["in"].as_str().unwrap();
                assert!(
                    (place == "path") == segment && matches!(place, "path" | "query" | "header"),
                    "{method} {path}: {name} is documented in {place}"
                );
            }
        }
    }
    let ctx_params = &doc["paths"]["/v1/sessions/{id}/context"]["get"]["parameters"];
    assert!(
        ctx_params
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "budget" && p["in"] == "query"),
        "{ctx_params}"
    );
    let m = get(addr, "/metrics", None);
    assert_eq!(m.status, 200);
    assert!(m.body.contains("abridge_http_requests_total{method=\"POST\",route=\"/v1/sessions/{id}/messages\",status=\"202\"}"), "{}", m.body);
    assert!(m.body.contains("abridge_jobs{state=\"succeeded\"}"));
    assert_eq!(
        get(addr, "/v1/nothing", None).json()["error"]["code"],
        "not_found"
    );
}

#[test]
fn a_refresh_streams_queued_running_progress_and_success_with_the_summary() {
    let llm = TestServer::start_with(Options {
        delay: Duration::from_millis(150),
        ..Options::default()
    });
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "ollama")
        .with("EXTRACTION_URL", &llm.url());
    let srv = Server::start(
        &env,
        &[
            "--context-length",
            "1024",
            "--max-output-tokens",
            "120",
            "--threshold-tokens",
            "100000",
        ],
    );
    let addr = srv.addr.as_str();
    // Under the trigger threshold: posting queues nothing; the refresh is asked for.
    let r = post_messages(addr, None, "s", &messages("long", 40, false)).expect(202);
    assert!(r["job"].is_null(), "{r}");
    let job = request(addr, "POST", "/v1/sessions/s/refresh", None, b"").expect(202);
    let id = job["id"].as_u64().unwrap();
    let evs = sse(addr, &format!("/v1/jobs/{id}/events"), None, Some(0), |k| {
        k.starts_with("job.succeeded") || k == "job.failed"
    });
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[0], "job.state", "{kinds:?}");
    let pos = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("{k} missing: {kinds:?}"))
    };
    assert!(pos("job.queued") < pos("job.running"));
    assert!(pos("job.running") < pos("job.progress"));
    assert!(pos("job.progress") < pos("summary.written"));
    assert!(pos("summary.written") < pos("job.succeeded"));
    // `job.running` carries the plan the call made (once), and the map stage runs it: the
    // job's planned calls are its chunks and estimated reduce calls.
    let running = &evs[pos("job.running")].1["data"];
    assert_eq!(running["map_reduce"], true, "{running}");
    let chunks = running["chunks"].as_u64().unwrap();
    let reduces: u64 = running["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_u64().unwrap())
        .sum();
    let map_total = evs[pos("job.progress")].1["data"]["total"].as_u64();
    assert_eq!(map_total, Some(chunks), "{running}");
    let view = get(addr, &format!("/v1/jobs/{id}"), None).expect(200);
    assert_eq!(
        view["calls_planned"].as_u64(),
        Some(chunks + reduces),
        "{view}"
    );
    let done = &evs.last().unwrap().1;
    let chain = get(addr, "/v1/sessions/s/summaries", None).expect(200);
    let last = chain["summaries"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(done["data"]["summary"], last["id"]);
    assert_eq!(last["last_episode"], 40);
    // A reconnect after the end replays what it missed after the given id, then ends.
    let queued_id = evs.iter().find(|(k, _)| k == "job.queued").unwrap().1["id"]
        .as_u64()
        .unwrap();
    let again = sse(
        addr,
        &format!("/v1/jobs/{id}/events"),
        None,
        Some(queued_id),
        |_| false,
    );
    let kinds2: Vec<&str> = again.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds2.first(), Some(&"job.state"));
    assert!(
        !kinds2.contains(&"job.queued")
            && kinds2.contains(&"job.running")
            && kinds2.last() == Some(&"job.succeeded"),
        "{kinds2:?}"
    );
}

#[test]
fn a_model_that_is_down_gets_202_every_message_stored_and_the_previous_summary_kept() {
    let llm = TestServer::start();
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "ollama")
        .with("EXTRACTION_URL", &llm.url())
        .with("ABRIDGE_RETRIES", "1");
    let srv = Server::start(&env, &[]);
    let addr = srv.addr.as_str();
    let r = post_messages(addr, None, "s", &messages("one", 10, true)).expect(202);
    assert_eq!(
        wait_job(addr, None, r["job"]["id"].as_u64().unwrap())["state"],
        "succeeded"
    );
    let before = get(addr, "/v1/sessions/s/summaries", None).expect(200);
    llm.push_faults((0..50).map(|_| Fault::Status {
        code: 500,
        message: "model crashed".into(),
    }));
    let r = post_messages(addr, None, "s", &messages("two", 10, true)).expect(202);
    assert_eq!(r["stored"], 10);
    let j = wait_job(addr, None, r["job"]["id"].as_u64().unwrap());
    assert_eq!(j["state"], "failed");
    assert!(
        j["error"].as_str().unwrap().contains("model crashed"),
        "{j}"
    );
    assert_eq!(
        get(addr, "/v1/sessions/s/summaries", None).expect(200),
        before
    );
    let s = get(addr, "/v1/sessions/s", None).expect(200);
    assert_eq!(s["episodes"], 20);
    assert!(s["failures"].as_u64().unwrap() >= 1, "{s}");
    // The context still answers at once, from the previous summary.
    let ctx = get(addr, "/v1/sessions/s/context?budget=300", None).expect(200);
    assert_eq!(ctx["covered"], before["summaries"][0]["last_episode"]);
}

#[test]
fn kill_9_mid_job_then_restart_resumes_it_and_sigterm_drains() {
    let llm = TestServer::start_with(Options {
        delay: Duration::from_millis(300),
        ..Options::default()
    });
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "ollama")
        .with("EXTRACTION_URL", &llm.url());
    let mut srv = Server::start(&env, SMALL);
    let r = post_messages(&srv.addr, None, "big", &messages("big", 120, true)).expect(202);
    let id = r["job"]["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.generations().len() < 3 {
        assert!(Instant::now() < deadline, "no model calls");
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.child.kill().unwrap();
    srv.child.wait().unwrap();
    let asked = llm.generations().len();

    let srv = Server::start(&env, SMALL);
    let j = wait_job(&srv.addr, None, id);
    assert_eq!(j["state"], "succeeded", "{j}");
    assert_eq!(j["attempts"], 2);
    let chain = get(&srv.addr, "/v1/sessions/big/summaries", None).expect(200);
    assert_eq!(
        chain["summaries"].as_array().unwrap().last().unwrap()["last_episode"],
        120
    );
    assert!(llm.generations().len() > asked);
    // The event log survived the kill: the job's events from before it are replayed, and the
    // ids go on increasing after the restart.
    let evs = sse(
        &srv.addr,
        &format!("/v1/jobs/{id}/events"),
        None,
        Some(0),
        |k| k == "job.succeeded",
    );
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    let ids: Vec<u64> = evs[1..]
        .iter()
        .filter_map(|(_, v)| v["id"].as_u64())
        .collect();
    assert_eq!(kinds.first(), Some(&"job.state"), "{kinds:?}");
    assert_eq!(kinds.get(1), Some(&"job.queued"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "job.running").count(),
        2,
        "one run before the kill, one after: {kinds:?}"
    );
    assert!(kinds.contains(&"job.succeeded"), "{kinds:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    // SIGTERM with a job running: it finishes within the grace period, the process exits 0.
    let r = post_messages(&srv.addr, None, "big2", &messages("second", 60, true)).expect(202);
    let id2 = r["job"]["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&srv.addr, &format!("/v1/jobs/{id2}"), None).json()["state"] != "running" {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut srv = srv;
    std::process::Command::new("kill")
        .args(["-TERM", &srv.pid().to_string()])
        .status()
        .unwrap();
    let status = srv.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let r = env.run(&["jobs", "show", &id2.to_string(), "--json"]);
    assert_eq!(r.json()["state"], "succeeded", "{}", r.stdout);
}

#[test]
fn a_public_address_without_a_token_is_refused() {
    let env = extractive();
    let r = env.run_within(60, &["serve", "--listen", "0.0.0.0:0"]);
    r.assert_fails(2, &["abridge tokens create --tenant"]);
    // With a token but no master key it is refused too: memories would be stored in clear.
    token(&env, "acme", &[]);
    let r = env.run_within(60, &["serve", "--listen", "0.0.0.0:0"]);
    r.assert_fails(2, &["without a master key", "abridge keys new"]);
    // With both, the checks pass and it goes on to bind: shown on a documentation address
    // (192.0.2.1, never assigned), so nothing listens beyond loopback during the tests.
    let key = env.write("master.key", env.run(&["keys", "new"]).stdout.as_bytes());
    let env = env.with("ABRIDGE_MASTER_KEY_FILE", key.to_str().unwrap());
    let r = env.run_within(60, &["serve", "--listen", "192.0.2.1:0"]);
    r.assert_fails(2, &["cannot listen on 192.0.2.1:0"]);
}

#[test]
fn a_tenant_over_its_request_rate_gets_429_with_retry_after() {
    let env = extractive();
    let srv = Server::start(&env, &["--rate-limit", "1"]);
    // A burst of twice the rate passes; the next request within the second is refused.
    let statuses: Vec<Resp> = (0..6)
        .map(|_| get(&srv.addr, "/v1/sessions", None))
        .collect();
    let limited = statuses
        .iter()
        .find(|r| r.status == 429)
        .unwrap_or_else(|| {
            panic!(
                "no 429 among {:?}",
                statuses.iter().map(|r| r.status).collect::<Vec<_>>()
            )
        });
    assert_eq!(limited.json()["error"]["code"], "rate_limited");
    assert!(
        limited.headers.to_lowercase().contains("retry-after: 1"),
        "{}",
        limited.headers
    );
    assert_eq!(statuses[0].status, 200);
    // Liveness is not rate limited.
    assert_eq!(get(&srv.addr, "/healthz", None).status, 200);
}

/// One memory contract: `{user, text}` is a memory (type `fact`, key `general`), and a body
/// of the wrong shape is a 422 that names the field and shows the smallest memory; a message
/// without `content` is a 422 that shows a message's shape.
#[test]
fn the_smallest_memory_is_user_and_text_and_wrong_bodies_say_what_to_send() {
    let env = extractive();
    let t = token(&env, "acme", &[]);
    let srv = Server::start(&env, &[]);
    let w = post(
        &srv.addr,
        "/v1/memories",
        Some(&t),
        &json!({"user": "alice", "text": "Alice prefers the dark theme in her editor"}),
    )
    .expect(202);
    let id = w["memories"][0]["id"].as_str().unwrap().to_string();
    let m = get(&srv.addr, &format!("/v1/memories/{id}"), Some(&t)).expect(200);
    assert_eq!(
        (m["type"].as_str(), m["key"].as_str()),
        (Some("fact"), Some("general"))
    );
    for (body, field) in [
        (json!({"text": "no user"}), "missing field `user`"),
        (json!({"user": "alice"}), "missing field `text`"),
        (
            json!({"memories": [{"user": "a", "text": "ok"}, {"user": "a"}]}),
            "memories[1]: missing field `text`",
        ),
        (json!({"user": "alice", "text": 5}), "invalid type"),
        (json!({"memories": 3}), "\"memories\" is not a list"),
        (json!(["x"]), "not a JSON object"),
    ] {
        let r = post(&srv.addr, "/v1/memories", Some(&t), &body);
        let e = r.expect(422);
        let all = format!(
            "{} {}",
            e["error"]["message"].as_str().unwrap_or_default(),
            e["error"]["hint"].as_str().unwrap_or_default()
        );
        assert!(all.contains(field), "{body}: {all}");
        assert!(
            all.contains(r#"{"user": "alice", "text": "#),
            "{body}: {all}"
        );
    }
    // Every other body names its field and shows one that would do.
    for (method, path, body, field, example) in [
        (
            "POST",
            "/v1/recall",
            json!({"user": "alice"}),
            "missing field `query`",
            r#""query": "#,
        ),
        (
            "PUT",
            "/v1/sessions/s/mode",
            json!({"quiet_secs": 5}),
            "missing field `mode`",
            r#""mode": "idle""#,
        ),
        (
            "POST",
            "/v1/tokens",
            json!({"read_only": "yes"}),
            "invalid type",
            r#""read_only": false"#,
        ),
    ] {
        let r = request(
            &srv.addr,
            method,
            path,
            Some(&t),
            body.to_string().as_bytes(),
        );
        let e = r.expect(422);
        let (m, h) = (
            e["error"]["message"].as_str().unwrap_or_default(),
            e["error"]["hint"].as_str().unwrap_or_default(),
        );
        assert!(m.contains(field) && h.contains(example), "{path}: {e}");
    }
    let r = post(
        &srv.addr,
        "/v1/sessions/s/messages",
        Some(&t),
        &json!({"messages": [{"role": "user", "text": "hi"}]}),
    );
    let e = r.expect(422);
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("messages[0]: missing field `content`")
            && message.contains("name that field \"content\""),
        "{e}"
    );
    assert!(
        e["error"]["hint"]
            .as_str()
            .unwrap()
            .contains(r#"{"role": "user", "content": "#),
        "{e}"
    );
}

#[test]
fn memories_over_http_cluster_summarize_recall_with_sources_and_stay_per_tenant() {
    let env = extractive();
    let (a, b) = (token(&env, "acme", &[]), token(&env, "globex", &[]));
    let reader = token(&env, "acme", &["--read-only"]);
    let srv = Server::start(&env, &["--sweep-secs", "1"]);
    let facts = [
        "Alice prefers the dark theme in her editor",
        "Alice uses a dark theme with large fonts in the editor",
        "Alice wants the editor theme dark at night",
    ];
    let memories: Vec<Value> = facts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": format!("m{i}"), "user": "alice", "project": "web", "environment": "prod",
                   "type": "preference", "key": "editor", "text": t, "importance": 0.6})
        })
        .collect();
    for t in [&a, &b] {
        let w = post(
            &srv.addr,
            "/v1/memories",
            Some(t),
            &json!({ "memories": memories }),
        )
        .expect(202);
        assert_eq!(w["memories"][2]["summarizing"], true);
    }
    // The summary is made after the answer; wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let summary = loop {
        let c = get(&srv.addr, "/v1/clusters?user=alice", Some(&a)).expect(200);
        if let Some(id) = c["clusters"][0]["summary"].as_u64() {
            assert_eq!(c["clusters"][0]["members"], json!(["m0", "m1", "m2"]));
            break id;
        }
        assert!(Instant::now() < deadline, "no summary: {c}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let r = post(
        &srv.addr,
        "/v1/recall",
        Some(&reader),
        &json!({"query": "dark editor theme", "user": "alice", "k": 10}),
    )
    .expect(200);
    let results = r["results"].as_array().unwrap();
    let s = results
        .iter()
        .find(|x| x["kind"] == "summary")
        .expect("summary recalled");
    assert_eq!(s["sources"], json!(["m0", "m1", "m2"]));
    assert_eq!(results.iter().filter(|x| x["kind"] == "memory").count(), 3);
    let src = get(
        &srv.addr,
        &format!("/v1/summaries/{summary}/sources"),
        Some(&a),
    )
    .expect(200);
    assert_eq!(src["sources"].as_array().unwrap().len(), 3);
    // Read-only tokens recall but do not write; the other tenant's ids are 404s.
    post(&srv.addr, "/v1/memories", Some(&reader), &memories[0]).expect(403);
    request(&srv.addr, "DELETE", "/v1/memories/m0", Some(&reader), b"").expect(403);
    let g = get(&srv.addr, "/v1/memories?user=alice", Some(&b)).expect(200);
    assert_eq!(g["total"], 3);
    // A delete drops the summary at once; globex keeps its own.
    let d = request(&srv.addr, "DELETE", "/v1/memories/m1", Some(&a), b"").expect(200);
    assert_eq!(d["summary_deleted"], true);
    get(&srv.addr, "/v1/memories/m1", Some(&a)).expect(404);
    get(&srv.addr, "/v1/memories/m1", Some(&b)).expect(200);
    get(&srv.addr, &format!("/v1/summaries/{summary}"), Some(&a)).expect(404);
    get(&srv.addr, &format!("/v1/summaries/{summary}"), Some(&b)).expect(200);
    let r = post(
        &srv.addr,
        "/v1/recall",
        Some(&a),
        &json!({"query": "large fonts", "k": 10}),
    )
    .expect(200);
    assert!(
        r["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["kind"] == "memory" && !x["text"].as_str().unwrap().contains("large fonts")),
        "{r}"
    );
    // Bad bodies get honest statuses.
    post(
        &srv.addr,
        "/v1/memories",
        Some(&a),
        &json!({"user": "alice"}),
    )
    .expect(422);
    let bad = post(
        &srv.addr,
        "/v1/memories",
        Some(&a),
        &json!({"user": "alice", "type": "fact", "key": "k", "text": "t", "importance": 7}),
    )
    .expect(400);
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("from 0 to 1")
    );
    post(&srv.addr, "/v1/recall", Some(&a), &json!({"query": " "})).expect(400);
    get(&srv.addr, "/v1/summaries/x/sources", Some(&a)).expect(404);
}

#[test]
fn over_the_monthly_ceiling_writes_are_stored_summaries_refused_and_usage_says_why() {
    let env = extractive().with("ABRIDGE_MONTHLY_TOKENS", "0");
    let srv = Server::start(&env, &[]);
    let memories: Vec<Value> = (0..3)
        .map(|i| {
            json!({"user": "u", "type": "fact", "key": "deploy",
                   "text": format!("The deploy runs on Fridays, note {i}")})
        })
        .collect();
    let w = post(
        &srv.addr,
        "/v1/memories",
        None,
        &json!({ "memories": memories }),
    )
    .expect(202);
    assert_eq!(w["memories"].as_array().unwrap().len(), 3);
    assert_eq!(w["memories"][2]["summarizing"], false);
    let refused = &w["summaries_refused"];
    assert_eq!(refused["code"], "quota_exhausted");
    assert_eq!(refused["limit"], 0);
    assert!(refused["resets_at_ms"].as_u64().unwrap() > 0);
    let u = get(&srv.addr, "/v1/usage", None).expect(200);
    assert_eq!(u["exhausted"], true);
    assert_eq!(u["limit_tokens"], 0);
    let r = post(
        &srv.addr,
        "/v1/recall",
        None,
        &json!({"query": "deploy Fridays"}),
    )
    .expect(200);
    assert_eq!(r["results"].as_array().unwrap().len(), 3);
    let c = get(&srv.addr, "/v1/clusters", None).expect(200);
    assert!(c["clusters"][0]["summary"].is_null());
    let cli = env.run(&["usage", "--json"]);
    assert_eq!(cli.json()["exhausted"], true);
}

#[test]
fn what_the_console_reads_search_messages_with_their_row_coverage_and_pages_without_javascript() {
    let env = extractive();
    // Posting never queues a refresh here: the test asks for the one it wants.
    let srv = Server::start(&env, &["--threshold-tokens", "100000"]);
    let addr = srv.addr.as_str();
    post_messages(addr, None, "Team%2FAlpha", &messages("alpha", 6, false)).expect(202);
    post_messages(addr, None, "other", &messages("other", 4, false)).expect(202);
    let job = request(addr, "POST", "/v1/sessions/Team%2FAlpha/refresh", None, b"").expect(202);
    wait_job(addr, None, job["id"].as_u64().unwrap());
    // Two more: beyond the summary (under the trigger threshold, nothing is queued).
    post_messages(addr, None, "Team%2FAlpha", &messages("late", 2, false)).expect(202);

    // Search by part of the id, ignoring case.
    let found = get(addr, "/v1/sessions?q=team%2Fa", None).expect(200);
    assert_eq!(found["total"], 1, "{found}");
    assert_eq!(found["sessions"][0]["id"], "Team/Alpha");
    assert_eq!(
        get(addr, "/v1/sessions?q=zzz", None).expect(200)["total"],
        0
    );

    // Messages, a page at a time, each with the row that covers it.
    let chain = get(
        addr,
        "/v1/sessions/Team%2FAlpha/summaries?coverage=true",
        None,
    )
    .expect(200);
    let row = &chain["summaries"][0];
    assert_eq!(row["last_episode"], 6, "{chain}");
    let first = get(addr, "/v1/sessions/Team%2FAlpha/messages?limit=5", None).expect(200);
    assert_eq!(first["total"], 8);
    assert_eq!(first["next_after"], 5);
    let rest = get(addr, "/v1/sessions/Team%2FAlpha/messages?after=5", None).expect(200);
    assert!(rest["next_after"].is_null(), "{rest}");
    let all: Vec<&Value> = first["messages"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["messages"].as_array().unwrap())
        .collect();
    let ids: Vec<u64> = all.iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=8).collect::<Vec<_>>());
    for m in &all {
        let covered = m["id"].as_u64().unwrap() <= 6;
        assert_eq!(m["covered_by"].is_u64(), covered, "{m}");
        if covered {
            assert_eq!(m["covered_by"], row["id"]);
        }
    }
    // Coverage: exactly the bytes and count of the covered messages.
    let bytes: usize = all[..6]
        .iter()
        .map(|m| m["content"].as_str().unwrap().len())
        .sum();
    assert_eq!(row["coverage"]["transcript_bytes"], bytes as u64, "{row}");
    assert_eq!(row["coverage"]["messages"], 6);
    assert!(
        get(addr, "/v1/sessions/Team%2FAlpha/summaries", None).expect(200)["summaries"][0]
            .get("coverage")
            .is_none(),
        "coverage only when asked"
    );
    // The session's token figures add up.
    let s = get(addr, "/v1/sessions/Team%2FAlpha", None).expect(200);
    let (history, backlog, summary, saved) = (
        s["history_tokens"].as_u64().unwrap(),
        s["backlog_tokens"].as_u64().unwrap(),
        s["summary_tokens"].as_u64().unwrap(),
        s["tokens_saved"].as_u64().unwrap(),
    );
    assert_eq!(summary, row["tokens"].as_u64().unwrap(), "{s}");
    assert!(backlog > 0 && history > backlog, "{s}");
    assert_eq!(saved, (history - backlog).saturating_sub(summary), "{s}");
    assert_eq!(
        get(addr, "/v1/sessions/nope/messages", None).status,
        404,
        "an unknown session"
    );

    // The console's pages read without JavaScript (open loopback server: no sign-in).
    let html = |path: &str| request_with(addr, "GET", path, &[("Accept", "text/html")], b"");
    let list = html("/");
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("Team/Alpha") && list.body.contains("other"));
    let page = html("/sessions/Team%2FAlpha");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Episodes 1–6"), "{}", page.body);
    assert_eq!(
        page.body
            .matches(&format!("covered by row {}", row["id"]))
            .count(),
        6
    );
    assert_eq!(page.body.matches("not summarized yet").count(), 2);
    assert!(
        page.body.contains("tokens for the next model call"),
        "the context preview"
    );
    // Everything a page loads comes from this server: no fonts, CDNs or other hosts.
    let css = html("/assets/console.css");
    let js = html("/assets/console.js");
    assert_eq!((css.status, js.status), (200, 200));
    for (name, body) in [
        ("/", &list.body),
        ("the session", &page.body),
        ("the CSS", &css.body),
        ("the script", &js.body),
    ] {
        for outside in [
            "src=\"http",
            "href=\"http",
            "href=\"//",
            "src=\"//",
            "url(http",
            "@import",
        ] {
            assert!(
                !body.contains(outside),
                "{name} loads from elsewhere: {outside}"
            );
        }
    }
    // Text is escaped, never markup.
    post_messages(
        addr,
        None,
        "x",
        &json!({"role": "user", "content": "<script>alert(1)</script>"}),
    )
    .expect(202);
    let x = html("/sessions/x");
    assert!(
        !x.body.contains("<script>alert(1)") && x.body.contains("&#60;script&#62;alert(1)"),
        "{}",
        x.body
    );
    // A page that is not there: HTML for a browser, JSON for a client.
    let missing = html("/no-such-page");
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("<html"));
    assert_eq!(
        get(addr, "/no-such-page", None).expect(404)["error"]["code"],
        "not_found"
    );
    assert_eq!(html("/sessions/nope").status, 404);
}

#[test]
fn removing_the_newest_message_refolds_the_row_that_covered_it_and_frees_its_id() {
    let llm = TestServer::start();
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "ollama")
        .with("EXTRACTION_URL", &llm.url());
    let srv = Server::start(&env, &["--threshold-tokens", "100000"]);
    let addr = srv.addr.as_str();
    let mut ms = messages("pop", 20, true);
    let last = ms["messages"].as_array_mut().unwrap().last_mut().unwrap();
    last["content"] = json!("zebracorn launch codes are in the vault, said by mistake");
    post_messages(addr, None, "s", &ms).expect(202);
    let job = request(addr, "POST", "/v1/sessions/s/refresh", None, b"").expect(202);
    wait_job(addr, None, job["id"].as_u64().unwrap());
    let chain = get(addr, "/v1/sessions/s/summaries", None).expect(200);
    let row = chain["summaries"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(row["last_episode"], 20, "{chain}");
    assert!(
        row["content"].as_str().unwrap().contains("zebracorn"),
        "{row}"
    );

    // The newest message goes with the row that covered it; a refresh folds the rest again.
    let gone = request(addr, "DELETE", "/v1/sessions/s/messages/last", None, b"").expect(200);
    assert_eq!(gone["message"]["id"], 20, "{gone}");
    assert!(
        gone["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("zebracorn")
    );
    assert_eq!(gone["dropped_rows"], json!([row["id"]]), "{gone}");
    assert_eq!(gone["episodes"], 19, "{gone}");
    let job = gone["job"]["id"].as_u64().expect("a refold is queued");
    assert_eq!(gone["job_links"]["url"], format!("/v1/jobs/{job}"));
    assert_eq!(wait_job(addr, None, job)["state"], "succeeded");
    let chain = get(addr, "/v1/sessions/s/summaries?all=true", None).expect(200);
    let rows = chain["summaries"].as_array().unwrap();
    assert_eq!(rows.last().unwrap()["last_episode"], 19, "{chain}");
    assert!(!chain.to_string().contains("zebracorn"), "{chain}");
    let page = get(addr, "/v1/sessions/s/messages?after=0&limit=100", None).expect(200);
    assert_eq!(page["total"], 19);
    assert!(!page.to_string().contains("zebracorn"));
    // No summary event still carries it.
    let evs = sse(addr, "/v1/events", None, Some(0), |k| {
        k == "message.removed"
    });
    assert!(!format!("{evs:?}").contains("zebracorn"), "{evs:?}");
    // Its client id is free: posted again, it comes back as message 20.
    let again = json!({"messages": [ms["messages"][19].clone()]});
    let r = post_messages(addr, None, "s", &again).expect(202);
    assert_eq!(
        (r["stored"].as_u64(), r["episodes"].as_u64()),
        (Some(1), Some(20)),
        "{r}"
    );
    // A posted tool result is kept (not taken for a duplicate), and can be taken back.
    let tool = json!({"role": "tool", "content": "exit status 0"});
    let r = post_messages(addr, None, "s", &tool).expect(202);
    assert_eq!(
        (r["stored"].as_u64(), r["duplicates"].as_u64()),
        (Some(1), Some(0)),
        "{r}"
    );
    let gone = request(addr, "DELETE", "/v1/sessions/s/messages/last", None, b"").expect(200);
    assert_eq!(
        (
            gone["message"]["id"].as_u64(),
            gone["message"]["role"].as_str()
        ),
        (Some(21), Some("tool"))
    );
    // An unknown session is a 404; removing the only message removes the session.
    request(
        addr,
        "DELETE",
        "/v1/sessions/nobody/messages/last",
        None,
        b"",
    )
    .expect(404);
    post_messages(addr, None, "one", &messages("one", 1, false)).expect(202);
    let gone = request(addr, "DELETE", "/v1/sessions/one/messages/last", None, b"").expect(200);
    assert_eq!(gone["episodes"], 0, "{gone}");
    get(addr, "/v1/sessions/one", None).expect(404);
}

#[test]
fn a_tenant_manages_its_own_tokens_over_http_and_never_sees_another_tenants() {
    let env = extractive();
    let a = token(&env, "acme", &[]);
    let b = token(&env, "globex", &[]);
    let srv = Server::start(&env, &[]);
    let addr = srv.addr.as_str();
    let theirs = get(addr, "/v1/tokens", Some(&b)).expect(200)["tokens"][0]["id"]
        .as_u64()
        .unwrap();
    // A new read-only token: shown once; listed after by its prefix only.
    let made = post(
        addr,
        "/v1/tokens",
        Some(&a),
        &json!({"read_only": true, "label": "dashboard"}),
    )
    .expect(201);
    let ro = made["token"].as_str().unwrap().to_string();
    assert!(
        ro.starts_with("abr_") && made["read_only"] == true,
        "{made}"
    );
    let listed = get(addr, "/v1/tokens", Some(&ro)).expect(200);
    let tokens = listed["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2, "{listed}");
    assert!(!listed.to_string().contains(&ro[10..]), "{listed}");
    assert!(!listed.to_string().contains(&a[10..]), "{listed}");
    assert!(tokens.iter().all(|t| t["id"] != theirs), "{listed}");
    // The read-only token reads but cannot make or revoke tokens.
    let r = post(addr, "/v1/tokens", Some(&ro), &json!({}));
    assert_eq!(r.status, 403, "{}", r.body);
    let r = request(
        addr,
        "DELETE",
        &format!("/v1/tokens/{}", made["id"]),
        Some(&ro),
        b"",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // Another tenant's token is not found, and stays live.
    let r = request(
        addr,
        "DELETE",
        &format!("/v1/tokens/{theirs}"),
        Some(&a),
        b"",
    );
    assert_eq!(r.status, 404, "{}", r.body);
    get(addr, "/v1/sessions", Some(&b)).expect(200);
    // A body of the wrong shape is a 422 that names the fields; a bad label a 400.
    let r = post(addr, "/v1/tokens", Some(&a), &json!({"readonly": true}));
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("read_only"), "{}", r.body);
    let r = post(addr, "/v1/tokens", Some(&a), &json!({"label": "a\u{7}b"}));
    assert_eq!(r.status, 400, "{}", r.body);
    // Revoked: gone at once, and a second revoke is a 404.
    let gone = request(
        addr,
        "DELETE",
        &format!("/v1/tokens/{}", made["id"]),
        Some(&a),
        b"",
    )
    .expect(200);
    assert!(gone["revoked_ms"].as_u64().is_some(), "{gone}");
    assert_eq!(get(addr, "/v1/sessions", Some(&ro)).status, 401);
    let r = request(
        addr,
        "DELETE",
        &format!("/v1/tokens/{}", made["id"]),
        Some(&a),
        b"",
    );
    assert_eq!(r.status, 404, "{}", r.body);
}

/// Messages posted in window mode that no fold covers yet: a context that cannot show them
/// all keeps the identifiers of what it leaves out (computed on read by the guest's rules),
/// queues the fold it needs, and reports its budget and parts.
#[test]
fn a_context_that_must_omit_messages_keeps_their_identifiers_and_queues_the_fold() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let srv = Server::start(&env, &["--mode", "window"]);
    let addr = srv.addr.as_str();
    let mut body = messages("talk", 60, false);
    body["messages"][7]["content"] =
        json!("The outage is tracked as INC-4471; the on-call lead is Priya Raman.");
    body["messages"][7]["created_at"] = json!("2023-05-08T13:56:00Z");
    post_messages(addr, None, "s", &body).expect(202);
    let c = get(addr, "/v1/sessions/s/context?budget=1500", None).expect(200);
    let text: String = c["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    // The fold the context queues may already have run by the time it is read (a worker is
    // quick): then its summary covers what would have been omitted.
    assert!(
        c["omitted"].as_u64().unwrap() > 0 || c["covered"].as_u64() > Some(0),
        "{c}"
    );
    for planted in ["INC-4471", "Priya Raman"] {
        assert!(text.contains(planted), "{planted} left out: {c}");
    }
    assert!(c["identifiers"].as_u64().unwrap() > 0, "{c}");
    assert!(
        !c["job"].is_null() || c["covered"].as_u64() > Some(0),
        "{c}"
    );
    let tokens = c["tokens"].as_u64().unwrap();
    let parts = &c["parts"];
    let sum: u64 = ["summary", "ledger", "digest", "pinned", "recent", "days"]
        .iter()
        .map(|k| parts[k].as_u64().unwrap())
        .sum();
    assert_eq!(sum, tokens, "{c}");
    assert_eq!(c["budget"], 1500);
    assert!(tokens <= 1500 && tokens * 10 >= 1500 * 9, "{c}");
}

/// `s` as a URL query value.
fn q_enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn search_finds_every_message_of_the_tenant_and_hostile_queries_are_words() {
    let env = extractive();
    let acme = token(&env, "acme", &[]);
    let globex = token(&env, "globex", &[]);
    let srv = Server::start(&env, &[]);
    let addr = srv.addr.as_str();
    let mut ms: Vec<Value> = (1..=40)
        .map(|i| {
            json!({"role": if i % 2 == 1 { "user" } else { "assistant" },
                "content": format!("Turn {i}: we talked about the weather and the garden, nothing more.")})
        })
        .collect();
    ms[4] = json!({"role": "user", "content": "The launch code for the Zephyr project is 7741."});
    ms[5] = json!({"role": "assistant", "content": "Noted: 7741."});
    let r = post_messages(addr, Some(&acme), "chat", &json!({ "messages": ms }));
    assert!(r.status < 300, "{}", r.body);
    let r = post_messages(
        addr,
        Some(&globex),
        "theirs",
        &json!({"messages": [{"role": "user", "content": "Globex's Zephyr plans are secret."}]}),
    );
    assert!(r.status < 300, "{}", r.body);
    // The message, its session, number and time, the match marked, and where to read it.
    let v = get(addr, "/v1/search?q=zephyr%20launch", Some(&acme)).expect(200);
    let hits = v["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{v}");
    let h = &hits[0];
    assert_eq!(
        (h["session"].as_str(), h["episode"].as_u64()),
        (Some("chat"), Some(5)),
        "{v}"
    );
    assert!(h["timestamp_ms"].as_i64().is_some(), "{v}");
    assert!(h["excerpt"].as_str().unwrap().contains("**launch**"), "{v}");
    assert!(h["excerpt"].as_str().unwrap().contains("**Zephyr**"), "{v}");
    let link = h["expand"].as_str().unwrap();
    let read = get(addr, link, Some(&acme)).expect(200);
    assert!(read.to_string().contains("launch code"), "{read}");
    assert_eq!(v["complete"], true);
    // The other tenant finds its own message only.
    let v = get(addr, "/v1/search?q=zephyr", Some(&globex)).expect(200);
    let sessions: Vec<&str> = v["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["session"].as_str().unwrap())
        .collect();
    assert_eq!(sessions, ["theirs"], "{v}");
    // Paged: one at a time.
    let v = get(addr, "/v1/search?q=garden&limit=1", Some(&acme)).expect(200);
    assert_eq!(v["hits"].as_array().unwrap().len(), 1);
    assert_eq!(v["next_offset"], 1, "{v}");
    let first = v["hits"][0]["episode"].clone();
    let v = get(addr, "/v1/search?q=garden&limit=1&offset=1", Some(&acme)).expect(200);
    assert_ne!(v["hits"][0]["episode"], first, "{v}");
    // Hostile queries are words: each a 200, the launch message found by its words.
    let long = "zephyr ".repeat(3000);
    for q in [
        "\"zephyr launch\"",
        "NEAR(zephyr launch, 2)",
        "zephyr*",
        "-zephyr",
        "content:zephyr",
        "zephyr AND OR NOT",
        "zephyr)) ((( \" ' ;--",
        "zephyr & !launch | (a <-> b):*",
        long.as_str(),
    ] {
        let v = get(addr, &format!("/v1/search?q={}", q_enc(q)), Some(&acme)).expect(200);
        assert_eq!(v["hits"][0]["episode"], 5, "{q:.40}: {v}");
    }
    for q in ["", "\"\" () *", "the and of"] {
        let v = get(addr, &format!("/v1/search?q={}", q_enc(q)), Some(&acme)).expect(200);
        assert!(v["hits"].as_array().unwrap().is_empty(), "{q}: {v}");
    }
    // Honest refusals.
    get(addr, "/v1/search?q=zephyr&limit=0", Some(&acme)).expect(400);
    get(addr, "/v1/search?q=zephyr&offset=5000", Some(&acme)).expect(400);
    get(addr, "/v1/search?q=zephyr&session=theirs", Some(&acme)).expect(404);
    // Without q: what to send, in the API's error body (not the framework's plain text).
    let e = get(addr, "/v1/search?limit=3", Some(&acme)).expect(400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs the words to look for in q: /v1/search?q="),
        "{e}"
    );
    get(addr, "/v1/search?q=zephyr", None).expect(401);
    // One session's messages.
    let v = get(addr, "/v1/search?q=zephyr&session=chat", Some(&acme)).expect(200);
    assert_eq!(v["hits"][0]["episode"], 5, "{v}");
    // A context with a query carries the earlier turn that answers it, with its number.
    let v = get(
        addr,
        &format!(
            "/v1/sessions/chat/context?budget=300&query={}",
            q_enc("What is the Zephyr launch code?")
        ),
        Some(&acme),
    )
    .expect(200);
    // They change every call, so they ride on the newest message, after the stable prefix.
    let messages = v["messages"].as_array().unwrap();
    let newest = messages.last().unwrap()["content"].as_str().unwrap();
    let note = v["note"].as_str().expect("a note");
    assert!(newest.starts_with(note), "{v}");
    assert!(
        note.contains("Earlier turns that match the question"),
        "{v}"
    );
    assert!(note.contains("\n#5 ") && note.contains("7741"), "{v}");
    // The message that carries it is never part of the stable prefix.
    assert!(
        v["stable"]["messages"].as_u64().unwrap() < messages.len() as u64,
        "{v}"
    );
    assert!(v["found"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["parts"]["found"].as_u64().unwrap() > 0, "{v}");
    assert!(v["tokens"].as_u64().unwrap() <= 300, "{v}");
    // Without the query the share goes to the rest: no found turns.
    let v = get(addr, "/v1/sessions/chat/context?budget=300", Some(&acme)).expect(200);
    assert_eq!(v["found"], 0, "{v}");
    drop(srv);
}

#[test]
fn messages_stored_before_the_index_are_indexed_by_search_and_by_serve() {
    let env = extractive();
    env.run(&["summarize", &fixture("claude-code.jsonl")])
        .assert_ok();
    // As a database written before migration 34 looks once it has run.
    let unindex = || {
        let c = rusqlite::Connection::open(env.db()).unwrap();
        c.execute_batch(
            "DELETE FROM episode_terms; DELETE FROM search_totals; UPDATE sessions SET indexed = 0",
        )
        .unwrap();
    };
    unindex();
    let r = env.run(&["search", "health check", "--json"]);
    r.assert_ok();
    assert!(
        r.stderr
            .contains("indexing stored messages for search: 8 of 8"),
        "{}",
        r.stderr
    );
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(v["hits"].as_array().unwrap().len() >= 2, "{v}");
    assert_eq!(v["complete"], true);
    // A second search has nothing left to index.
    let r = env.run(&["search", "health check"]);
    assert!(!r.stderr.contains("indexing"), "{}", r.stderr);
    // `serve` indexes them in the background as it starts.
    unindex();
    let srv = Server::start(&env, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(&srv.addr, "/v1/search?q=health", None).expect(200);
        if v["complete"] == true && !v["hits"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve never indexed the stored messages: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(srv);
}

/// The database's first token is announced: a server running without tokens now refuses
/// requests that carry none.
#[test]
fn the_first_token_says_the_open_door_closes() {
    let env = extractive();
    let r = env.run(&["tokens", "create", "--tenant", "acme"]);
    r.assert_ok();
    assert!(
        r.stderr.contains("this is the database's first token"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.trim().starts_with("abr_"), "{}", r.stdout);
    let r = env.run(&["tokens", "create", "--tenant", "globex"]);
    r.assert_ok();
    assert!(!r.stderr.contains("first token"), "{}", r.stderr);
}

/// A console visitor who never signed in, on a server started without tokens that has one
/// now, gets a plain sign-in, not "your token is no longer accepted".
#[test]
fn the_consoles_first_visit_is_a_plain_sign_in() {
    let env = extractive();
    let srv = Server::start(&env, &[]);
    env.run(&["tokens", "create", "--tenant", "acme"])
        .assert_ok();
    let r = request(&srv.addr, "GET", "/", None, b"");
    assert!(
        r.status == 303 || r.status == 302 || r.status == 307,
        "{} {}",
        r.status,
        r.headers
    );
    let location = r
        .headers
        .lines()
        .find_map(|l| {
            l.strip_prefix("location: ")
                .or_else(|| l.strip_prefix("Location: "))
        })
        .unwrap_or_default()
        .trim()
        .to_string();
    assert_eq!(location, "/login", "{}", r.headers);
    let page = request(&srv.addr, "GET", "/login", None, b"");
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("no longer accepted"), "{}", page.body);
}

/// A message's `item` (the client's own record of it: an agent framework's item) comes back
/// as it was posted from the message list, the context (beside the message it belongs to)
/// and the removal of the newest message; summaries never see it; one over 256 KiB is a 400
/// that says what to do.
#[test]
fn a_message_item_comes_back_as_posted_and_is_never_summarized() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let srv = Server::start(&env, &[]);
    let addr = srv.addr.as_str();
    let call = json!({"type": "function_call", "call_id": "call_7", "name": "lookup",
        "arguments": "{\"job\": 7, \"secret\": \"quokkasauce\"}"});
    let out = json!({"type": "function_call_output", "call_id": "call_7", "output": "3 retries"});
    let body = json!({"messages": [
        {"role": "user", "content": "How often did job 7 retry?"},
        {"role": "assistant", "content": "[called lookup({\"job\": 7})]", "item": call},
        {"role": "tool", "content": "3 retries", "item": out},
    ]});
    post_messages(addr, None, "it", &body).expect(202);
    let page = get(addr, "/v1/sessions/it/messages?after=0&limit=10", None).expect(200);
    let items: Vec<&serde_json::Value> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["item"])
        .collect();
    assert_eq!(items, vec![&serde_json::Value::Null, &call, &out], "{page}");
    let ctx = get(addr, "/v1/sessions/it/context?budget=2000", None).expect(200);
    let shown: Vec<(serde_json::Value, serde_json::Value)> = ctx["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["episode"].clone(), m["item"].clone()))
        .collect();
    assert_eq!(
        shown,
        vec![
            (json!(1), serde_json::Value::Null),
            (json!(2), call.clone()),
            (json!(3), out.clone())
        ],
        "{ctx}"
    );
    // Summaries read the text only.
    let job = request(addr, "POST", "/v1/sessions/it/refresh", None, b"").expect(202);
    wait_job(addr, None, job["id"].as_u64().unwrap());
    let chain = get(addr, "/v1/sessions/it/summaries", None).expect(200);
    assert!(!chain.to_string().contains("quokkasauce"), "{chain}");
    let gone = request(addr, "DELETE", "/v1/sessions/it/messages/last", None, b"").expect(200);
    assert_eq!(gone["message"]["item"], out, "{gone}");
    // Too large: refused, nothing stored.
    let big = json!({"role": "user", "content": "big", "item": {"blob": "x".repeat(300 * 1024)}});
    let r = post_messages(addr, None, "it", &big);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("at most 262144"), "{}", r.body);
    assert!(!r.body.contains("--skip-invalid"), "{}", r.body);
    let page = get(addr, "/v1/sessions/it/messages?after=0&limit=10", None).expect(200);
    assert_eq!(page["total"], 2, "{page}");
}
