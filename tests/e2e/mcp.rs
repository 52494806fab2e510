//! The MCP server driven by the official MCP Python SDK (PyPI `mcp`, pinned in
//! tests/mcp/requirements.txt; `.ci/run` installs it into a virtualenv and names its python in
//! ABRIDGE_MCP_PYTHON), over stdio (`abridge mcp`) and over Streamable HTTP (`/mcp` on
//! `abridge serve`). Skipped with a note where the SDK is missing, unless
//! ABRIDGE_REQUIRE_MCP is set.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::harness::*;
use crate::serve::{Server, extractive, messages, post_messages, request_with, token};

/// A Python with the `mcp` package, or `None` (and a note, or a failure when required).
fn python() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = std::env::var_os("ABRIDGE_MCP_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/abridge/mcp-venv/bin/python")),
        )
        .chain([PathBuf::from("python3")])
        .collect();
    for p in candidates {
        let ok = std::process::Command::new(&p)
            .args(["-c", "import mcp, httpx2"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
    }
    assert!(
        std::env::var_os("ABRIDGE_REQUIRE_MCP").is_none(),
        "ABRIDGE_REQUIRE_MCP is set but no python with the mcp package was found (pip install -r tests/mcp/requirements.txt, or set ABRIDGE_MCP_PYTHON)"
    );
    eprintln!(
        "SKIPPED: the MCP tests need the MCP Python SDK (pip install -r tests/mcp/requirements.txt, or set ABRIDGE_MCP_PYTHON)"
    );
    None
}

fn client_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mcp/client.py")
        .display()
        .to_string()
}

/// Run the SDK client with `plan` (tool calls); its report.
fn drive(env: &Env, py: &Path, plan: &Value, transport: &[&str]) -> Value {
    drive_in(env, py, plan, transport, None)
}

/// [`drive`] with the client (and so a stdio server) started in the folder `cwd`.
fn drive_in(env: &Env, py: &Path, plan: &Value, transport: &[&str], cwd: Option<&Path>) -> Value {
    let plan_file = env.write("plan.json", plan.to_string());
    let mut cmd = std::process::Command::new(py);
    if let Some(c) = cwd {
        cmd.current_dir(c);
    }
    cmd.arg(client_script())
        .arg(transport[0])
        .arg(&plan_file)
        .args(&transport[1..])
        .env("HOME", env.dir.path())
        .env("ABRIDGE_DB", env.db())
        .env("ABRIDGE_CACHE_DIR", cache_dir());
    for (k, v) in &env.vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running the MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{e}: {stdout}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        v.get("exception").is_none(),
        "{v}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    v
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// Every tool is listed with a description an agent acts on and an input schema.
fn check_tools(v: &Value) {
    let tools = v["tools"].as_array().unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "context", "expand", "forget", "pin", "recall", "remember", "search"
        ]
    );
    assert!(tools.len() <= 8);
    for t in tools {
        assert!(t["description"].as_str().unwrap().len() > 80, "{t}");
        assert_eq!(t["schema"]["type"], "object", "{t}");
    }
}

