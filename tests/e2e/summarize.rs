//! `abridge summarize` through each backend and format.

use serde_json::Value;

use crate::harness::{self, *};

#[test]
fn without_ollama_it_announces_and_uses_the_extractive_summarizer() {
    let env = Env::new().with("EXTRACTION_URL", &closed_port_url());
    let r = env.run(&["summarize", &fixture("chat.jsonl")]);
    r.assert_ok();
    assert!(
        r.stderr
            .contains("is not reachable, so the extractive summarizer"),
        "{}",
        r.stderr
    );
    assert!(
        r.stdout
            .starts_with("[2 March 2026]\n- User: We need to move the orders database"),
        "{}",
        r.stdout
    );
    let chain = env.chain("chat").unwrap();
    assert_covers(&chain, 12);
    assert_eq!(chain["summaries"][0]["model"], "extractive");
    // Said once a day on this machine, not on every run.
    let r = env.run(&["summarize", &fixture("chat.jsonl")]);
    r.assert_ok();
    assert!(!r.stderr.contains("is not reachable"), "{}", r.stderr);
    // A new day (the mark holds another day) says it again.
    let mark = env
        .dir
        .path()
        .join(".local/state/abridge/notices/ollama-unreachable");
    assert!(mark.exists());
    std::fs::write(&mark, "1").unwrap();
    let r = env.run(&["summarize", &fixture("chat.jsonl")]);
    assert!(r.stderr.contains("is not reachable"), "{}", r.stderr);
}

