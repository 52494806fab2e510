//! What a newcomer trips on (issue #54 §5): each item, as the user meets it.

use std::path::Path;

use crate::harness::*;

fn line(role: &str, content: &str) -> String {
    format!(
        "{}\n",
        serde_json::json!({"role": role, "content": content})
    )
}

/// `abridge context … > prompt.txt` takes the messages alone: what they cost and cover goes
/// to stderr (none with `-q`); the notes say "1 episode", not "1 episodes".
#[test]
fn context_prints_the_messages_on_stdout_and_its_figures_on_stderr() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let r = env.run_stdin(
        &["ingest", "--session", "room"],
        line("user", "Book the small room for Thursday at 10.").as_bytes(),
    );
    r.assert_ok();
    assert!(
        r.stderr.contains("1 episode appended, 0 summary passes"),
        "{}",
        r.stderr
    );
    let r = env.run(&["context", "room"]);
    r.assert_ok();
    assert!(
        r.stdout
            .contains("[user]\nBook the small room for Thursday at 10."),
        "{}",
        r.stdout
    );
    for figure in ["% saved", "budget ", "stable until", "covers episodes"] {
        assert!(
            !r.stdout.contains(figure),
            "{figure} on stdout: {}",
            r.stdout
        );
        assert!(
            r.stderr.contains(figure),
            "{figure} not on stderr: {}",
            r.stderr
        );
    }
    // One episode is one, in every figure (`abridge status` and `summaries` below too).
    assert!(
        r.stderr.contains("for the full history of 1 episode:"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("1 episodes"), "{}", r.stderr);
    let r = env.run(&["-q", "context", "room"]);
    r.assert_ok();
    assert!(!r.stderr.contains("% saved"), "{}", r.stderr);
    // Why a session waits, in plain words.
    let r = env.run(&["status"]);
    r.assert_ok();
    assert!(!r.stdout.contains("folding from"), "{}", r.stdout);
    assert!(!r.stdout.contains("1 episodes"), "{}", r.stdout);
    let r = env.run(&["summaries", "room"]);
    r.assert_ok();
    assert!(
        r.stdout.contains("session room: 1 episode,"),
        "{}",
        r.stdout
    );
}

/// The master-key warning is said once for a database, not on every write.
#[test]
fn the_unencrypted_warning_is_said_once_per_database() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let add = |text: &str| {
        let r = env.run(&["memory", "add", text, "--user", "alice"]);
        r.assert_ok();
        r.stderr
    };
    let first = add("Alice prefers the dark editor theme.");
    assert!(first.contains("no master key is set"), "{first}");
    let second = add("Alice deploys on Fridays.");
    assert!(!second.contains("no master key"), "{second}");
}

/// The container build context leaves out build output and installed packages; Docker's
/// name for the file is the same file.
#[test]
fn the_container_build_context_leaves_out_build_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(".containerignore")).unwrap();
    let rules: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for wanted in ["target/", "**/node_modules/", "js/dist/", "*.db"] {
        assert!(
            rules.contains(&wanted),
            "{wanted} is not in .containerignore"
        );
    }
    // Nothing the source build reads is left out.
    for kept in [
        "Cargo.toml",
        "Cargo.lock",
        "guest/",
        "host/",
        "wit/",
        "tests/",
        "js/src/",
    ] {
        assert!(
            !rules
                .iter()
                .any(|r| r.trim_end_matches('/') == kept.trim_end_matches('/')),
            "{kept} is left out of the build context"
        );
    }
    assert_eq!(
        std::fs::read_link(root.join(".dockerignore")).unwrap(),
        Path::new(".containerignore")
    );
    // The model on the host: Podman's name is the image's default; the docs say Docker's.
    let serve = std::fs::read_to_string(root.join("docs/serve.md")).unwrap();
    assert!(
        serve.contains("--add-host=host.docker.internal:host-gateway -e EXTRACTION_URL=http://host.docker.internal:11434"),
        "docs/serve.md does not say how to reach the host's model under Docker"
    );
}

/// `--backend openai` with its server down: one error, said once, and no log line of the
/// app's between the command's messages.
#[test]
fn an_openai_server_that_is_down_is_said_once() {
    let env = Env::new()
        .with("OPENAI_BASE_URL", &format!("{}/v1", closed_port_url()))
        .with("OPENAI_API_KEY", "x");
    let r = env.run(&[
        "--backend",
        "openai",
        "summarize",
        &fixture("claude-code.jsonl"),
    ]);
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stderr.matches("is not reachable").count(),
        1,
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains(" WARN "), "{}", r.stderr);
    assert!(!r.stderr.contains("in a row"), "{}", r.stderr);
    assert!(r.stderr.contains("check OPENAI_BASE_URL"), "{}", r.stderr);
}

/// A session's history and its context's "whole history" are one size, in every view.
#[test]
fn a_sessions_history_is_one_size() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let mut input = String::new();
    for i in 0..6 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        input.push_str(&line(
            role,
            &format!("Message {i} about the release plan and its risks."),
        ));
    }
    env.run_stdin(&["ingest", "--session", "size"], input.as_bytes())
        .assert_ok();
    let status: serde_json::Value = env.run(&["status", "--json"]).assert_ok().json();
    let sessions = status
        .as_array()
        .cloned()
        .unwrap_or_else(|| status["sessions"].as_array().cloned().unwrap_or_default());
    let history = sessions.iter().find(|s| s["id"] == "size").unwrap()["history_tokens"]
        .as_u64()
        .unwrap();
    let ctx = env.run(&["context", "size", "--json"]).assert_ok().json();
    assert_eq!(ctx["full_tokens"].as_u64().unwrap(), history, "{ctx}");
}
