//! abridge inside the agent hosts people run: Hermes Agent (PyPI `hermes-agent`, pinned in
//! `.ci/run`) with abridge as its memory provider, driven through Hermes' own one-shot turn
//! against the project's test model server (OpenAI-compatible, on loopback). Skipped with a
//! note where the host is not installed, unless ABRIDGE_REQUIRE_HERMES is set.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::harness::*;

/// Hermes' `hermes` command, in a virtualenv that also has abridge-memory, or `None` (and a
/// note, or a failure when required).
fn hermes() -> Option<PathBuf> {
    locate(
        "ABRIDGE_HERMES",
        ".cache/abridge/hermes-venv/bin/hermes",
        "ABRIDGE_REQUIRE_HERMES",
        "Hermes Agent with abridge-memory beside it",
        "python3 -m venv ~/.cache/abridge/hermes-venv && ~/.cache/abridge/hermes-venv/bin/pip install hermes-agent==0.19.0 -e python",
        |h| {
            imports(
                &h.with_file_name("python"),
                "abridge_memory.hermes, agent.memory_provider",
            )
        },
    )
}

/// The chat requests the model server received, in order.
fn chats(server: &TestServer) -> Vec<Value> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.body)
        .collect()
}

/// The text of a chat message (a string, or a list of text parts).
fn text_of(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Installed with the package's own command and selected in Hermes' config, abridge is
/// Hermes' memory provider: before a turn the memory abridge recalls for the user's message
/// reaches the model in Hermes' `<memory-context>` fence, the system prompt says what the
/// provider offers, and after the turn the exchange is stored in abridge's session of it; over
/// the turns of one conversation, abridge's summary of the earlier ones reaches the model.
#[test]
fn hermes_agent_runs_its_turns_with_abridge_as_its_memory_provider() {
    let Some(hermes) = hermes() else { return };
    let python = hermes.with_file_name("python");
    let server = TestServer::start_with(abridge_test_llm::Options {
        // Hermes' system prompt (its tools and instructions) is longer than the default.
        default_num_ctx: 65_536,
        ..Default::default()
    });
    let env = Env::new();
    let home = env.dir.path().join("hermes");
    let r = Command::new(&python)
        .args(["-m", "abridge_memory.hermes", "install", "--hermes-home"])
        .arg(&home)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(home.join("plugins/abridge/__init__.py").is_file());
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  provider: custom\n  base_url: {}/v1\n  default: qwen2.5:3b\n  api_key: local\nmemory:\n  provider: abridge\n",
            server.url()
        ),
    )
    .unwrap();
    let exe = env!("CARGO_BIN_EXE_abridge");
    std::fs::write(
        home.join("abridge.json"),
        serde_json::json!({"binary": exe, "model_url": server.url()}).to_string(),
    )
    .unwrap();
    // A fact remembered earlier, in the database the provider uses.
    let db = home.join("abridge/abridge.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let r = Command::new(exe)
        .arg("--db")
        .arg(&db)
        .args([
            "memory",
            "add",
            "The staging database is reset every Monday at 06:00.",
            "--user",
            "hermes",
        ])
        .env("ABRIDGE_BACKEND", "extractive")
        .env("ABRIDGE_CACHE_DIR", cache_dir())
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let run = |args: &[&str]| {
        let out = Command::new(&hermes)
            .args(args)
            .current_dir(env.dir.path())
            .env("HERMES_HOME", &home)
            .env("HOME", env.dir.path())
            .env("ABRIDGE_CACHE_DIR", cache_dir())
            .env_remove("OPENAI_API_KEY")
            .output()
            .expect("running hermes");
        let r = Run::from(out);
        assert_eq!(r.code, 0, "hermes {args:?}: {}\n{}", r.stdout, r.stderr);
        r
    };
    let status = run(&["memory", "status"]);
    assert!(
        status.stdout.contains("Provider:  abridge"),
        "{}",
        status.stdout
    );
    run(&["-z", "When is the staging database reset?"]);
    let sent = chats(&server);
    assert!(!sent.is_empty(), "Hermes called no model");
    let first = &sent[0]["messages"];
    let messages = first.as_array().unwrap();
    let user = text_of(messages.last().unwrap());
    assert!(
        user.starts_with("When is the staging database reset?"),
        "{user}"
    );
    assert!(user.contains("<memory-context>"), "{user}");
    assert!(
        user.contains("The staging database is reset every Monday at 06:00."),
        "{user}"
    );
    let system = text_of(&messages[0]);
    assert!(
        system.contains("abridge keeps a bounded summary"),
        "{system}"
    );
    // The exchange is in abridge's session of this Hermes session.
    let sessions = || -> Vec<Value> {
        let r = Command::new(exe)
            .arg("--db")
            .arg(&db)
            .args(["status", "--json"])
            .env("ABRIDGE_BACKEND", "extractive")
            .env("ABRIDGE_CACHE_DIR", cache_dir())
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&r.stdout).expect("status --json");
        v.as_array()
            .cloned()
            .unwrap_or_else(|| v["sessions"].as_array().cloned().unwrap_or_default())
    };
    let sessions_now = sessions();
    let hermes_session = sessions_now
        .iter()
        .find(|s| s["id"].as_str().is_some_and(|i| i.starts_with("hermes-")))
        .unwrap_or_else(|| panic!("no hermes session in {sessions_now:?}"));
    assert_eq!(hermes_session["episodes"], 2, "{hermes_session}");

    // Turns of one conversation through Hermes' chat loop (`chat -q`, then `--resume`): each
    // exchange is stored, abridge folds what leaves its recent window, and its summary of
    // the earlier turns reaches the model in the fence before a later turn.
    let turn = |i: usize| {
        let steps: Vec<String> = (0..60)
            .map(|k| format!("step {k} of release {i}: check the build and the changelog,"))
            .collect();
        format!(
            "Turn {i}: the code word of release {i} is zephyr-{i}. {}",
            steps.join(" ")
        )
    };
    let first = run(&["chat", "-Q", "-q", &turn(1)]);
    // (Hermes says the session's id as it ends, on stdout or stderr.)
    let said = format!("{}\n{}", first.stdout, first.stderr);
    let id = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("session_id: "))
        .unwrap_or_else(|| panic!("hermes chat said no session_id: {said}"))
        .trim()
        .to_string();
    let turns = 7;
    for i in 2..=turns {
        run(&["chat", "-Q", "--resume", &id, "-q", &turn(i)]);
    }
    let later: Vec<String> = chats(&server)
        .iter()
        .filter_map(|c| c["messages"].as_array().and_then(|m| m.last()).map(text_of))
        .filter(|u| u.starts_with("Turn "))
        .collect();
    assert_eq!(later.len(), turns, "one model call per turn");
    assert!(
        later.iter().any(|u| u.contains("<memory-context>")
            && u.contains("[abridge] Summary of the earlier conversation")),
        "abridge's summary reached the model in none of {turns} turns"
    );
    let sessions_now = sessions();
    let chat = sessions_now
        .iter()
        .find(|s| s["id"] == format!("hermes-{id}").as_str())
        .unwrap_or_else(|| panic!("no abridge session for Hermes' {id} in {sessions_now:?}"));
    assert_eq!(chat["episodes"], 2 * turns as u64, "{chat}");
    assert!(chat["covered"].as_u64().unwrap_or(0) > 0, "{chat}");
}