#[test]
fn through_ollama_chat_with_the_documented_request() {
    let server = TestServer::start();
    let env = Env::new().with("EXTRACTION_URL", &server.url());
    let r = env.run(&[
        "summarize",
        &fixture("chat.jsonl"),
        "--backend",
        "ollama",
        "--json",
    ]);
    r.assert_ok();
    let v = r.json();
    assert_eq!(
        (
            v["session"].as_str(),
            v["backend"].as_str(),
            v["model"].as_str()
        ),
        (Some("chat"), Some("ollama"), Some("qwen2.5:3b"))
    );
    assert_eq!(v["episodes"], 12);
    let rows = v["summaries"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    for key in ["id", "first_episode", "last_episode", "tokens", "content"] {
        assert!(rows[0].get(key).is_some(), "row lacks {key}: {v:#}");
    }
    assert!(
        rows[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("The user and the assistant discussed")
    );
    assert!(rows[0]["prompt_tokens"].as_u64().unwrap() > 100);

    let gens = server.generations();
    assert_eq!(gens.len(), 1);
    let b = &gens[0].body;
    assert_eq!(gens[0].path, "/api/chat");
    assert_eq!(b["stream"], false);
    assert_eq!(b["truncate"], false);
    assert_eq!(b["options"]["num_ctx"], 4096);
    assert_eq!(b["options"]["num_predict"], 500);
    assert!((b["options"]["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    assert_eq!(b["messages"][0]["role"], "system");
    let user = b["messages"][1]["content"].as_str().unwrap();
    assert!(
        user.contains("User: We need to move the orders database")
            && user.contains("Assistant: Rebuild them"),
        "{user}"
    );
}

#[test]
fn importing_twice_adds_nothing_and_calls_no_model() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    env.run(&["summarize", &fixture("claude-code.jsonl")])
        .assert_ok();
    let before = env.chain("0a1b2c3d-0000-4000-8000-000000000001").unwrap();
    let r = env.run(&["summarize", &fixture("claude-code.jsonl"), "--json"]);
    r.assert_ok();
    assert_eq!(r.json()["new_episodes"], 0);
    assert_eq!(server.generations().len(), 1, "no second model call");
    assert_eq!(
        env.chain("0a1b2c3d-0000-4000-8000-000000000001").unwrap(),
        before
    );
}

#[test]
fn raw_chatml_goes_to_api_generate_and_leaked_tokens_are_stripped() {
    let server = TestServer::start();
    server.push_faults([Fault::Reply {
        text: "<|im_start|>assistant\nSummary: The user upgraded Postgres to 16 with pg_upgrade.<|im_end|>\n<|im_start|>user\nthanks<|im_end|>".into(),
        done_reason: None,
    }]);
    let env = Env::new().with("EXTRACTION_URL", &server.url());
    let r = env.run(&[
        "summarize",
        &fixture("chat.jsonl"),
        "--backend",
        "ollama",
        "--rendering",
        "chatml",
    ]);
    r.assert_ok();
    assert_eq!(
        r.stdout.trim(),
        "The user upgraded Postgres to 16 with pg_upgrade."
    );
    let g = &server.generations()[0];
    assert_eq!(g.path, "/api/generate");
    assert_eq!(g.body["raw"], true);
    let prompt = g.body["prompt"].as_str().unwrap();
    assert!(
        prompt.starts_with("<|im_start|>system\n") && prompt.ends_with("<|im_start|>assistant\n")
    );
    assert_eq!(
        g.body["options"]["stop"],
        serde_json::json!(["<|im_end|>", "<|im_start|>"])
    );
}

#[test]
fn openai_compatible_backend() {
    // A plain OpenAI-compatible server (vLLM, llama.cpp): only /v1 answers.
    let server = TestServer::start_with(abridge_test_llm::Options {
        ollama_api: false,
        ..Default::default()
    });
    let env = Env::new()
        .with("OPENAI_BASE_URL", &format!("{}/v1", server.url()))
        .with("OPENAI_API_KEY", "sk-test");
    let r = env.run(&[
        "summarize",
        &fixture("openai.json"),
        "--backend",
        "openai",
        "--model",
        "llama3.2:1b",
        "--json",
    ]);
    r.assert_ok();
    assert_eq!(r.json()["backend"], "openai");
    let g = &server.generations()[0];
    assert_eq!(g.path, "/v1/chat/completions");
    assert_eq!(
        (g.body["model"].as_str(), g.body["max_tokens"].as_u64()),
        (Some("llama3.2:1b"), Some(500))
    );
}

#[test]
fn ollama_behind_v1_is_refused_with_the_backend_to_use() {
    // Ollama's /v1 cannot take num_ctx: it would truncate silently and the job "succeed".
    let server = TestServer::start();
    let env = Env::new().with("OPENAI_BASE_URL", &format!("{}/v1", server.url()));
    env.run(&["summarize", &fixture("openai.json"), "--backend", "openai"])
        .assert_fails(
            2,
            &["OpenAI-compatible API", "num_ctx", "--backend ollama --url"],
        );
    assert!(server.generations().is_empty(), "no request was sent");
}

#[test]
fn every_format_imports_the_right_episodes() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let cases = [
        ("chat.jsonl", "chat", 12),
        (
            "claude-code.jsonl",
            "0a1b2c3d-0000-4000-8000-000000000001",
            // Seven messages and one tool call (an action line for the digest).
            8,
        ),
        ("openai.json", "openai", 7),
        ("chatgpt.json", "chatgpt-fixture-1", 3),
        // Two prompts, one answer, four tool calls (one patch of two files) and a failure.
        (
            "codex-rollout.jsonl",
            "5f0c2a8e-1111-4222-8333-444455556666",
            8,
        ),
    ];
    for (file, session, episodes) in cases {
        let r = env.run(&["summarize", &fixture(file), "--json"]);
        r.assert_ok();
        let v = r.json();
        assert_eq!(
            (v["session"].as_str(), v["episodes"].as_u64()),
            (Some(session), Some(episodes)),
            "{file}"
        );
        assert_covers(&env.chain(session).unwrap(), episodes);
    }
    // The regenerated-away ChatGPT branch is not part of the conversation.
    let chain = env.chain("chatgpt-fixture-1").unwrap();
    assert!(!chain.to_string().contains("regenerated away"));
}

#[test]
fn a_session_over_one_prompt_is_map_reduced_with_every_episode_sent_once() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    // A 520-token context leaves room for a few episodes per pass.
    let r = env.run(&[
        "summarize",
        &fixture("chat.jsonl"),
        "--context-length",
        "520",
        "--max-output-tokens",
        "120",
        "--max-summary-tokens",
        "30",
        "--json",
    ]);
    r.assert_ok();
    let v = r.json();
    assert_covers(&v, 12);
    assert_eq!(
        v["summaries"].as_array().unwrap().len(),
        1,
        "one row covers the whole session"
    );
    let gens = server.generations();
    let system = |g: &abridge_test_llm::LoggedRequest| {
        g.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let maps: Vec<_> = gens
        .iter()
        .filter(|g| system(g).starts_with("You write summaries"))
        .collect();
    let reduces = gens
        .iter()
        .filter(|g| system(g).starts_with("You merge partial summaries"))
        .count();
    assert!(
        maps.len() >= 3 && reduces >= 1,
        "{} maps, {reduces} reduces",
        maps.len()
    );
    // The server refuses prompts over num_ctx (truncate: false), so success proves fit;
    // each episode's text went into exactly one map prompt.
    let all: String = maps.iter().map(|g| g.body.to_string()).collect();
    for needle in ["800 GB", "reg* data types", "pg_basebackup"] {
        assert_eq!(all.matches(needle).count(), 1, "{needle}");
    }
}

#[test]
fn a_killed_run_leaves_episodes_and_no_partial_summary() {
    let server = TestServer::start();
    server.push_faults([Fault::Delay { ms: 20_000 }]);
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let mut child = env
        .command(&["summarize", &fixture("chat.jsonl")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while server.generations().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the model was never called"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let chain = env.chain("chat").expect("the episodes were stored");
    assert_eq!(chain["episodes"], 12);
    assert_eq!(chain["summaries"], Value::Array(vec![]));
    // A rerun finishes the job.
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    assert_covers(&env.chain("chat").unwrap(), 12);
}

#[test]
fn configuration_file_and_environment_are_honoured() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("EXTRACTION_MODEL", "llama3.2:1b");
    env.write(
        "abridge.toml",
        "backend = \"ollama\"\nmodel = \"from-file\"\ncontext_length = 3000\n",
    );
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    let g = &server.generations()[0];
    assert_eq!(g.body["model"], "llama3.2:1b", "environment beats the file");
    assert_eq!(
        g.body["options"]["num_ctx"], 3000,
        "the file beats the default"
    );
}

#[test]
fn a_failed_chunk_is_skipped_and_recorded_but_too_many_fail_the_run() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let small = [
        "--context-length",
        "520",
        "--max-output-tokens",
        "120",
        "--retries",
        "1",
    ];
    // Two of three chunks fail: over the 50 % limit, nothing is written.
    server.push_faults([
        Fault::Status {
            code: 500,
            message: "boom".into(),
        },
        Fault::Status {
            code: 500,
            message: "boom".into(),
        },
    ]);
    let file = fixture("chat.jsonl");
    let args: Vec<&str> = ["summarize", file.as_str(), "--json"]
        .into_iter()
        .chain(small)
        .collect();
    env.run(&args)
        .assert_fails(3, &["2 of 3 chunks failed, over the 50% limit", "HTTP 500"]);
    assert_eq!(
        env.chain("chat").unwrap()["summaries"],
        Value::Array(vec![])
    );
    // One of three fails: the summary is written and says which episodes it could not cover.
    server.push_faults([Fault::Status {
        code: 500,
        message: "boom".into(),
    }]);
    let asked = server.generations().len();
    let r = env.run(&args);
    r.assert_ok();
    // The chunk that succeeded in the failed run is cached: only the other two are asked again.
    let maps_again = server.generations()[asked..]
        .iter()
        .filter(|g| {
            g.body["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .starts_with("You write summaries")
        })
        .count();
    assert_eq!(maps_again, 2, "the cached chunk is not asked again");
    let v = r.json();
    assert_covers(&v, 12);
    let skipped = v["summaries"][0]["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{v:#}");
    assert!(
        r.stderr.contains("skipping episodes"),
        "the skip is announced: {}",
        r.stderr
    );
    // --max-skipped-percent 0 tolerates no failure.
    server.push_faults([Fault::Status {
        code: 500,
        message: "boom".into(),
    }]);
    let strict: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--session", "strict", "--max-skipped-percent", "0"])
        .collect();
    env.run(&strict)
        // (This database has calibrated the estimator by now, so the chunking may differ.)
        .assert_fails(3, &["1 of", "chunks failed, over the 0% limit"]);
}

#[test]
fn dry_run_plans_without_calling_a_model_or_storing() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let small = ["--context-length", "520", "--max-output-tokens", "120"];
    let file = fixture("chat.jsonl");
    let args: Vec<&str> = [
        "summarize",
        file.as_str(),
        "--json",
        "--dry-run",
        "--price-in",
        "1",
        "--price-out",
        "2",
    ]
    .into_iter()
    .chain(small)
    .collect();
    let r = env.run(&args);
    r.assert_ok();
    let plan = r.json();
    assert_eq!(
        (
            plan["path"].as_str(),
            plan["episodes"].as_u64(),
            plan["dry_run"].as_bool()
        ),
        (Some("map-reduce"), Some(12), Some(true))
    );
    assert!(
        server.requests().is_empty(),
        "no request at all, not even a probe"
    );
    assert!(!env.db().exists(), "nothing stored");
    let cost = plan["input_tokens"].as_f64().unwrap() / 1e6
        + 2.0 * plan["output_tokens"].as_f64().unwrap() / 1e6;
    assert!((plan["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-12);
    // The real run makes exactly the planned map calls; reduce levels are an estimate.
    let run: Vec<&str> = ["summarize", file.as_str()]
        .into_iter()
        .chain(small)
        .collect();
    env.run(&run).assert_ok();
    let gens = server.generations();
    let reduces = gens
        .iter()
        .filter(|g| {
            g.body["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .starts_with("You merge")
        })
        .count();
    assert_eq!(
        (gens.len() - reduces) as u64,
        plan["chunks"].as_u64().unwrap()
    );
    assert!(reduces >= 1 && !plan["levels"].as_array().unwrap().is_empty());
    // Text output names the path and the cost.
    let text: Vec<&str> = ["summarize", file.as_str(), "--dry-run"]
        .into_iter()
        .chain(small)
        .collect();
    let t = env.run(&text);
    t.assert_ok();
    assert!(
        t.stdout.contains("path map-reduce") && t.stdout.contains("cost: $"),
        "{}",
        t.stdout
    );
}

#[test]
fn a_model_that_counts_more_tokens_is_calibrated_and_its_context_respected() {
    // This model's tokenizer counts 3x the server's usual rule (about 2.4x our estimate):
    // uncalibrated chunks overflow its context and are refused (truncate: false).
    let server = TestServer::start_with(abridge_test_llm::Options {
        token_ratio: 3.0,
        ..Default::default()
    });
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let long: String = (0..60)
        .map(|i| {
            format!(
                "{{\"role\":\"{}\",\"content\":\"Step {i}: {}\"}}\n",
                if i % 2 == 0 { "user" } else { "assistant" },
                "the migration plan covers replicas, backups and the rollback window. ".repeat(4)
            )
        })
        .collect();
    let a = env.write("a.jsonl", &long);
    let b = env.write("b.jsonl", long.replace("Step", "Phase"));
    let ctx = [
        "--context-length",
        "2048",
        "--max-output-tokens",
        "200",
        "--json",
    ];
    let run = |file: &std::path::Path| {
        let args: Vec<&str> = ["summarize", file.to_str().unwrap()]
            .into_iter()
            .chain(ctx)
            .collect();
        let r = env.run(&args);
        r.assert_ok();
        r
    };
    let refused = |from: usize| {
        server.requests()[from..]
            .iter()
            .filter(|r| r.path == "/api/chat")
            .count()
    };
    let r = run(&a);
    assert_covers(&r.json(), 60);
    assert!(
        r.stderr.contains("recalibrating"),
        "the first plan overflowed: {}",
        r.stderr
    );
    let accepted_a = server.generations().len();
    // The second session is planned with the stored calibration: no refusal at all.
    let before = server.requests().len();
    let r = run(&b);
    assert_covers(&r.json(), 60);
    assert!(!r.stderr.contains("recalibrating"), "{}", r.stderr);
    assert!(refused(before) > 0 && accepted_a > 0);
}

#[test]
fn chunk_concurrency_bounds_requests_in_flight() {
    // With a 150 ms model, requests starting within 100 ms of each other overlap.
    let server = TestServer::start_with(abridge_test_llm::Options {
        delay: std::time::Duration::from_millis(150),
        ..Default::default()
    });
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("SUMMARIZE_CHUNK_CONCURRENCY", "2");
    let long: String = (0..40)
        .map(|i| {
            format!(
                "{{\"role\":\"user\",\"content\":\"Part {i}: {}\"}}\n",
                "the rollout plan covers canaries, dashboards and the rollback drill. ".repeat(5)
            )
        })
        .collect();
    let f = env.write("long.jsonl", &long);
    env.run(&[
        "summarize",
        f.to_str().unwrap(),
        "--context-length",
        "1024",
        "--max-output-tokens",
        "200",
    ])
    .assert_ok();
    let starts: Vec<u64> = server
        .generations()
        .iter()
        .filter(|g| {
            g.body["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .starts_with("You write")
        })
        .map(|g| g.at_ms)
        .collect();
    assert!(starts.len() >= 4, "{} map calls", starts.len());
    for (i, t) in starts.iter().enumerate() {
        let overlapping = starts.iter().filter(|u| u.abs_diff(*t) < 100).count();
        assert!(
            overlapping <= 2,
            "request {i} overlaps {overlapping} (starts {starts:?})"
        );
    }
}

#[test]
fn chunk_tokens_caps_map_chunks() {
    let env = Env::new().with("ABRIDGE_BACKEND", "ollama");
    let long: String = (0..40)
        .map(|i| {
            format!(
                "{{\"role\":\"user\",\"content\":\"Part {i}: {}\"}}\n",
                "the rollout plan covers canaries, dashboards and the rollback drill. ".repeat(5)
            )
        })
        .collect();
    let f = env.write("long.jsonl", &long);
    let plan = |extra: &[(&str, &str)]| {
        let mut c = env.command(&[
            "summarize",
            f.to_str().unwrap(),
            "--dry-run",
            "--json",
            "--context-length",
            "2048",
        ]);
        for (k, v) in extra {
            c.env(k, v);
        }
        let r = harness::Run::from(c.output().unwrap());
        r.assert_ok();
        r.json()["chunks"].as_u64().unwrap()
    };
    let derived = plan(&[]);
    let capped = plan(&[("SUMMARIZE_CHUNK_TOKENS", "300")]);
    assert!(
        capped > derived * 2,
        "derived {derived} chunks, capped {capped}"
    );
}

/// A first run without a model writes offline summaries; the first run with one rewrites them
/// in place (same rows, same ranges, the model's prose) instead of answering "every episode
/// is already covered". `refresh --upgrade` does it for every session; without a model it
/// says what to do.
#[test]
fn offline_summaries_are_rewritten_by_the_model_once_one_is_reachable() {
    let server = TestServer::start();
    let offline = Env::new().with("EXTRACTION_URL", &closed_port_url());
    offline
        .run(&["summarize", &fixture("chat.jsonl")])
        .assert_ok();
    offline
        .run(&["summarize", &fixture("openai.json")])
        .assert_ok();
    let rows_of = row_spans;
    let before = rows_of(&offline, "chat");
    assert!(before.iter().all(|r| r.3 == "extractive"), "{before:?}");
    // Asking for an upgrade with no model reachable says how to get one.
    offline
        .run(&["refresh", "--upgrade"])
        .assert_fails(2, &["no model is reachable", "start Ollama"]);
    // The same database, now with a model: summarize rewrites the offline rows.
    let mut online = Env::new().with("EXTRACTION_URL", &server.url());
    online.dir = offline.dir;
    let r = online.run(&["summarize", &fixture("chat.jsonl")]);
    r.assert_ok();
    assert!(r.stderr.contains("0 new"), "{}", r.stderr);
    let after = rows_of(&online, "chat");
    assert_eq!(
        after.iter().map(|r| (r.0, r.1, r.2)).collect::<Vec<_>>(),
        before.iter().map(|r| (r.0, r.1, r.2)).collect::<Vec<_>>(),
        "the same rows over the same ranges"
    );
    assert!(after.iter().all(|r| r.3 == "qwen2.5:3b"), "{after:?}");
    assert_covers(&online.chain("chat").unwrap(), 12);
    let calls = server.generations().len();
    assert!(calls >= 1);
    // Again: nothing left to rewrite, no model call.
    online
        .run(&["summarize", &fixture("chat.jsonl")])
        .assert_ok();
    assert_eq!(server.generations().len(), calls);
    // The other session waits for `refresh --upgrade`, which takes every session.
    let other = rows_of(&online, "openai");
    assert!(other.iter().all(|r| r.3 == "extractive"), "{other:?}");
    let r = online.run(&["refresh", "--upgrade"]);
    r.assert_ok();
    assert!(r.stderr.contains("1 of 2 session(s)"), "{}", r.stderr);
    let other_after = rows_of(&online, "openai");
    assert!(
        other_after.iter().all(|r| r.3 == "qwen2.5:3b"),
        "{other_after:?}"
    );
    assert_eq!(other_after.len(), other.len());
}

#[test]
fn an_imported_transcript_without_times_gets_no_invented_dates_and_a_posted_message_its_arrival() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let lines: String = (1..=40)
        .map(|i| {
            let (role, text) = if i % 2 == 1 {
                (
                    "user",
                    format!("Turn {i}: yesterday I bought {i} apples at the Porto market."),
                )
            } else {
                (
                    "assistant",
                    format!("Reply {i}: lovely, what else was at the market?"),
                )
            };
            format!("{}\n", serde_json::json!({"role": role, "content": text}))
        })
        .collect();
    let file = env.write("untimed.jsonl", lines);
    env.run(&["summarize", file.to_str().unwrap(), "--session", "u"])
        .assert_ok();
    // Neither the context (its summary, day marks, the found turns and their times) nor a
    // stored episode says a date nobody said: no year, no month, no time of day, and
    // "yesterday" is left as said.
    let months = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    for args in [
        &["context", "u", "--budget", "300", "--json"][..],
        &[
            "context",
            "u",
            "--budget",
            "300",
            "--query",
            "how many apples on turn 7",
            "--json",
        ],
    ] {
        let v = env.run(args).assert_ok().json();
        let text: String = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(text.contains("Turn "), "{text}");
        for m in months {
            assert!(!text.contains(m), "{args:?} invented a date ({m}): {text}");
        }
        assert!(
            !text.contains("(= "),
            "{args:?} resolved a relative day: {text}"
        );
        assert!(
            !text.split_whitespace().any(|w| w.len() == 5
                && w.as_bytes()[2] == b':'
                && w.chars().filter(|c| c.is_ascii_digit()).count() == 4),
            "{args:?} invented a time of day: {text}"
        );
        assert_eq!(v["parts"]["days"], 0, "{v}");
    }
    let stored = |session: &str, episode: &str| -> Vec<Value> {
        env.run(&["expand", session, "--episode", episode, "--json"])
            .assert_ok()
            .json()["messages"]
            .as_array()
            .unwrap()
            .clone()
    };
    let around = stored("u", "7");
    assert!(
        around
            .iter()
            .any(|m| m["content"].as_str().unwrap().starts_with("Turn 7"))
    );
    assert!(
        around.iter().all(|m| m["timestamp_ms"].is_null()),
        "{around:?}"
    );
    // Messages fed as they arrive (a chat app's ingest) keep their arrival time.
    env.run_stdin(
        &["ingest", "--session", "live"],
        b"{\"role\": \"user\", \"content\": \"Book the room for Thursday.\"}\n",
    )
    .assert_ok();
    let live = stored("live", "1");
    assert!(live[0]["timestamp_ms"].as_i64().is_some(), "{live:?}");
}