#[test]
fn over_stdio_every_tool_answers_and_a_bad_argument_is_a_tool_error_that_says_how_to_fix_it() {
    let Some(py) = python() else { return };
    let env = extractive();
    env.run(&["summarize", &fixture("claude-code.jsonl")])
        .assert_ok();
    let session = "0a1b2c3d-0000-4000-8000-000000000001";
    let row = env.chain(session).unwrap()["summaries"][0]["id"]
        .as_u64()
        .unwrap();
    let plan = json!([
        call("context", json!({})),
        call("context", json!({"session": "0a1b", "budget_tokens": 200})),
        call("search", json!({"query": "checkout"})),
        call("expand", json!({"session": "0a1b", "episode": 3})),
        call("expand", json!({"session": "0a1b", "row": row})),
        call(
            "remember",
            json!({"text": "Releases are cut from the release branches.", "kind": "convention"})
        ),
        call("recall", json!({"query": "how are releases cut"})),
        call("pin", json!({"session": "0a1b", "episode": 1})),
        call("context", json!({"session": session})),
        // Bad arguments: tool errors that say what to give.
        call("context", json!({"session": "nope"})),
        call("context", json!({"budget_tokens": 5})),
        call("expand", json!({"session": session})),
        call("expand", json!({"session": session, "episode": 999})),
        call("context", json!({"bogus": 1})),
        call("forget", json!({"id": "no-such-memory"})),
        // One session's messages; a hostile query is words; a context with a query.
        call(
            "search",
            json!({"query": "health check", "session": "0a1b", "limit": 3})
        ),
        call(
            "search",
            json!({"query": "\"NEAR(checkout* -test)\" OR content:fails"})
        ),
        call(
            "context",
            json!({"session": session, "budget_tokens": 290, "query": "the flaky checkout test"})
        ),
        call("search", json!({"query": "checkout", "limit": 0})),
    ]);
    let exe = env!("CARGO_BIN_EXE_abridge");
    let v = drive(&env, &py, &plan, &["stdio", "--", exe, "mcp"]);
    check_tools(&v);
    let calls = v["calls"].as_array().unwrap();
    let text = |i: usize| calls[i]["text"].as_str().unwrap().to_string();
    for (i, c) in calls.iter().enumerate().take(9) {
        assert_eq!(c["is_error"], false, "call {i}: {}", text(i));
    }
    // The newest session by default. Its whole history fits the default budget and costs less
    // than a summary with the recent turns, so the history itself is the context (never more
    // than the history); the latest request is in it verbatim.
    assert!(text(0).contains(session), "{}", text(0));
    assert!(
        text(0)
            .contains("Great, please also add a note about the health check to the testing guide."),
        "{}",
        text(0)
    );
    // A budget is kept (about four characters a token); at 200 tokens, which the history
    // (~260) does not fit, the summary and the digest stand for it, with the latest request.
    assert!(text(1).chars().count() <= 200 * 4 + 120, "{}", text(1));
    assert!(
        text(1).contains("Latest request (#7): Great, please also add a note about the health check to the testing guide."),
        "{}",
        text(1)
    );
    // The session by its words, and the messages that hold them, the matches marked.
    assert!(
        text(2).contains(session)
            && text(2).contains("session(s) match")
            && text(2).contains("Messages that best match")
            && text(2).contains("**checkout**"),
        "{}",
        text(2)
    );
    assert!(text(3).contains("#3 tool: [action] Bash:"), "{}", text(3));
    assert!(
        text(4).contains(&format!("Row {row}")) && text(4).contains("#1 user:"),
        "{}",
        text(4)
    );
    // "Remembered as ID for project KEY." (the folder the client started the server in).
    let id = text(5)
        .strip_prefix("Remembered as ")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches('.')
        .to_string();
    assert!(text(5).contains(" for project "), "{}", text(5));
    assert!(
        text(6).contains(&id) && text(6).contains("release branches"),
        "{}",
        text(6)
    );
    assert!(text(7).contains("#1"), "{}", text(7));
    assert!(
        text(8).contains("The checkout integration test fails about one run in ten"),
        "{}",
        text(8)
    );
    for (i, says) in [
        (9, "no session 'nope'"),
        (10, "give 64 to 20000"),
        (11, "give exactly one of `row`"),
        (12, "has no message #999"),
        (13, "unknown field `bogus`"),
        (14, "no memory 'no-such-memory'"),
        (18, "give 1 to 50"),
    ] {
        assert_eq!(calls[i]["is_error"], true, "call {i}: {}", text(i));
        assert!(text(i).contains(says), "call {i}: {}", text(i));
    }
    for (i, c) in calls.iter().enumerate().take(18).skip(15) {
        assert_eq!(c["is_error"], false, "call {i}: {}", text(i));
    }
    // One session's messages only, best first, no session list.
    assert!(
        !text(15).contains("session(s) match") && text(15).contains("**health** **check**"),
        "{}",
        text(15)
    );
    // Quotes, NEAR, *, -, OR and a column filter are words: the checkout messages.
    assert!(text(16).contains("**checkout**"), "{}", text(16));
    // The context takes a query (this short session's matching turns are all shown already:
    // pinned or recent; `tests/e2e/serve.rs` checks the turns a longer one finds).
    assert!(text(17).contains("found turns 0"), "{}", text(17));
    // The memory can be forgotten.
    let v = drive(
        &env,
        &py,
        &json!([call("forget", json!({"id": id}))]),
        &["stdio", "--", exe, "mcp"],
    );
    assert_eq!(v["calls"][0]["is_error"], false, "{v}");
}

