//! Bad input and failing models: one clear message, a non-zero exit, nothing stored lost.

use serde_json::Value;

use crate::harness::*;

/// Run `args` after a good import, and check the stored chain is unchanged afterwards.
fn unchanged_after(env: &Env, args: &[&str], code: i32, stderr_has: &[&str]) {
    let before = env.chain("chat").unwrap();
    env.run(args).assert_fails(code, stderr_has);
    assert_eq!(
        env.chain("chat").unwrap(),
        before,
        "stored data changed after a failed command"
    );
}

fn seeded() -> Env {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    env
}

#[test]
fn malformed_unknown_non_utf8_empty_missing_and_huge_files() {
    let env = seeded();
    let bad = env.write("bad.jsonl", "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\": user}\n{\"role\":\"user\",\"content\":\"b\"}\n");
    let bad = bad.display().to_string();
    unchanged_after(
        &env,
        &["summarize", &bad, "--session", "chat"],
        2,
        &["bad.jsonl:2: not valid JSON", "--skip-invalid"],
    );

    let unknown = env
        .write("notes.txt", "just some notes\nnot a transcript\n")
        .display()
        .to_string();
    unchanged_after(
        &env,
        &["summarize", &unknown],
        2,
        &["cannot tell the format", "--format"],
    );

    let latin1 = env
        .write(
            "latin1.jsonl",
            b"{\"role\":\"user\",\"content\":\"caf\xe9\"}\n",
        )
        .display()
        .to_string();
    unchanged_after(
        &env,
        &["summarize", &latin1],
        2,
        &["latin1.jsonl:1: invalid UTF-8", "iconv"],
    );

    let empty = env.write("empty.json", "[]").display().to_string();
    unchanged_after(
        &env,
        &["summarize", &empty, "--format", "openai"],
        2,
        &["holds no messages"],
    );

    unchanged_after(
        &env,
        &["summarize", "/no/such/file.jsonl"],
        2,
        &["cannot read /no/such/file.jsonl", "check the path"],
    );

    unchanged_after(
        &env,
        &["summarize", &fixture("chat.jsonl"), "--max-bytes", "100"],
        2,
        &["over the 100-byte limit", "--max-bytes"],
    );

    unchanged_after(
        &env,
        &["summarize", &fixture("chat.jsonl"), "--format", "yaml"],
        2,
        &["invalid value 'yaml'"],
    );

    // --skip-invalid imports the good lines.
    let r = env.run(&["summarize", &bad, "--skip-invalid", "--json"]);
    r.assert_ok();
    assert_eq!(r.json()["episodes"], 2);
    assert!(
        r.stderr.contains("bad.jsonl:2: not valid JSON"),
        "{}",
        r.stderr
    );
}

#[test]
fn unreachable_ollama_when_required() {
    let env = seeded().with("EXTRACTION_URL", &closed_port_url());
    unchanged_after(
        &env,
        &["summarize", &fixture("chat.jsonl"), "--backend", "ollama"],
        3,
        &["is not reachable", "ollama serve", "--backend extractive"],
    );
}

#[test]
fn a_model_that_is_not_pulled() {
    let server = TestServer::start();
    let env = seeded().with("EXTRACTION_URL", &server.url());
    unchanged_after(
        &env,
        &[
            "summarize",
            &fixture("chat.jsonl"),
            "--backend",
            "ollama",
            "--model",
            "mistral:7b",
        ],
        3,
        &["'mistral:7b' is not available", "ollama pull mistral:7b"],
    );
    // auto also refuses rather than silently changing engines when Ollama is up.
    unchanged_after(
        &env,
        &[
            "summarize",
            &fixture("chat.jsonl"),
            "--backend",
            "auto",
            "--model",
            "mistral:7b",
        ],
        3,
        &["ollama pull mistral:7b"],
    );
}

