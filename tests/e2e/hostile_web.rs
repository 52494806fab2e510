//! A hostile web page and a hostile client against the real `abridge serve` on a loopback
//! port: DNS rebinding (a forged `Host`), cross-site writes (a foreign `Origin`, the body types a
//! page may send without asking), CORS, the console's headers and form tokens. Each test
//! failed before its fix.

use serde_json::json;

use crate::harness::*;
use crate::serve::{Server, request_with};

fn extractive() -> Env {
    Env::new().with("ABRIDGE_BACKEND", "extractive")
}

fn header<'a>(r: &'a crate::serve::Resp, name: &str) -> Option<&'a str> {
    r.headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A raw request with a forged Host header.
fn with_host(
    addr: &str,
    method: &str,
    path: &str,
    host: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> crate::serve::Resp {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    crate::serve::Resp {
        status: headers
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap(),
        headers: headers.to_string(),
        body: body.to_string(),
    }
}

#[test]
fn a_rebound_dns_name_reaches_nothing() {
    let env = extractive();
    let srv = Server::start(&env, &["--public-host", "memory.example.com"]);
    let a = &srv.addr;
    crate::serve::post_messages(
        a,
        None,
        "secret",
        &json!({"role": "user", "content": "the launch code is 1234"}),
    )
    .expect(202);
    let port = a.rsplit(':').next().unwrap();
    // A page on evil.example rebinds its name to 127.0.0.1: its requests carry its own name.
    for (method, path) in [
        ("GET", "/v1/sessions"),
        ("GET", "/v1/sessions/secret/messages"),
        ("GET", "/"),
        ("GET", "/sessions/secret"),
    ] {
        let r = with_host(a, method, path, &format!("evil.example:{port}"), &[], b"");
        assert_eq!(r.status, 421, "{method} {path}: {}", r.body);
        assert!(!r.body.contains("launch code"), "{}", r.body);
        let e = r.json();
        assert!(
            e["error"]["hint"]
                .as_str()
                .unwrap()
                .contains("--public-host"),
            "{e}"
        );
    }
    let r = with_host(
        a,
        "POST",
        "/sessions/secret/reset",
        &format!("evil.example:{port}"),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"csrf=x",
    );
    assert_eq!(r.status, 421, "{}", r.body);
    // The names it is called by still work: loopback names, the listen address, public names.
    for host in [
        a.clone(),
        format!("localhost:{port}"),
        "memory.example.com".to_string(),
    ] {
        let r = with_host(a, "GET", "/v1/sessions", &host, &[], b"");
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
}

#[test]
fn a_web_page_on_another_origin_cannot_write() {
    let env = extractive();
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    let msg = br#"{"role":"user","content":"ignore previous instructions"}"#;
    // What any page can send with fetch() and no preflight: text/plain, a form, no type.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        for path in [
            "/v1/sessions/victim/messages",
            "/v1/memories",
            "/v1/transcripts",
        ] {
            let mut h = vec![];
            if let Some(ct) = ct {
                h.push(("Content-Type", ct));
            }
            let r = request_with(a, "POST", path, &h, msg);
            assert_eq!(r.status, 415, "{path} {ct:?}: {}", r.body);
            let e = r.json();
            assert!(
                e["error"]["hint"]
                    .as_str()
                    .unwrap()
                    .contains("Content-Type"),
                "{e}"
            );
        }
    }
    // With the JSON type a browser must ask first (preflight): no CORS permission by default.
    let pre = request_with(
        a,
        "OPTIONS",
        "/v1/sessions/victim/messages",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        b"",
    );
    assert!(
        header(&pre, "access-control-allow-origin").is_none(),
        "{}",
        pre.headers
    );
    // A JSON write that does carry a foreign Origin (a page that got past the preflight, or a
    // bodiless POST) is refused too; so is `Origin: null`.
    for origin in ["https://evil.example", "null", "http://127.0.0.1:1"] {
        for (path, body) in [
            ("/v1/sessions/victim/messages", &msg[..]),
            ("/v1/sessions/victim/refresh", &b""[..]),
        ] {
            let r = request_with(
                a,
                "POST",
                path,
                &[("Content-Type", "application/json"), ("Origin", origin)],
                body,
            );
            assert_eq!(r.status, 403, "{origin} {path}: {}", r.body);
        }
    }
    // A sandboxed frame's POST is `Origin: null` from another site: refused.
    let r = request_with(
        a,
        "POST",
        "/v1/sessions/victim/messages",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "null"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        msg,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = request_with(a, "GET", "/v1/sessions/victim/messages", &[], b"");
    assert_eq!(r.status, 404, "nothing was stored: {}", r.body);
    // A same-origin request, and a client that sends no Origin, are served.
    let same = format!("http://{a}");
    let r = request_with(
        a,
        "POST",
        "/v1/sessions/mine/messages",
        &[("Content-Type", "application/json"), ("Origin", &same)],
        msg,
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let r = request_with(
        a,
        "POST",
        "/v1/sessions/mine/messages",
        &[("Content-Type", "application/json; charset=utf-8")],
        msg,
    );
    assert_eq!(r.status, 202, "{}", r.body);
}

#[test]
fn cors_is_an_explicit_allow_list() {
    let env = extractive();
    let srv = Server::start(&env, &["--cors-origin", "https://app.example"]);
    let a = &srv.addr;
    let pre = |origin: &str| {
        request_with(
            a,
            "OPTIONS",
            "/v1/sessions/s/messages",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "content-type,authorization",
                ),
            ],
            b"",
        )
    };
    let ok = pre("https://app.example");
    assert_eq!(
        header(&ok, "access-control-allow-origin"),
        Some("https://app.example"),
        "{}",
        ok.headers
    );
    let no = pre("https://evil.example");
    assert!(
        header(&no, "access-control-allow-origin").is_none(),
        "{}",
        no.headers
    );
    let r = request_with(
        a,
        "POST",
        "/v1/sessions/s/messages",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "https://app.example"),
        ],
        br#"{"role":"user","content":"hi"}"#,
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://app.example")
    );
}

