//! Coding agents: `abridge hook` driven as Claude Code drives it, on the real Claude Code
//! transcripts in ../shared/data/transcripts (skipped, with a note, when absent).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::*;

const REAL: [&str; 3] = [
    "claude_code/obra-episodic-memory/large-conversation.jsonl",
    "claude_code/obra-episodic-memory/long-conversation.jsonl",
    "claude_code/simonw-claude-code-transcripts/sample_session.jsonl",
];

/// Run `abridge hook` with `payload` on stdin; the run and how long it took.
fn hook(env: &Env, args: &[&str], payload: &Value) -> (Run, Duration) {
    let mut all = vec!["hook"];
    all.extend_from_slice(args);
    let started = Instant::now();
    let r = with_stdin(env.command(&all), payload.to_string().as_bytes());
    (r, started.elapsed())
}

fn payload(event: &str, session: &str, transcript: &Path, extra: Value) -> Value {
    let mut p = json!({
        "session_id": session,
        "transcript_path": transcript,
        "cwd": "/project",
        "hook_event_name": event,
    });
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    p
}

/// The session id, and every path the transcript's Edit, Write and MultiEdit calls touched.
fn facts(lines: &[&str]) -> (String, Vec<String>) {
    let mut session = String::new();
    let mut edited: Vec<String> = Vec::new();
    for l in lines {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if session.is_empty()
            && let Some(s) = v["sessionId"].as_str()
        {
            session = s.to_string();
        }
        for b in v["message"]["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_use"
                && matches!(
                    b["name"].as_str(),
                    Some("Edit" | "Write" | "MultiEdit" | "NotebookEdit")
                )
                && let Some(p) = b["input"]["file_path"].as_str()
                && !edited.iter().any(|e| e == p)
            {
                edited.push(p.to_string());
            }
        }
    }
    (session, edited)
}