#[test]
fn over_http_tokens_and_tenants_hold_and_a_foreign_origin_is_refused() {
    let Some(py) = python() else { return };
    let env = extractive();
    let acme = token(&env, "acme", &[]);
    let globex = token(&env, "globex", &[]);
    let srv = Server::start(&env, &[]);
    let addr = srv.addr.as_str();
    let r = post_messages(addr, Some(&acme), "deploy-1", &messages("deploy", 6, false));
    assert!(r.status < 300, "{}", r.body);
    let url = format!("http://{addr}/mcp");
    let plan = json!([
        call("search", json!({"query": "billing"})),
        call("context", json!({"session": "deploy-1"})),
        call(
            "remember",
            json!({"text": "The billing cluster moves on Friday."})
        ),
    ]);
    let v = drive(&env, &py, &plan, &["http", &url, &acme]);
    check_tools(&v);
    let calls = v["calls"].as_array().unwrap();
    for c in calls {
        assert_eq!(c["is_error"], false, "{c}");
    }
    assert!(calls[0]["text"].as_str().unwrap().contains("deploy-1"));
    assert!(
        calls[1]["text"]
            .as_str()
            .unwrap()
            .contains("billing service")
    );
    // Another tenant sees none of it: the session is not found, the memory not recalled.
    let plan = json!([
        call("context", json!({"session": "deploy-1"})),
        call("search", json!({"query": "billing"})),
        call("recall", json!({"query": "billing cluster"})),
    ]);
    let v = drive(&env, &py, &plan, &["http", &url, &globex]);
    let calls = v["calls"].as_array().unwrap();
    assert_eq!(calls[0]["is_error"], true, "{v}");
    assert!(
        calls[0]["text"]
            .as_str()
            .unwrap()
            .contains("no session 'deploy-1'"),
        "{v}"
    );
    assert!(
        calls[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("Nothing matches"),
        "{v}"
    );
    assert!(
        !calls[2]["text"].as_str().unwrap().contains("Friday"),
        "{v}"
    );
    // Without a token: 401. From a web page of another origin: 403.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let accept = ("Accept", "application/json, text/event-stream");
    let json_ct = ("Content-Type", "application/json");
    let r = request_with(addr, "POST", "/mcp", &[json_ct, accept], init.as_bytes());
    assert_eq!(r.status, 401, "{}", r.body);
    let bearer = format!("Bearer {acme}");
    let auth = ("Authorization", bearer.as_str());
    // An authorized initialize, with an Origin or none.
    let initialize = |origin: Option<&str>| {
        let mut h = vec![json_ct, accept, auth];
        h.extend(origin.map(|o| ("Origin", o)));
        request_with(addr, "POST", "/mcp", &h, init.as_bytes())
    };
    let r = initialize(Some("https://evil.example"));
    assert_eq!(r.status, 403, "{}", r.body);
    let r = initialize(None);
    assert_eq!(r.status, 200, "{}", r.body);
    // From this server's own origin (a page it served; the MCP conformance suite's
    // DNS-rebinding scenario sends one): accepted.
    let r = initialize(Some(&format!("http://{addr}")));
    assert_eq!(r.status, 200, "{}", r.body);
    // A body that is not JSON: a JSON-RPC parse error, not a bare 415.
    let bad = request_with(
        addr,
        "POST",
        "/mcp",
        &[json_ct, accept, auth],
        b"not json {",
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    let e: Value = serde_json::from_str(&bad.body).unwrap();
    assert_eq!(
        (e["error"]["code"].as_i64(), e["id"].is_null()),
        (Some(-32700), true),
        "{e}"
    );
    // The session is the tenant's that opened it: another tenant's token cannot use or end
    // it (404); ending it is a 204 (the official SDKs log a 202 as a failed termination), and
    // an unknown or ended one is a 404.
    let id = r
        .headers
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_string())
        })
        .expect("an mcp-session-id header");
    let other = format!("Bearer {globex}");
    let other = ("Authorization", other.as_str());
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let r = request_with(
        addr,
        "POST",
        "/mcp",
        &[json_ct, accept, other, ("Mcp-Session-Id", id.as_str())],
        list.as_bytes(),
    );
    assert_eq!(r.status, 404, "{}", r.body);
    // Ending it: another tenant's token 404, its own 204, then (ended) 404.
    let end = |who: (&str, &str)| {
        request_with(
            addr,
            "DELETE",
            "/mcp",
            &[accept, who, ("Mcp-Session-Id", id.as_str())],
            b"",
        )
        .status
    };
    assert_eq!([end(other), end(auth), end(auth)], [404, 204, 404]);
    drop(srv);
}