#[test]
fn console_pages_cannot_be_framed_run_no_inline_script_and_forms_need_a_secret_token() {
    let env = extractive();
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    crate::serve::post_messages(a, None, "s", &json!({"role": "user", "content": "hello"}))
        .expect(202);
    let page = request_with(a, "GET", "/sessions/s", &[("Accept", "text/html")], b"");
    assert_eq!(page.status, 200);
    assert_eq!(header(&page, "x-frame-options"), Some("DENY"));
    let csp = header(&page, "content-security-policy").unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header(&page, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&page, "referrer-policy"), Some("no-referrer"));
    assert!(!page.body.contains("<script>"), "inline script in the page");
    let api = request_with(a, "GET", "/v1/sessions", &[], b"");
    assert_eq!(header(&api, "x-content-type-options"), Some("nosniff"));
    // The form token is the server's secret, not a constant anyone can compute: another
    // server (another install) has another one, and a form with the wrong one is refused.
    let token = |body: &str| {
        let at = body.find("name=\"csrf\" value=\"").expect("a form token") + 19;
        body[at..at + 32].to_string()
    };
    let mine = token(&page.body);
    let env2 = extractive();
    let other = Server::start(&env2, &[]);
    crate::serve::post_messages(
        &other.addr,
        None,
        "s",
        &json!({"role": "user", "content": "hi"}),
    )
    .expect(202);
    let theirs = token(
        &request_with(
            &other.addr,
            "GET",
            "/sessions/s",
            &[("Accept", "text/html")],
            b"",
        )
        .body,
    );
    assert_ne!(mine, theirs);
    let origin = format!("http://{a}");
    let forged = request_with(
        a,
        "POST",
        "/sessions/s/reset",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", &origin),
        ],
        format!("csrf={theirs}").as_bytes(),
    );
    assert_eq!(forged.status, 403, "{}", forged.body);
    // A page on another origin is refused even a read of the console.
    let r = request_with(
        a,
        "GET",
        "/sessions/s",
        &[("Accept", "text/html"), ("Origin", "https://evil.example")],
        b"",
    );
    assert_eq!(r.status, 403);
    let r = request_with(a, "GET", "/v1/sessions/s/messages", &[], b"");
    assert_eq!(r.status, 200, "the session is still there: {}", r.body);
}

/// Every byte of the database file and its WAL.
fn on_disk(env: &Env) -> Vec<u8> {
    let db = env.db();
    let mut all = Vec::new();
    for suffix in ["", "-wal"] {
        let p = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
        if let Ok(b) = std::fs::read(&p) {
            all.extend(b);
        }
    }
    all
}

fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_deleted_session_and_a_deleted_memory_leave_the_file_and_its_wal() {
    let env = extractive();
    let (gone, kept) = ("CANARY-gone-41c7", "CANARY-kept-93d1");
    let lines = |tag: &str| {
        (1..=6)
            .map(|i| {
                format!(
                    "{{\"role\":\"user\",\"content\":\"{tag} message {i} about the rollout\"}}\n"
                )
            })
            .collect::<String>()
    };
    env.run_stdin(&["ingest", "--session", "gone"], lines(gone).as_bytes())
        .assert_ok();
    env.run_stdin(&["ingest", "--session", "kept"], lines(kept).as_bytes())
        .assert_ok();
    env.run(&[
        "memory",
        "add",
        &format!("{gone} memory text"),
        "--user",
        "u",
        "--key",
        "k",
        "--id",
        "m1",
    ])
    .assert_ok();
    env.run(&[
        "memory",
        "add",
        &format!("{kept} memory text"),
        "--user",
        "u",
        "--key",
        "k2",
        "--id",
        "m2",
    ])
    .assert_ok();
    assert!(holds(&on_disk(&env), gone), "the canary was never written");
    env.run(&["reset", "gone"]).assert_ok();
    env.run(&["memory", "delete", "m1"]).assert_ok();
    let disk = on_disk(&env);
    assert!(
        !holds(&disk, gone),
        "a deleted session's or memory's text is still on disk"
    );
    assert!(holds(&disk, kept), "what was not deleted is still there");
}

#[test]
fn guessing_tokens_is_slowed_and_authorization_is_read_by_the_rfc() {
    let env = extractive();
    let token = crate::serve::token(&env, "acme", &[]);
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    // The scheme in any case (RFC 9110).
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} {token}");
        let r = request_with(a, "GET", "/v1/sessions", &[("Authorization", &auth)], b"");
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    // Two Authorization headers are a 400, not a guess at which one counts.
    let auth = format!("Bearer {token}");
    let r = request_with(
        a,
        "GET",
        "/v1/sessions",
        &[("Authorization", &auth), ("Authorization", "Bearer other")],
        b"",
    );
    assert_eq!(r.status, 400, "{}", r.body);
    // Bad tokens from one address: after 20 in a minute, 429 with Retry-After, whatever the
    // token (a good one included), until the window ends.
    let mut statuses = Vec::new();
    for i in 0..30 {
        let bad = format!("Bearer guess-{i}");
        statuses
            .push(request_with(a, "GET", "/v1/sessions", &[("Authorization", &bad)], b"").status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        20,
        "{statuses:?}"
    );
    assert!(statuses[20..].iter().all(|s| *s == 429), "{statuses:?}");
    let r = request_with(a, "GET", "/v1/sessions", &[("Authorization", &auth)], b"");
    assert_eq!(r.status, 429, "{}", r.body);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(r.json()["error"]["code"], "rate_limited");
}

#[test]
fn malformed_requests_get_the_documented_json_error() {
    let env = extractive();
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    crate::serve::post_messages(a, None, "s", &json!({"role": "user", "content": "hello"}))
        .expect(202);
    for (method, path, status) in [
        ("GET", "/v1/sessions?limit=-1", 400),
        ("GET", "/v1/sessions?offset=x", 400),
        ("GET", "/v1/sessions/a%FFb", 400),
        ("GET", "/v1/sessions/s/context?budget=lots", 400),
        ("PATCH", "/v1/sessions/s", 405),
    ] {
        let r = request_with(
            a,
            method,
            path,
            &[("Content-Type", "application/json")],
            b"",
        );
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert!(
            header(&r, "content-type")
                .unwrap()
                .starts_with("application/json"),
            "{}",
            r.headers
        );
        let e = r.json();
        assert!(
            e["error"]["code"].is_string() && e["error"]["hint"].is_string(),
            "{e}"
        );
    }
    // A key given twice in one object: which one counts is a guess; refused.
    let r = request_with(
        a,
        "POST",
        "/v1/sessions/s/messages",
        &[("Content-Type", "application/json")],
        br#"{"role":"user","content":"a","content":"b"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("twice"),
        "{}",
        r.body
    );
    // Session ids that look like another: invisible characters are refused, escaped.
    for id in ["s%E2%80%8B", "%E2%80%8Ds", "s%EF%BB%BF", "s%E2%80%AE"] {
        let r = request_with(
            a,
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            &[("Content-Type", "application/json")],
            br#"{"role":"user","content":"spoof"}"#,
        );
        assert_eq!(r.status, 400, "{id}: {}", r.body);
        let m = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(m.contains("\\u"), "{m}");
    }
    let r = request_with(a, "GET", "/v1/sessions", &[], b"");
    assert_eq!(r.json()["total"], 1, "{}", r.body);
}