/// Every stored episode of `session` (through `expand` of each summary row): (id, role, text).
fn episodes(env: &Env, session: &str) -> Vec<(u64, String, String)> {
    let chain = env.chain(session).expect("a summary chain");
    let mut out = Vec::new();
    for r in chain["summaries"].as_array().unwrap() {
        let id = r["id"].as_u64().unwrap().to_string();
        let x = env
            .run(&["expand", session, &id, "--json"])
            .assert_ok()
            .json();
        for e in x["episodes"].as_array().unwrap() {
            out.push((
                e["id"].as_u64().unwrap(),
                e["role"].as_str().unwrap().to_string(),
                e["content"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// The acceptance test of issue #25's hooks: a real session is imported through the hooks in
/// two steps (PreCompact half-way, Stop at the end); then, after a compaction, SessionStart
/// prints a context that holds the pinned rule, the last request verbatim and every file the
/// session edited — within Claude Code's 10,000 characters and the hook's budget.
#[test]
fn after_a_compaction_session_start_restores_the_rule_the_last_request_and_every_edited_file() {
    let server = TestServer::start();
    // In the product's default mode (window) and in eager mode, which folds everything.
    for (rel, default_mode) in REAL.iter().flat_map(|r| [(*r, true), (*r, false)]) {
        let Some(src) = shared(rel) else { return };
        let env = Env::new().with("EXTRACTION_URL", &server.url());
        let env = if default_mode {
            env.with_default_mode()
        } else {
            env
        };
        let text = std::fs::read_to_string(&src).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let (session, edited) = facts(&lines);
        assert!(!session.is_empty(), "{rel}");
        let dir: PathBuf = env.dir.path().join(".claude/projects/-project");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{session}.jsonl"));
        // The first half, then PreCompact: imported, summarized within the budget.
        let half = lines.len() / 2;
        std::fs::write(&file, lines[..half].join("\n") + "\n").unwrap();
        let (r, took) = hook(
            &env,
            &[],
            &payload("PreCompact", &session, &file, json!({"trigger": "auto"})),
        );
        r.assert_ok();
        assert!(r.stdout.trim().is_empty(), "{rel}: {}", r.stdout);
        assert!(took < Duration::from_secs(8), "{rel}: {took:?}");
        // The rest arrives; Stop imports only the new lines.
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        let (r, _) = hook(&env, &[], &payload("Stop", &session, &file, json!({})));
        r.assert_ok();
        let eps = episodes(&env, &session);
        let n = eps.len() as u64;
        if default_mode {
            // Window mode keeps the newest turns verbatim; what the hook's context (2,200
            // tokens) could not carry beside the summary is folded: nothing is left out.
            let v = env
                .run(&[
                    "context",
                    &session,
                    "--budget",
                    "2200",
                    "--pairs",
                    "1",
                    "--refresh-after",
                    "4294967295",
                    "--json",
                ])
                .json();
            assert_eq!(v["omitted"].as_u64(), Some(0), "{rel}: {v:#}");
            assert!(v["tokens"].as_u64().unwrap() <= 2200, "{rel}: {v:#}");
        } else {
            assert_covers(&env.chain(&session).unwrap(), n);
        }
        // The user's rule: pin their first request.
        let (rule_id, _, rule) = eps.iter().find(|e| e.1 == "user").cloned().unwrap();
        env.run(&["pin", &session, &rule_id.to_string()])
            .assert_ok();
        let last = eps.iter().rev().find(|e| e.1 == "user").unwrap().2.clone();
        // Claude Code compacts; the next SessionStart restores what matters.
        let (r, took) = hook(
            &env,
            &[],
            &payload(
                "SessionStart",
                &session,
                &file,
                json!({"source": "compact"}),
            ),
        );
        r.assert_ok();
        assert!(took < Duration::from_secs(8), "{rel}: {took:?}");
        let out: Value = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("{rel}: {e}: {}", r.stdout));
        assert_eq!(out["hookSpecificOutput"]["hookEventName"], "SessionStart");
        let ctx = out["hookSpecificOutput"]["additionalContext"]
            .as_str()
            .unwrap();
        assert!(ctx.chars().count() <= 10_000, "{rel}: {}", ctx.len());
        assert!(
            ctx.contains(rule.trim()),
            "{rel}: the pinned rule is missing:\n{ctx}"
        );
        // The last request as the digest keeps it: padding made one space, a pasted log as
        // its first lines and a count; so its opening words, in order.
        let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        let opening: String = words(&last).chars().take(200).collect();
        assert!(
            words(ctx).contains(&opening),
            "{rel}: the last request is missing ({} chars):\n{ctx}",
            last.len()
        );
        for p in &edited {
            assert!(
                abridge_app::hook::names_file(ctx, p),
                "{rel}: {p} is missing:\n{ctx}"
            );
        }
        eprintln!(
            "{rel} ({}): {} episodes, {} edited paths, context {} chars",
            if default_mode {
                "default mode"
            } else {
                "eager"
            },
            n,
            edited.len(),
            ctx.chars().count()
        );
    }
}

#[test]
fn a_hook_never_fails_the_agents_turn_and_keeps_to_its_budget() {
    let server = TestServer::start();
    let env = Env::new().with("EXTRACTION_URL", &server.url());
    // An unusable payload: exit 1 (a non-blocking hook error; never 2, which blocks a
    // compaction), a message that says what is wrong, nothing on stdout.
    let mut child = env
        .command(&["hook"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"not json").unwrap();
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("not the JSON object a hook receives"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.is_empty());
    // A transcript that does not exist yet, an event abridge does not act on: exit 0, quiet.
    let missing = env.dir.path().join("nope.jsonl");
    for event in ["SessionStart", "Stop", "Notification"] {
        let (r, _) = hook(&env, &[], &payload(event, "s-1", &missing, json!({})));
        r.assert_ok();
        assert!(r.stdout.trim().is_empty(), "{event}: {}", r.stdout);
    }
    // A slow model: the hook returns within its budget, exit 0; the work stays queued and
    // the next hook (with a model that answers) finishes it.
    let file = env.dir.path().join("slow.jsonl");
    let mut text = String::new();
    for i in 0..40 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        text.push_str(
            &json!({"type": role, "uuid": format!("u{i}"), "sessionId": "slow-1",
                "message": {"role": role, "content": format!("Message {i} about the release plan and its risks.")}})
            .to_string(),
        );
        text.push('\n');
    }
    std::fs::write(&file, &text).unwrap();
    server.set_delay(Duration::from_secs(30));
    let (r, took) = hook(
        &env,
        &["--budget-secs", "2"],
        &payload("PreCompact", "slow-1", &file, json!({"trigger": "auto"})),
    );
    r.assert_ok();
    assert!(took < Duration::from_secs(6), "the hook took {took:?}");
    let chain = env.chain("slow-1").unwrap();
    assert_eq!(chain["episodes"], 40);
    assert!(chain["summaries"].as_array().unwrap().is_empty());
    server.set_delay(Duration::ZERO);
    let (r, _) = hook(&env, &[], &payload("Stop", "slow-1", &file, json!({})));
    r.assert_ok();
    assert_covers(&env.chain("slow-1").unwrap(), 40);
    // Errors went to the log, not to the agent.
    let log = std::fs::read_to_string(env.dir.path().join("hook.log")).unwrap_or_default();
    assert!(log.contains("not the JSON object"), "{log}");
    // A Stop whose transcript is missing says so in the log (a start may come first).
    assert!(
        log.contains(&format!(
            "Stop: the transcript {} does not exist",
            missing.display()
        )),
        "{log}"
    );
    assert!(!log.contains("SessionStart: the transcript"), "{log}");
}

/// A last session too short to have a summary opens the next one with what it said, and a
/// session without a title is named by its id once.
#[test]
fn a_short_last_session_opens_the_next_with_what_it_said() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let cwd = "/work/short-project";
    let file = env.dir.path().join("short-1.jsonl");
    let turns = [
        (
            "user",
            "Rename the --fast flag to --quick in src/cli.rs and keep --fast as an alias.",
        ),
        (
            "assistant",
            "Renamed it: --quick is the flag now, and --fast still works as an alias.",
        ),
        (
            "user",
            "Good. Also note in CHANGELOG.md that --fast is deprecated.",
        ),
        (
            "assistant",
            "Added a line to CHANGELOG.md saying --fast is deprecated in favour of --quick.",
        ),
    ];
    let mut text = String::new();
    for (i, (role, content)) in turns.iter().enumerate() {
        text.push_str(
            &json!({"type": role, "uuid": format!("u{i}"), "sessionId": "short-1",
                "message": {"role": role, "content": content}})
            .to_string(),
        );
        text.push('\n');
    }
    std::fs::write(&file, &text).unwrap();
    let mut p = payload("Stop", "short-1", &file, json!({}));
    p["cwd"] = json!(cwd);
    hook(&env, &[], &p).0.assert_ok();
    let start = json!({"session_id": "5f0c2a8e-1111-4222-8333-444455556666", "cwd": cwd,
        "hook_event_name": "SessionStart", "source": "startup"});
    let (r, _) = hook(&env, &[], &start);
    r.assert_ok();
    let ctx = start_context(&r);
    let ctx = ctx.as_str();
    assert!(
        ctx.contains("The last session here (session short-1, "),
        "{ctx}"
    );
    assert_eq!(ctx.matches("short-1").count(), 1, "{ctx}");
    assert!(ctx.contains("no summary yet; what they said:"), "{ctx}");
    for (_, said) in turns {
        assert!(ctx.contains(said), "{said:?} in {ctx}");
    }
}

#[test]
fn setup_merges_into_the_agents_settings_keeps_a_backup_is_idempotent_and_removes_cleanly() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let home = env.dir.path();
    let settings = home.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let mine = r#"{"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}"#;
    std::fs::write(&settings, mine).unwrap();
    // A dry run shows the diff and changes nothing.
    let r = env.run(&["setup", "claude-code", "--dry-run"]);
    r.assert_ok();
    assert!(
        r.stdout.contains("+++ ") && r.stdout.contains("hook"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("would change"), "{}", r.stdout);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), mine);
    assert!(!home.join(".claude.json").exists());
    // Applied: every other setting kept, a backup, the MCP server registered.
    let r = env.run(&["setup", "claude-code"]);
    r.assert_ok();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(v["model"], "opus");
    assert_eq!(v["hooks"]["Stop"][0]["hooks"][0]["command"], "say done");
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/settings.json.abridge-backup")).unwrap(),
        mine
    );
    let mcp: Value =
        serde_json::from_str(&std::fs::read_to_string(home.join(".claude.json")).unwrap()).unwrap();
    let args = mcp["mcpServers"]["abridge"]["args"].as_array().unwrap();
    assert_eq!(args.last().unwrap(), "mcp");
    // Idempotent.
    let r = env.run(&["setup", "claude-code"]);
    r.assert_ok();
    assert_eq!(r.stdout.matches("unchanged").count(), 2, "{}", r.stdout);
    // The installed command runs, as Claude Code runs it (through a shell).
    let command = v["hooks"]["SessionStart"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .to_string();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo '{{\"hook_event_name\":\"Notification\"}}' | {command}"
        ))
        .env("HOME", home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Removed: the settings are what they were, "model" still first; the backup is still
    // the user's original (not the file abridge had changed).
    env.run(&["setup", "claude-code", "--remove"]).assert_ok();
    let text = std::fs::read_to_string(&settings).unwrap();
    let back: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back, serde_json::from_str::<Value>(mine).unwrap());
    assert!(
        text.find("\"model\"").unwrap() < text.find("\"hooks\"").unwrap(),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/settings.json.abridge-backup")).unwrap(),
        mine
    );
    let mcp: Value =
        serde_json::from_str(&std::fs::read_to_string(home.join(".claude.json")).unwrap()).unwrap();
    assert!(mcp.get("mcpServers").is_none(), "{mcp}");
    // Codex: config.toml keeps its comments.
    let codex = home.join("codex-home");
    std::fs::create_dir_all(&codex).unwrap();
    std::fs::write(codex.join("config.toml"), "# mine\nmodel = \"o4\"\n").unwrap();
    let env = env.with("CODEX_HOME", &codex.display().to_string());
    env.run(&["setup", "codex"]).assert_ok();
    let t = std::fs::read_to_string(codex.join("config.toml")).unwrap();
    assert!(t.starts_with("# mine\nmodel = \"o4\"\n"), "{t}");
    assert!(t.contains("[mcp_servers.abridge]"), "{t}");
    env.run(&["setup", "codex", "--remove"]).assert_ok();
    assert_eq!(
        std::fs::read_to_string(codex.join("config.toml")).unwrap(),
        "# mine\nmodel = \"o4\"\n"
    );
}