#[test]
fn server_errors_garbage_and_rejected_output_write_nothing() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    let more = env.write("more.jsonl", std::fs::read_to_string(fixture("chat.jsonl")).unwrap() + "{\"role\":\"user\",\"content\":\"One more question about vacuum settings after the upgrade.\"}\n");
    let more = more.display().to_string();
    let args = ["summarize", more.as_str(), "--session", "chat"];
    let cases: Vec<(Fault, &[&str])> = vec![
        (
            Fault::Status {
                code: 500,
                message: "CUDA error: out of memory".into(),
            },
            &["HTTP 500", "CUDA error"],
        ),
        (Fault::Garbage, &["not JSON"]),
        (Fault::Disconnect, &["Ollama at"]),
        (
            Fault::Reply {
                text: "<|im_end|>".into(),
                done_reason: None,
            },
            &["rejected", "no text"],
        ),
        (
            Fault::Reply {
                text: "The user asked about".into(),
                done_reason: Some("length".into()),
            },
            &["rejected", "output limit"],
        ),
        (
            Fault::Reply {
                text: "The plan is fine. ".repeat(6),
                done_reason: None,
            },
            &["rejected", "repeats itself"],
        ),
        (
            Fault::Status {
                code: 400,
                message: "the prompt is longer than the context length".into(),
            },
            &["did not fit the model's context"],
        ),
    ];
    for (fault, expect) in cases {
        // Transient faults are retried (3 attempts); a prompt refused as over-long is re-planned
        // after recalibrating (3 re-plans), so both must persist to fail the command.
        let copies = match fault {
            Fault::Status { code: 500, .. } | Fault::Garbage | Fault::Disconnect => 3,
            Fault::Status { code: 400, .. } => 4,
            _ => 1,
        };
        server.push_faults(std::iter::repeat_n(fault.clone(), copies));
        let before = env.chain("chat").unwrap();
        let r = env.run(&args);
        r.assert_fails(3, expect);
        assert!(
            r.stderr.contains("earlier summaries are unchanged"),
            "{fault:?}: {}",
            r.stderr
        );
        let after = env.chain("chat").unwrap();
        assert_eq!(
            after["summaries"], before["summaries"],
            "{fault:?} changed the summaries"
        );
        assert_eq!(after["episodes"], 13, "the new episode is kept");
    }
    // With the faults gone, the same command brings the chain up to date.
    env.run(&args).assert_ok();
    let chain = env.chain("chat").unwrap();
    assert_covers(&chain, 13);
    assert!(
        chain["summaries"][0]["content"]
            .as_str()
            .unwrap()
            .contains("continues an earlier summary")
    );
}

#[test]
fn invalid_configuration_is_reported_before_anything_runs() {
    let env = seeded().with("SUMMARY_MAX_TOKENS", "many");
    let r = env.run(&["summaries", "chat"]);
    r.assert_fails(2, &["SUMMARY_MAX_TOKENS=\"many\" is not a valid value"]);
    let env = seeded();
    let r = env.run(&[
        "summarize",
        &fixture("chat.jsonl"),
        "--backend",
        "ollama",
        "--url",
        "localhost:11434",
    ]);
    r.assert_fails(2, &["is not an http:// or https:// URL"]);
    let chain: Value = env.chain("chat").unwrap();
    assert_covers(&chain, 12);
}

#[test]
fn transient_faults_are_retried_with_backoff() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    server.push_faults([
        Fault::Status {
            code: 503,
            message: "server busy".into(),
        },
        Fault::Disconnect,
    ]);
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    let gens = server.generations();
    assert_eq!(gens.len(), 3, "two failed attempts, then success");
    assert!(
        gens[1].at_ms >= gens[0].at_ms + 2 && gens[2].at_ms >= gens[1].at_ms + 5,
        "backoff between attempts"
    );
    assert_covers(&env.chain("chat").unwrap(), 12);
    // A missing model is not retried.
    let r = env.run(&[
        "summarize",
        &fixture("chat.jsonl"),
        "--session",
        "other",
        "--model",
        "llama3.2:1b",
        "--retries",
        "5",
    ]);
    r.assert_ok();
    server.push_faults([Fault::Status {
        code: 404,
        message: "model 'x' not found".into(),
    }]);
    let before = server.generations().len();
    env.run(&["summarize", &fixture("openai.json"), "--retries", "5"])
        .assert_fails(3, &["ollama pull"]);
    assert_eq!(server.generations().len(), before + 1);
}

/// The papercuts of the first five minutes: a read creates no database, a missing file's
/// error is said once, a not-found error carries one hint.
#[test]
fn a_read_creates_nothing_and_errors_say_each_thing_once() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let nowhere = env.dir.path().join("no/such/dir/x.db");
    let db = nowhere.to_str().unwrap();
    for args in [
        &["status"][..],
        &["summaries", "s"],
        &["search", "anything"],
        &["memory", "list"],
        &["recall", "anything"],
        &["usage"],
    ] {
        let mut all = vec!["--db", db];
        all.extend_from_slice(args);
        let _ = env.run(&all);
        assert!(
            !env.dir.path().join("no").exists(),
            "{args:?} created folders for a database it only reads"
        );
    }
    env.run(&["--db", db, "status"]).assert_ok();

    let r = env.run(&["summarize", "missing.jsonl"]);
    r.assert_fails(2, &["cannot read missing.jsonl", "check the path"]);
    assert_eq!(
        r.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        r.stderr
    );

    env.run_stdin(
        &["ingest", "--session", "s", "-"],
        b"{\"role\": \"user\", \"content\": \"hello\"}\n",
    )
    .assert_ok();
    for args in [&["expand", "s", "99"][..], &["pin", "s", "99"]] {
        let r = env.run(args);
        r.assert_fails(2, &["99"]);
        assert!(
            r.stderr.matches("list").count() <= 1,
            "{args:?}: {}",
            r.stderr
        );
        assert!(
            r.stderr.matches("'abridge ").count() <= 1,
            "{args:?}: {}",
            r.stderr
        );
        assert_eq!(r.stderr.matches(".db").count(), 1, "{args:?}: {}", r.stderr);
    }
}