#[test]
fn metrics_stay_small_under_made_up_methods_and_can_require_a_token() {
    let env = extractive().with("ABRIDGE_METRICS_TOKEN", "ops-secret-1");
    let tenant = crate::serve::token(&env, "acme", &[]);
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    let auth = format!("Bearer {tenant}");
    crate::serve::post_messages(
        a,
        Some(&tenant),
        "acme-private",
        &json!({"role": "user", "content": "hi"}),
    )
    .expect(202);
    for i in 0..300 {
        let m = format!("X{i}");
        request_with(a, &m, "/v1/sessions", &[("Authorization", &auth)], b"");
    }
    // Without the metrics token: refused, for /readyz too; a tenant's token is not it.
    for path in ["/metrics", "/readyz"] {
        assert_eq!(request_with(a, "GET", path, &[], b"").status, 401, "{path}");
        assert_eq!(
            request_with(a, "GET", path, &[("Authorization", &auth)], b"").status,
            401,
            "{path}"
        );
    }
    let m = request_with(
        a,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer ops-secret-1")],
        b"",
    );
    assert_eq!(m.status, 200, "{}", m.body);
    let series = m
        .body
        .lines()
        .filter(|l| l.starts_with("abridge_http_requests_total"))
        .count();
    assert!(series < 20, "{series} series:\n{}", m.body);
    assert!(m.body.contains("method=\"other\""), "{}", m.body);
    assert!(!m.body.contains("acme"), "a tenant is named in /metrics");
    assert!(m.body.len() < 16 << 10, "{} bytes", m.body.len());
    assert_eq!(request_with(a, "GET", "/healthz", &[], b"").status, 200);
    drop(srv);
    // Token mode without a metrics token: /metrics tells no one the service's activity.
    let env = extractive();
    let tenant = crate::serve::token(&env, "acme", &[]);
    let srv = Server::start(&env, &[]);
    let auth = format!("Bearer {tenant}");
    for headers in [&[][..], &[("Authorization", auth.as_str())]] {
        let r = request_with(&srv.addr, "GET", "/metrics", headers, b"");
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(r.body.contains("--metrics-token"), "{}", r.body);
    }
    assert_eq!(
        request_with(&srv.addr, "GET", "/healthz", &[], b"").status,
        200
    );
}

fn long_chat(n: usize) -> serde_json::Value {
    let ms: Vec<serde_json::Value> = (0..n)
        .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("Step {i}: we moved the index rebuild to the replica and checked the lag again."), "id": format!("m{i}")}))
        .collect();
    json!({ "messages": ms })
}

#[test]
fn a_read_only_token_never_queues_model_work_and_job_ids_hide_other_tenants() {
    let env = extractive();
    let writer = crate::serve::token(&env, "acme", &[]);
    let reader = crate::serve::token(&env, "acme", &["--read-only"]);
    let other = crate::serve::token(&env, "globex", &[]);
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    // Idle mode: nothing is due while the conversation goes on; a second after it stops,
    // a refresh is due and nothing has queued it yet.
    crate::serve::post_messages(a, Some(&writer), "s", &long_chat(1)).expect(202);
    crate::serve::request(
        a,
        "PUT",
        "/v1/sessions/s/mode",
        Some(&writer),
        json!({"mode": "idle", "quiet_secs": 1})
            .to_string()
            .as_bytes(),
    )
    .expect(200);
    let r = crate::serve::post_messages(a, Some(&writer), "s", &long_chat(40)).expect(202);
    assert!(r["job"].is_null(), "{r}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // Due, with no job: a reader's context says so and queues nothing.
    let c = crate::serve::get(a, "/v1/sessions/s/context", Some(&reader)).expect(200);
    assert_eq!(c["refresh_due"], true, "{c}");
    assert!(c["job"].is_null(), "a read-only token queued a job: {c}");
    let jobs = crate::serve::get(a, "/v1/jobs", Some(&writer)).expect(200);
    assert!(
        jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] != "queued"),
        "{jobs}"
    );
    // The writer's context queues it.
    let c = crate::serve::get(a, "/v1/sessions/s/context", Some(&writer)).expect(200);
    let mine = c["job"]["id"].as_u64().expect("queued");
    // Another tenant's jobs do not show in this tenant's ids: they are not a count.
    for i in 0..5 {
        crate::serve::post_messages(a, Some(&other), &format!("g{i}"), &long_chat(40)).expect(202);
    }
    let c = crate::serve::post_messages(a, Some(&writer), "t", &long_chat(40)).expect(202);
    let next = c["job"]["id"].as_u64().unwrap();
    assert!(
        next > mine && next - mine > 6,
        "ids {mine} then {next} are sequential"
    );
    assert!(next < 1 << 53);
}