/// Issue #25's fallback-upgrade test on a real session: summarized without a model first,
/// then with one — the offline rows are rewritten in place (same ids and ranges), and a second
/// run with the model calls it no more.
#[test]
fn a_real_session_summarized_offline_is_rewritten_by_the_model_when_it_comes() {
    let Some(src) = shared("claude_code/obra-episodic-memory/long-conversation.jsonl") else {
        return;
    };
    let server = TestServer::start();
    let offline = Env::new().with("EXTRACTION_URL", &closed_port_url());
    let r = offline.run(&["summarize", &src, "--json"]);
    r.assert_ok();
    let session = r.json()["session"].as_str().unwrap().to_string();
    let spans = |env: &Env| row_spans(env, &session);
    let before = spans(&offline);
    assert!(before.iter().all(|r| r.3 == "extractive"), "{before:?}");
    let first = offline.chain(&session).unwrap()["summaries"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        first.starts_with("Session digest"),
        "the offline summary of a coding session is its digest: {first}"
    );
    let mut online = Env::new().with("EXTRACTION_URL", &server.url());
    online.dir = offline.dir;
    online.run(&["refresh", &session[..8]]).assert_ok();
    let after = spans(&online);
    assert_eq!(
        after.iter().map(|r| (r.0, r.1, r.2)).collect::<Vec<_>>(),
        before.iter().map(|r| (r.0, r.1, r.2)).collect::<Vec<_>>()
    );
    assert!(after.iter().all(|r| r.3 == "qwen2.5:3b"), "{after:?}");
    let calls = server.generations().len();
    online.run(&["summarize", &src]).assert_ok();
    assert_eq!(server.generations().len(), calls, "nothing left to rewrite");
}