/// Over stdio a line that is not JSON gets a JSON-RPC parse error (-32700, id null), and the
/// session goes on: the next request is answered.
#[test]
fn a_line_that_is_not_json_gets_a_parse_error_and_the_session_goes_on() {
    use std::io::{BufRead, BufReader, Write};
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let mut child = env
        .command(&["mcp"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("abridge mcp");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut next = || {
        let mut line = String::new();
        out.read_line(&mut line).expect("a line");
        serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    writeln!(stdin, "this is not json {{").unwrap();
    stdin.flush().unwrap();
    let e = next();
    assert_eq!(e["error"]["code"], -32700, "{e}");
    assert!(e["id"].is_null(), "{e}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    writeln!(stdin, "{init}").unwrap();
    stdin.flush().unwrap();
    let r = next();
    assert_eq!(r["id"], 1, "{r}");
    assert!(r["result"]["serverInfo"]["name"] == "abridge", "{r}");
    drop(stdin);
    let _ = child.wait();
}

/// A fact remembered over MCP that changes replaces the earlier memory: `remember` says so, and
/// `recall` gives the current one first and marks the old one as no longer current.
#[test]
fn a_changed_fact_remembered_over_mcp_is_recalled_current_first() {
    let Some(py) = python() else { return };
    let env = extractive();
    let plan = json!([
        call(
            "remember",
            json!({"text": "The user lives in Porto, by the river Douro."})
        ),
        call("remember", json!({"text": "The user moved to Lyon."})),
        call("recall", json!({"query": "Porto river Douro"})),
        call(
            "remember",
            json!({"text": "x", "replaces": "no-such-memory"})
        ),
    ]);
    let exe = env!("CARGO_BIN_EXE_abridge");
    let v = drive(&env, &py, &plan, &["stdio", "--", exe, "mcp"]);
    let calls = v["calls"].as_array().unwrap();
    let text = |i: usize| calls[i]["text"].as_str().unwrap().to_string();
    assert!(!text(0).contains("replaces"), "{v}");
    assert!(text(1).contains("It replaces "), "{v}");
    let recall = text(2);
    let lyon = recall
        .find("moved to Lyon")
        .unwrap_or_else(|| panic!("{recall}"));
    let porto = recall
        .find("lives in Porto")
        .unwrap_or_else(|| panic!("{recall}"));
    assert!(lyon < porto, "{recall}");
    assert!(
        recall.contains("(no longer current: replaced by "),
        "{recall}"
    );
    assert_eq!(calls[3]["is_error"], true, "{v}");
    assert!(text(3).contains("does not exist"), "{v}");
}

/// A memory the agent remembers over MCP belongs, unless it says otherwise, to the folder the
/// agent started the server in, as the hooks name it: the next session's start there shows
/// it. A project given as a path is named the same way.
#[test]
fn a_memory_the_agent_remembers_is_in_the_next_sessions_start_in_that_folder() {
    let Some(py) = python() else { return };
    let env = extractive();
    let project = env.dir.path().join("work/my_shop.v2");
    std::fs::create_dir_all(&project).unwrap();
    let exe = env!("CARGO_BIN_EXE_abridge");
    let plan = json!([
        call(
            "remember",
            json!({"text": "The staging database is reset every Monday.", "kind": "convention"})
        ),
        call(
            "remember",
            json!({"text": "The billing service deploys on Fridays.", "project": "/srv/billing/"})
        ),
        call(
            "recall",
            json!({"query": "billing deploys", "project": "/srv/billing"})
        ),
        call(
            "recall",
            json!({"query": "staging database", "project": "/srv/billing"})
        ),
    ]);
    let v = drive_in(
        &env,
        &py,
        &plan,
        &["stdio", "--", exe, "mcp"],
        Some(&project),
    );
    let calls = v["calls"].as_array().unwrap();
    let key = abridge_app::hook::project_key(&project.display().to_string());
    let text = |i: usize| calls[i]["text"].as_str().unwrap().to_string();
    assert!(
        text(0).contains(&format!("for project {key}")),
        "{}",
        text(0)
    );
    assert!(text(1).contains("for project -srv-billing"), "{}", text(1));
    assert!(text(2).contains("billing service deploys"), "{}", text(2));
    assert!(!text(3).contains("staging database"), "{}", text(3));
    // The next session in that folder starts with it.
    let r = with_stdin(
        env.command(&["hook"]),
        json!({"session_id": "5f0c2a8e-1111-4222-8333-444455556666",
            "cwd": project, "hook_event_name": "SessionStart", "source": "startup"})
        .to_string()
        .as_bytes(),
    );
    r.assert_ok();
    let ctx = start_context(&r);
    let ctx = ctx.as_str();
    assert!(
        ctx.contains("The staging database is reset every Monday."),
        "{ctx}"
    );
    assert!(!ctx.contains("billing"), "{ctx}");
}
