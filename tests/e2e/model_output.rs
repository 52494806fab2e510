//! Real model output and transport: runaway bodies, over-long replies, every context-overflow
//! wording, misleading settings, and credentials in URLs, against the test server.

use crate::harness::*;

fn line(role: &str, content: &str) -> String {
    serde_json::json!({"role": role, "content": content}).to_string() + "\n"
}

fn conversation(n: usize) -> String {
    let text = "We compared the two rollout plans and agreed to measure the replica lag budget on staging before Friday.";
    (0..n)
        .map(|i| {
            line(
                if i % 2 == 0 { "user" } else { "assistant" },
                &format!("{text} ({i})"),
            )
        })
        .collect()
}

fn ollama_env(server: &TestServer) -> Env {
    Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("ABRIDGE_RETRIES", "1")
}

#[test]
fn a_runaway_response_body_is_a_model_failure_with_bounded_memory() {
    let server = TestServer::start();
    let env = ollama_env(&server);
    let chat = env.write("chat.jsonl", conversation(12));
    let f = chat.display().to_string();
    // 40 MB of reply (10x the cap): read up to the cap, then dropped.
    server.push_faults([Fault::Unlimited {
        text: "babble ".repeat(6_000_000),
    }]);
    let r = env
        .command(&["summarize", &f])
        .env("ABRIDGE_REPORT_PEAK_RSS", "1")
        .output()
        .map(Run::from)
        .unwrap();
    r.assert_fails(3, &["more than 4 MiB", "misbehaving"]);
    let rss_kb: u64 = r
        .stderr
        .lines()
        .find(|l| l.contains("peak RSS"))
        .and_then(|l| l.split_whitespace().find_map(|w| w.parse().ok()))
        .expect("peak RSS line");
    assert!(rss_kb < 150 * 1024, "peak RSS {rss_kb} kB:\n{}", r.stderr);
    // A model failure like any other: the session records it and backs off.
    let st = env.run(&["status", "chat", "--json"]).json();
    assert_eq!(st[0]["failures"], 1, "{st:#}");
    // The episodes are stored; the next run summarizes them.
    env.run(&["summarize", &f]).assert_ok();
    assert_covers(&env.chain("chat").unwrap(), 12);
}

#[test]
fn an_over_long_reply_never_replaces_a_good_summary_and_ingest_stores_every_line() {
    let server = TestServer::start();
    let env = ollama_env(&server);
    let first = env.write("chat.jsonl", conversation(12));
    env.run(&["summarize", &first.display().to_string()])
        .assert_ok();
    let good = env.chain("chat").unwrap()["summaries"].clone();
    // 50,000 characters answered as a normal stop, for every call of this ingest.
    let long: String = (0..2_500)
        .map(|i| format!("Point {i} was noted. "))
        .collect();
    server.push_faults((0..400).map(|_| Fault::Unlimited { text: long.clone() }));
    let more: String = (12..212)
        .map(|i| {
            line(
                if i % 2 == 0 { "user" } else { "assistant" },
                &format!("Follow-up {i} on the replica lag budget and the staging run."),
            )
        })
        .collect();
    let r = env.run_stdin(&["ingest", "--session", "chat"], more.as_bytes());
    r.assert_fails(
        3,
        &[
            "far over the 500-token output limit",
            "all 200 episodes are stored",
        ],
    );
    let chain = env.chain("chat").unwrap();
    assert_eq!(chain["episodes"], 212, "every line is stored");
    assert_eq!(chain["summaries"], good, "the good summary is kept");
    let st = env.run(&["status", "chat", "--json"]).json();
    assert!(st[0]["failures"].as_u64().unwrap() >= 1, "{st:#}");
}

#[test]
fn every_context_overflow_wording_recalibrates_instead_of_failing() {
    for wording in [
        "request (2130 tokens) exceeds the available context size (2048 tokens), try increasing it",
        "the prompt is longer than the context length currently available to the model; try a shorter prompt",
        "exceed_context_size_error: the request exceeds the available context size",
        "input length exceeds the context length",
    ] {
        let server = TestServer::start();
        let env = ollama_env(&server);
        let chat = env.write("chat.jsonl", conversation(12));
        server.push_faults([Fault::Status {
            code: 400,
            message: wording.into(),
        }]);
        let r = env.run(&["summarize", &chat.display().to_string()]);
        r.assert_ok();
        assert!(
            r.stderr.contains("recalibrating"),
            "{wording}: {}",
            r.stderr
        );
        assert_covers(&env.chain("chat").unwrap(), 12);
    }
}

#[test]
fn misleading_settings_get_messages_that_say_what_is_wrong() {
    let server = TestServer::start();
    let env = ollama_env(&server);
    let chat = env.write("chat.jsonl", conversation(4));
    let f = chat.display().to_string();
    env.run(&["summarize", &f, "--timeout-secs", "0"])
        .assert_fails(2, &["timeout of 0 seconds", "--timeout-secs 1"]);
    env.run(&["summarize", &f, "--url", "http://[::1"])
        .assert_fails(2, &["is not a valid URL"]);
    env.run(&["summarize", &f, "--url", "ftp://127.0.0.1:1"])
        .assert_fails(2, &["not an http:// or https:// URL"]);
}