/// Titles and project folders are display names: shown by `status`, `summaries` and the API,
/// found by search, never part of the id.
#[test]
fn a_title_and_a_project_folder_are_display_names_not_ids() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let dir = env.dir.path().join("projects/-home-me-shop");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("0a1b2c3d-0000-4000-8000-000000000001.jsonl");
    std::fs::copy(fixture("claude-code.jsonl"), &file).unwrap();
    env.run(&["summarize", &file.display().to_string()])
        .assert_ok();
    let session = "0a1b2c3d-0000-4000-8000-000000000001";
    let r = env.run(&["status"]);
    r.assert_ok();
    assert!(
        r.stdout
            .contains("\"Flaky integration test\" in -home-me-shop"),
        "{}",
        r.stdout
    );
    let v = env
        .run(&["summaries", session, "--json"])
        .assert_ok()
        .json();
    assert_eq!(v["title"], "Flaky integration test");
    assert_eq!(v["project"], "-home-me-shop");
    let st = env.run(&["status", "0a1b", "--json"]).assert_ok().json();
    assert_eq!(st[0]["session"], session);
    assert_eq!(st[0]["title"], "Flaky integration test");
}

/// Codex: `abridge setup codex` installs the hooks in config.toml as Codex reads them, and the
/// installed command, run through a shell with Codex's payloads, imports the rollout (Stop,
/// PreCompact) and, after a compaction, gives back the last request and every patched file.
#[test]
fn codex_hooks_import_the_rollout_and_restore_the_session_after_a_compaction() {
    let server = TestServer::start();
    let env = Env::new().with("EXTRACTION_URL", &server.url());
    let codex = env.dir.path().join("codex-home");
    let env = env.with("CODEX_HOME", &codex.display().to_string());
    env.run(&["setup", "codex"]).assert_ok();
    let config: toml::Value =
        toml::from_str(&std::fs::read_to_string(codex.join("config.toml")).unwrap()).unwrap();
    let command = |event: &str| {
        let groups = config["hooks"][event].as_array().unwrap();
        assert_eq!(groups.len(), 1, "{event}");
        groups[0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        config["hooks"]["SessionStart"][0]["matcher"].as_str(),
        Some("startup|resume|clear|compact")
    );
    // Codex runs a hook command through the user's shell, the payload on stdin.
    let run = |event: &str, payload: &Value| {
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(command(event))
            .env("HOME", env.dir.path())
            // As in every other suite, the eager trigger (the harness's setting).
            .env("ABRIDGE_MODE", "eager")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(payload.to_string().as_bytes())
            .unwrap();
        let r = Run::from(child.wait_with_output().unwrap());
        r.assert_ok();
        r
    };
    let thread = "5f0c2a8e-1111-4222-8333-444455556666";
    let dir = codex.join("sessions/2026/03/02");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("rollout-2026-03-02T10-00-00-{thread}.jsonl"));
    let fixture = std::fs::read_to_string(fixture("codex-rollout.jsonl")).unwrap();
    let lines: Vec<&str> = fixture.lines().collect();
    let codex_payload = |event: &str, transcript: Value, extra: Value| {
        let mut p = json!({
            "session_id": thread, "turn_id": "turn-1", "transcript_path": transcript,
            "cwd": "/home/dev/shop", "hook_event_name": event, "model": "gpt-5-codex",
            "permission_mode": "default",
        });
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    // A new session whose rollout does not exist yet: nothing to say, exit 0.
    let r = run(
        "SessionStart",
        &codex_payload("SessionStart", Value::Null, json!({"source": "startup"})),
    );
    assert!(r.stdout.trim().is_empty(), "{}", r.stdout);
    // The first turns, then Stop at the end of a turn: imported.
    let cut = lines
        .iter()
        .position(|l| l.contains("Keep the old behaviour"))
        .unwrap();
    std::fs::write(&file, lines[..cut].join("\n") + "\n").unwrap();
    run(
        "Stop",
        &codex_payload(
            "Stop",
            json!(file),
            json!({"stop_hook_active": false, "last_assistant_message": null}),
        ),
    );
    let first = env.chain(thread).expect("the rollout was imported");
    let before = first["episodes"].as_u64().unwrap();
    assert!(before > 0);
    // The rest, then PreCompact: only the new lines come in.
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    run(
        "PreCompact",
        &codex_payload("PreCompact", json!(file), json!({"trigger": "auto"})),
    );
    let chain = env.chain(thread).unwrap();
    let n = chain["episodes"].as_u64().unwrap();
    assert!(n > before, "{n} <= {before}");
    assert_covers(&chain, n);
    // After the compaction, SessionStart gives the model what the compaction dropped.
    let r = run(
        "SessionStart",
        &codex_payload("SessionStart", json!(file), json!({"source": "compact"})),
    );
    let ctx = start_context(&r);
    let ctx = ctx.as_str();
    assert!(
        ctx.contains("Keep the old behaviour for gift cards."),
        "{ctx}"
    );
    assert!(ctx.contains("off by one cent"), "{ctx}");
    for p in ["src/cart/total.ts", "src/cart/round.ts"] {
        assert!(abridge_app::hook::names_file(ctx, p), "{p}:\n{ctx}");
    }
    assert!(ctx.contains("npm test -- cart"), "{ctx}");
    // The rollout was imported once, under its thread id: no second session for the file.
    let st = env.run(&["status", "--json"]).assert_ok().json();
    let all = st.as_array().unwrap();
    assert_eq!(all.len(), 1, "{st}");
    assert_eq!(all[0]["session"], thread);
}

/// A fresh session (`SessionStart` with `source: startup`) in a project abridge knows starts
/// with the rules pinned to the project, the last session's summary and digest (its last
/// request, the files it edited), the earlier sessions a line each and the memories kept for
/// the project; in a project abridge does not know it gets nothing.
#[test]
fn a_fresh_session_in_a_known_project_starts_with_what_the_project_knows() {
    let Some(src) = shared("claude_code/obra-episodic-memory/large-conversation.jsonl") else {
        return;
    };
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let cwd = "/work/my_shop.v2";
    // Claude Code's folder for that cwd: every non-alphanumeric character a dash.
    let dir = env.dir.path().join(".claude/projects/-work-my-shop-v2");
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(&src).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (session, edited) = facts(&lines);
    let file = dir.join(format!("{session}.jsonl"));
    std::fs::write(&file, &text).unwrap();
    let mut p = payload("Stop", &session, &file, json!({}));
    p["cwd"] = json!(cwd);
    hook(&env, &[], &p).0.assert_ok();
    // The user's rule, pinned to the project; a fact remembered for it.
    let eps = episodes(&env, &session);
    let (rule_id, _, rule) = eps.iter().find(|e| e.1 == "user").cloned().unwrap();
    let r = env.run(&["pin", &session, &rule_id.to_string(), "--project"]);
    r.assert_ok();
    assert!(
        r.stdout.contains("project -work-my-shop-v2: 1 pinned"),
        "{}",
        r.stdout
    );
    env.run(&[
        "memory",
        "add",
        "The staging database is reset every Monday",
        "--user",
        "agent",
        "--project=-work-my-shop-v2",
    ])
    .assert_ok();
    // A new session starts there.
    let start = json!({"session_id": "5f0c2a8e-1111-4222-8333-444455556666",
        "transcript_path": dir.join("5f0c2a8e-1111-4222-8333-444455556666.jsonl"),
        "cwd": cwd, "hook_event_name": "SessionStart", "source": "startup"});
    let (r, _) = hook(&env, &[], &start);
    r.assert_ok();
    let ctx = start_context(&r);
    let ctx = ctx.as_str();
    assert!(ctx.chars().count() <= 10_000);
    assert!(ctx.contains("Pinned for this project:"), "{ctx}");
    let head: String = rule
        .split_whitespace()
        .take(6)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        ctx.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .contains(&head),
        "the pinned rule {head:?} in {ctx}"
    );
    assert!(ctx.contains("The last session here"), "{ctx}");
    assert!(ctx.contains(&session), "{ctx}");
    assert!(ctx.contains("Latest request"), "{ctx}");
    let named = edited
        .iter()
        .filter(|f| abridge_app::hook::names_file(ctx, f))
        .count();
    assert!(named > 0, "no edited file of {edited:?} in {ctx}");
    assert!(
        ctx.contains("The staging database is reset every Monday"),
        "{ctx}"
    );
    // A project abridge does not know: nothing.
    let mut other = start.clone();
    other["cwd"] = json!("/somewhere/else");
    let (r, _) = hook(&env, &[], &other);
    r.assert_ok();
    assert!(r.stdout.trim().is_empty(), "{}", r.stdout);
}