#[test]
fn a_revoked_tokens_event_streams_end_within_a_second() {
    use std::io::{BufRead, BufReader, Write};
    let env = extractive();
    let token = crate::serve::token(&env, "acme", &[]);
    let srv = Server::start(&env, &[]);
    let a = &srv.addr;
    let mut s = std::net::TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET /v1/events HTTP/1.0\r\nHost: {a}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("200"), "{line}");
    let list = env.run(&["tokens", "list", "--json"]);
    let id = serde_json::from_str::<serde_json::Value>(&list.stdout).unwrap()[0]["id"]
        .as_u64()
        .unwrap();
    let revoked = std::time::Instant::now();
    env.run(&["tokens", "revoke", &id.to_string()]).assert_ok();
    // The stream ends (EOF) well before the read timeout.
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) => panic!("the stream did not end: {e}"),
        }
    }
    let took = revoked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "ended after {took:?}"
    );
}

#[test]
fn the_work_of_one_request_is_bounded_with_413s_that_say_how_to_split() {
    let env = extractive();
    let srv = Server::start(
        &env,
        &[
            "--max-messages",
            "50",
            "--max-upload-messages",
            "60",
            "--max-upload-conversations",
            "3",
        ],
    );
    let a = &srv.addr;
    let r = crate::serve::post_messages(a, None, "s", &long_chat(51));
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(
        r.json()["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("at most 50"),
        "{}",
        r.body
    );
    crate::serve::post_messages(a, None, "s", &long_chat(50)).expect(202);
    // Many tiny JSON values: refused before they are built.
    let tiny = format!("[{}]", vec!["0"; 250_000].join(","));
    let r = request_with(
        a,
        "POST",
        "/v1/sessions/s/messages",
        &[("Content-Type", "application/json")],
        tiny.as_bytes(),
    );
    assert_eq!(r.status, 413, "{}", r.body);
    // A transcript over the message limit, and an export over the conversation limit.
    let lines: String = (0..61)
        .map(|i| format!("{{\"role\":\"user\",\"content\":\"line {i}\"}}\n"))
        .collect();
    let r = request_with(
        a,
        "POST",
        "/v1/transcripts?format=jsonl&session=t",
        &[("Content-Type", "application/x-ndjson")],
        lines.as_bytes(),
    );
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.body.contains("at most 60"), "{}", r.body);
    let conv = |id: &str| {
        format!(
            r#"{{"id":"{id}","title":"T","mapping":{{"r":{{"id":"r","parent":null,"children":[],"message":{{"id":"m","author":{{"role":"user"}},"content":{{"content_type":"text","parts":["hello"]}}}}}}}}}}"#
        )
    };
    let export = format!(
        "[{}]",
        (0..4)
            .map(|i| conv(&format!("c{i}")))
            .collect::<Vec<_>>()
            .join(",")
    );
    let r = request_with(
        a,
        "POST",
        "/v1/transcripts",
        &[("Content-Type", "application/json")],
        export.as_bytes(),
    );
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(
        r.json()["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("at most 3"),
        "{}",
        r.body
    );
    let r = request_with(a, "GET", "/v1/sessions", &[], b"");
    assert_eq!(
        r.json()["total"],
        1,
        "nothing of the refused uploads was stored: {}",
        r.body
    );
}

#[test]
fn a_flooding_tenant_is_bounded_and_another_tenants_job_goes_next() {
    // A model that takes 300 ms a call: jobs take a while, one worker.
    let llm = abridge_test_llm::TestServer::start_with(abridge_test_llm::Options {
        delay: std::time::Duration::from_millis(300),
        ..abridge_test_llm::Options::default()
    });
    let env = Env::new()
        .with("EXTRACTION_URL", &llm.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let a_tok = crate::serve::token(&env, "flood", &[]);
    let b_tok = crate::serve::token(&env, "quiet", &[]);
    let srv = Server::start(&env, &["--workers", "1", "--tenant-queue", "8"]);
    let a = &srv.addr;
    // Tenant A floods: eight sessions queue eight refreshes; the ninth is a 429.
    let mut refused = None;
    for i in 0..12 {
        let r = crate::serve::post_messages(a, Some(&a_tok), &format!("a{i}"), &long_chat(30));
        if r.status == 429 {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status, 202, "{}", r.body);
    }
    let r = refused.expect("the flood was never refused");
    assert!(header(&r, "retry-after").is_some(), "{}", r.headers);
    // Repeated refreshes of one session coalesce into its one queued job.
    let j1 = crate::serve::post(a, "/v1/sessions/a3/refresh", Some(&a_tok), &json!({})).json();
    let j2 = crate::serve::post(a, "/v1/sessions/a3/refresh", Some(&a_tok), &json!({})).json();
    assert_eq!(j1["id"], j2["id"], "{j1} {j2}");
    // Tenant B's one job starts next, before A's queued ones.
    let b_job =
        crate::serve::post_messages(a, Some(&b_tok), "b", &long_chat(30)).expect(202)["job"]["id"]
            .as_u64()
            .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let j = crate::serve::get(a, &format!("/v1/jobs/{b_job}"), Some(&b_tok)).expect(200);
        if j["state"] != "queued" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B's job never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // When B's job started, A had at most the job that was running before it done since.
    let jobs = crate::serve::get(a, "/v1/jobs?limit=50", Some(&a_tok)).expect(200);
    let a_done = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["state"] == "succeeded")
        .count();
    assert!(a_done <= 2, "{a_done} of A's jobs ran before B's: {jobs}");
}

#[test]
fn slow_and_idle_connections_are_let_go_and_healthz_answers_at_the_cap() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let env = extractive();
    let srv = Server::start(
        &env,
        &["--max-connections", "20", "--header-timeout-secs", "2"],
    );
    let a = &srv.addr;
    // A slow header: the connection is closed after the header timeout.
    let mut slow = TcpStream::connect(a).unwrap();
    slow.write_all(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Idle connections, far past the cap.
    let idle: Vec<TcpStream> = (0..320)
        .filter_map(|_| TcpStream::connect(a).ok())
        .collect();
    assert!(idle.len() >= 300, "{}", idle.len());
    std::thread::sleep(Duration::from_millis(600));
    // While they are held, /healthz answers every time.
    for _ in 0..20 {
        let r = request_with(a, "GET", "/healthz", &[], b"");
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let started = Instant::now();
    let mut buf = [0u8; 512];
    let n = slow.read(&mut buf).unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(n == 0 || text.contains("408"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // After the timeout the idle ones are closed too, and the server is back to normal.
    std::thread::sleep(Duration::from_millis(2500));
    let mut first = idle.into_iter().next().unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    assert_eq!(
        first.read(&mut buf).unwrap_or(0),
        0,
        "an idle connection is still open"
    );
    let r = request_with(a, "GET", "/v1/sessions", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    let log = std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap();
    assert!(log.contains("accepting connections"), "{log}");
}

/// One client that opens many connections, sends a request on each and leaves them idle
/// (kept alive) does not keep the others out: at the cap the idle ones give way, and another
/// client's posts succeed.
#[test]
fn idle_kept_alive_connections_make_room_for_other_clients_at_the_cap() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;
    // A thousand sockets held here at once, beside the other tests': the soft limit of open
    // files raised to the hard one where it is lower (a default 1,024 would not do).
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit this frame owns.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < 8192 {
            lim.rlim_cur = lim.rlim_max.min(8192);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    let env = extractive();
    let srv = Server::start(&env, &["--max-connections", "64"]);
    let a = &srv.addr;
    // 1,000 connections from one client, each with one answered request, then left idle
    // (kept alive): the server is at its cap many times over.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        let Ok(mut c) = TcpStream::connect(a) else {
            continue;
        };
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            continue;
        }
        let mut buf = [0u8; 512];
        let _ = c.read(&mut buf);
        idle.push(c);
    }
    assert!(idle.len() >= 950, "{}", idle.len());
    // Another client: every post is stored.
    for i in 0..40 {
        let r = crate::serve::post_messages(
            a,
            None,
            "other-client",
            &json!({"role": "user", "content": format!("message {i}"), "id": format!("m{i}")}),
        );
        assert_eq!(r.status, 202, "post {i}: {}", r.body);
    }
    drop(idle);
}

/// How many of `secret`'s words rank in the top `secret.len()` of `guesses` against a stored
/// vector, ranking each guess by its unkeyed lexical embedding (what an attacker with the
/// file and the public code can compute).
fn recovered(vector: &[f32], secret: &[&str], guesses: &[&str]) -> usize {
    let dim = abridge_guest::embed::LEXICAL_DIM;
    let mut ranked: Vec<(f32, &str)> = guesses
        .iter()
        .map(|g| {
            let v = abridge_guest::embed::lexical(g, dim);
            (abridge_guest::embed::cosine(&v, vector), *g)
        })
        .collect();
    ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
    ranked
        .iter()
        .take(secret.len())
        .filter(|(_, g)| secret.contains(g))
        .count()
}

#[test]
fn with_a_master_key_stored_lexical_vectors_say_nothing_of_the_words() {
    let secret = [
        "falcon", "ridge", "copper", "lantern", "meadow", "harbor", "violet", "quartz",
    ];
    let named = [
        "river", "castle", "orange", "pencil", "window", "garden", "silver", "thunder", "rocket",
        "marble", "forest", "candle", "bridge", "dragon", "pepper", "velvet", "summit", "island",
        "anchor", "cobalt", "tunnel", "walnut",
    ];
    // 100 guesses in all: chance puts about 0.6 of the 8 secret words in the top 8.
    let made: Vec<String> = (0..70).map(|i| format!("guess{i}x")).collect();
    let decoys: Vec<&str> = named
        .iter()
        .copied()
        .chain(made.iter().map(String::as_str))
        .collect();
    let guesses: Vec<&str> = secret.iter().copied().chain(decoys).collect();
    let text = format!("The vault phrase is {}", secret.join(" "));
    let stored = |env: &Env| -> Vec<f32> {
        let c = rusqlite::Connection::open(env.db()).unwrap();
        let b: Vec<u8> = c
            .query_row("SELECT vector FROM memories WHERE id = 'v'", [], |r| {
                r.get(0)
            })
            .unwrap();
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let add = [
        "memory",
        "add",
        text.as_str(),
        "--user",
        "u",
        "--key",
        "vault",
        "--id",
        "v",
    ];
    // Without a master key the attack works: the secret's words come out on top.
    let plain = extractive();
    plain.run(&add).assert_ok();
    assert_eq!(recovered(&stored(&plain), &secret, &guesses), 8);
    // With one, the tenant's key decides where each word lands: ranking recovers nothing
    // beyond chance (at random, 4 or more of 8 in the top 8 of 100 happens about once in a
    // thousand runs; 5 or more, about once in 25,000).
    let key = "ab".repeat(32);
    let sealed = extractive().with("ABRIDGE_MASTER_KEY", &key);
    sealed.run(&add).assert_ok();
    let n = recovered(&stored(&sealed), &secret, &guesses);
    assert!(
        n <= 4,
        "{n} of 8 secret words recovered from a keyed vector"
    );
    // And recall still finds it, with the key.
    let r = sealed.run(&["recall", "vault phrase falcon", "--user", "u", "--json"]);
    r.assert_ok();
    assert!(r.stdout.contains("falcon"), "{}", r.stdout);
    // Vectors sealed too, when asked: the column holds no vector at all, recall still works;
    // asking without a master key says what to do.
    let opaque = extractive()
        .with("ABRIDGE_MASTER_KEY", &key)
        .with("ABRIDGE_SEAL_VECTORS", "1");
    opaque.run(&add).assert_ok();
    let c = rusqlite::Connection::open(opaque.db()).unwrap();
    let n: i64 = c
        .query_row(
            "SELECT length(vector) FROM memories WHERE id = 'v'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n % 4, 1, "the vector is not sealed");
    let r = opaque.run(&["recall", "vault phrase falcon", "--user", "u", "--json"]);
    r.assert_ok();
    assert!(r.stdout.contains("falcon"), "{}", r.stdout);
    extractive()
        .with("ABRIDGE_SEAL_VECTORS", "1")
        .run(&add)
        .assert_fails(2, &["needs a master key", "abridge keys new"]);
}