#[test]
fn credentials_in_a_url_are_used_but_never_shown() {
    let closed = closed_port_url();
    let secret_url = closed.replace("http://", "http://alice:s3cr3t-pass@");
    let env = Env::new()
        .with("EXTRACTION_URL", &secret_url)
        .with("ABRIDGE_RETRIES", "1");
    let chat = env.write("chat.jsonl", conversation(12));
    let f = chat.display().to_string();
    for args in [
        vec!["summarize", f.as_str(), "--backend", "ollama"],
        vec!["summarize", f.as_str(), "--backend", "auto"],
    ] {
        let r = env.run(&args);
        assert!(
            !r.stderr.contains("s3cr3t") && !r.stdout.contains("s3cr3t"),
            "{}",
            r.stderr
        );
        assert!(r.stderr.contains("***@127.0.0.1"), "{}", r.stderr);
    }
    // The OpenAI-compatible backend: in errors, job records and failure markers alike.
    let env = env
        .with("OPENAI_BASE_URL", &format!("{secret_url}/v1"))
        .with("ABRIDGE_BACKEND", "openai");
    let r = env.run_stdin(&["ingest", "--session", "s"], conversation(12).as_bytes());
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(!r.stderr.contains("s3cr3t"), "{}", r.stderr);
    let st = env.run(&["status", "s", "--json"]);
    assert!(!st.stdout.contains("s3cr3t"), "{}", st.stdout);
    let db = std::fs::read(env.db()).unwrap();
    assert!(
        !db.windows(7).any(|w| w == b"s3cr3t-"),
        "the secret reached the database"
    );
}

#[test]
fn the_default_concurrency_adapts_to_a_single_slot_server() {
    // Ollama's common setting: one slot, the rest queued, and the per-call timeout counts the
    // queue. Six requests in flight at 600 ms each would time out (at 3 s) from the sixth on,
    // and every one after the first would queue. (Long calls and a wide timeout keep the
    // figures steady on a loaded machine, whose scheduling delays are small against them.)
    let server = TestServer::start_with(abridge_test_llm::Options {
        slots: Some(1),
        delay: std::time::Duration::from_millis(600),
        ..Default::default()
    });
    // Five attempts: the first wave's timeouts teach the window, and on a loaded 2-core
    // machine (the suite runs in parallel) a chunk may meet them more than twice before it does.
    let env = ollama_env(&server).with("ABRIDGE_RETRIES", "5");
    let chat = env.write("long.jsonl", conversation(240));
    let r = env.run(&[
        "summarize",
        &chat.display().to_string(),
        "--chunk-tokens",
        "800",
        "--timeout-secs",
        "3",
    ]);
    r.assert_ok();
    assert_covers(&env.chain("long").unwrap(), 240);
    let chain = env.chain("long").unwrap();
    assert_eq!(
        chain["summaries"][0]["skipped"],
        serde_json::json!([]),
        "{chain:#}\n{}",
        r.stderr
    );
    let asked = server.generations().len();
    assert!(asked >= 13, "map-reduce expected, {asked} requests");
    let plan = env.run(&[
        "summarize",
        &chat.display().to_string(),
        "--dry-run",
        "--chunk-tokens",
        "800",
        "--json",
    ]);
    let calls = plan.json()["calls"].as_u64().unwrap() as usize;
    eprintln!("single slot: {asked} requests for {calls} calls");
    // Only the first waves time out while the limit is learned (a fixed six in flight skips
    // chunks here, after three attempts each).
    assert!(
        asked <= calls + 8,
        "{asked} requests for {calls} calls:\n{}",
        r.stderr
    );
}

#[test]
fn a_fifty_megabyte_message_is_stored_in_parts_and_summarized() {
    // One 50 MB message used to be stored whole and then never summarized: the guest hit its
    // memory cap on every run. The parser now splits it into parts of at most 64 KiB before
    // it crosses into the guest, and the parts are map-reduced like any long session.
    let server = TestServer::start();
    let env = ollama_env(&server);
    // Full of what the facts rules read, so reading it costs the most it can: a person's facts
    // are read in a message's first page only.
    let para = "I'm with Keller Systems now and my car is a blue Skoda, we moved from Porto to Lyon. The migration copies the orders table in batches of ten thousand rows and checks each batch. ";
    let mut body = String::with_capacity(50_100_000);
    while body.len() < 50_000_000 {
        body.push_str(&para.repeat(20));
        body.push_str("\n\n");
    }
    let text = line("user", "Please review this log.")
        + &line("assistant", &body)
        + &line("user", "Thanks, that settles it.");
    drop(body);
    let f = env.write("big.jsonl", text);
    let r = env.run_within(600, &["summarize", &f.display().to_string()]);
    r.assert_ok();
    let chain = env.chain("big").unwrap();
    let n = chain["episodes"].as_u64().unwrap();
    assert!(n > 700, "the message was not split: {n} episodes");
    assert_covers(&chain, n);
    assert_eq!(chain["summaries"][0]["skipped"], serde_json::json!([]));
}