/// Issue #54: of the identifiers shown at a start (after a compaction, and a next session's),
/// under 5 % are noise — an agent's tool names, timings, ordinary words in capitals, a path
/// shown twice — on every real transcript (`abridge bench agents`, whose definition it is).
#[test]
fn the_identifiers_a_start_shows_are_under_five_percent_noise() {
    let Some(dir) = shared("claude_code") else {
        return;
    };
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let r = env.run(&["bench", "agents", &dir, "--runs", "1"]);
    r.assert_ok();
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("noise: "))
        .unwrap_or_else(|| panic!("no noise line in {}", r.stdout));
    let (counts, _) = line["noise: ".len()..].split_once(" = ").unwrap();
    let (noisy, shown) = counts.split_once('/').unwrap();
    let (noisy, shown): (f64, f64) = (noisy.parse().unwrap(), shown.parse().unwrap());
    assert!(shown >= 100.0, "{}", r.stdout);
    assert!(noisy / shown < 0.05, "{}", r.stdout);
}

/// The Claude Code plugin's folder (`host/claude-plugin`) and the repository's root (its
/// marketplace).
fn plugin_dir() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    (root.join("host/claude-plugin"), root)
}

/// Run a plugin hook's command line as Claude Code runs it (`sh -c`, the plugin's root in
/// CLAUDE_PLUGIN_ROOT), with `path` as the PATH and `payload` on stdin.
fn plugin_hook(env: &Env, root: &Path, command: &str, path: &str, payload: &Value) -> Run {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", command])
        .env("CLAUDE_PLUGIN_ROOT", root)
        .env("PATH", path)
        .env("HOME", env.dir.path())
        .env("ABRIDGE_DB", env.db())
        .env("ABRIDGE_BACKEND", "extractive")
        .env("ABRIDGE_CACHE_DIR", cache_dir());
    with_stdin(cmd, payload.to_string().as_bytes())
}

/// The plugin's hooks are the ones `abridge setup claude-code` writes (the same events and
/// matchers), its manifests name this version, and its hook command runs the abridge on the
/// PATH — imports a transcript, hands the context back after a compaction — or says how to
/// install abridge when there is none.
fn check_plugin_runs(env: &Env, root: &Path) {
    let hooks: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("hooks/hooks.json")).unwrap())
            .unwrap();
    let events: Vec<(String, Option<String>)> = hooks["hooks"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v[0]["matcher"].as_str().map(String::from)))
        .collect();
    let want: Vec<(String, Option<String>)> = abridge_app::setup::CLAUDE_EVENTS
        .iter()
        .map(|(e, m)| (e.to_string(), m.map(String::from)))
        .collect();
    let mut sorted = events.clone();
    sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(sorted, want_sorted);
    let command = hooks["hooks"]["Stop"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .to_string();
    let mcp: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(".mcp.json")).unwrap()).unwrap();
    assert_eq!(
        mcp["mcpServers"]["abridge"]["command"],
        "${CLAUDE_PLUGIN_ROOT}/bin/abridge-run"
    );
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(".claude-plugin/plugin.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["version"], env!("CARGO_PKG_VERSION"));
    // The abridge on the PATH (this build's folder) runs the hooks.
    let bin = Path::new(env!("CARGO_BIN_EXE_abridge")).parent().unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let transcript = fixture("claude-code.jsonl");
    let session = "0a1b2c3d-0000-4000-8000-000000000001";
    let stop = payload("Stop", session, Path::new(&transcript), json!({}));
    plugin_hook(env, root, &command, &path, &stop).assert_ok();
    let start = payload(
        "SessionStart",
        session,
        Path::new(&transcript),
        json!({"source": "compact"}),
    );
    let r = plugin_hook(env, root, &command, &path, &start);
    r.assert_ok();
    let ctx = start_context(&r);
    assert!(ctx.contains("what this session has done so far"), "{ctx}");
    // No abridge anywhere: exit 1 (a hook error Claude Code shows and goes past) saying how
    // to install it.
    let r = plugin_hook(env, root, &command, "/usr/bin:/bin", &stop);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("cargo install --path host"),
        "{}",
        r.stderr
    );
}

#[test]
fn the_claude_code_plugin_runs_the_hooks_setup_would_write() {
    let env = Env::new();
    let (plugin, _) = plugin_dir();
    check_plugin_runs(&env, &plugin);
}

/// Claude Code's own `claude` (npm `@anthropic-ai/claude-code`, pinned in `.ci/run`), or
/// `None` with a note (a failure when ABRIDGE_REQUIRE_CLAUDE is set).
fn claude() -> Option<PathBuf> {
    locate(
        "ABRIDGE_CLAUDE",
        ".cache/abridge/claude-code/node_modules/.bin/claude",
        "ABRIDGE_REQUIRE_CLAUDE",
        "Claude Code, for the plugin check",
        "npm install --prefix ~/.cache/abridge/claude-code @anthropic-ai/claude-code",
        |p| p.is_file(),
    )
}

/// Claude Code's own validation passes the plugin and the marketplace with `--strict`;
/// adding the marketplace and installing the plugin (offline, no login) enables it, and the
/// installed copy's hooks run.
#[test]
fn claude_code_validates_and_installs_the_plugin_from_the_marketplace() {
    let Some(claude) = claude() else { return };
    let env = Env::new();
    let (plugin, root) = plugin_dir();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&claude)
            .args(args)
            .current_dir(env.dir.path())
            .env("HOME", env.dir.path())
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env_remove("ANTHROPIC_API_KEY")
            .output()
            .expect("running claude");
        let r = Run::from(out);
        assert_eq!(r.code, 0, "claude {args:?}: {}\n{}", r.stdout, r.stderr);
        r
    };
    let r = run(&[
        "plugin",
        "validate",
        "--strict",
        &plugin.display().to_string(),
    ]);
    assert!(r.stdout.contains("Validation passed"), "{}", r.stdout);
    assert!(r.stdout.contains("hooks: SessionStart"), "{}", r.stdout);
    assert!(r.stdout.contains("mcpServers: abridge"), "{}", r.stdout);
    let r = run(&[
        "plugin",
        "validate",
        "--strict",
        &root.display().to_string(),
    ]);
    assert!(r.stdout.contains("marketplace"), "{}", r.stdout);
    run(&["plugin", "marketplace", "add", &root.display().to_string()]);
    run(&["plugin", "install", "abridge@abridge"]);
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(env.dir.path().join(".claude/settings.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        settings["enabledPlugins"]["abridge@abridge"], true,
        "{settings}"
    );
    let installed = env
        .dir
        .path()
        .join(".claude/plugins/cache/abridge/abridge")
        .join(env!("CARGO_PKG_VERSION"));
    check_plugin_runs(&env, &installed);
}
