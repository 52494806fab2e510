//! `abridge ingest` and `abridge summaries`: the chat-app path with the trigger.

use crate::harness::*;

fn line(role: &str, text: &str) -> String {
    format!("{{\"role\":\"{role}\",\"content\":\"{text}\"}}\n")
}

#[test]
fn the_trigger_fires_on_threshold_and_episode_count_then_updates() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let long = "The deployment pipeline builds the container image, runs the unit and integration tests, scans the image for known vulnerabilities, signs it, and pushes it to the staging registry, where it waits for a manual promotion to production.";
    // Four long episodes: over the 200-token threshold but under 5 episodes: no summary.
    let mut input = String::new();
    for i in 0..4 {
        input.push_str(&line(
            if i % 2 == 0 { "user" } else { "assistant" },
            &format!("{long} Step {i}."),
        ));
    }
    env.run_stdin(&["ingest", "--session", "s1"], input.as_bytes())
        .assert_ok();
    assert!(server.generations().is_empty());
    assert_eq!(
        env.chain("s1").unwrap()["summaries"]
            .as_array()
            .unwrap()
            .len(),
        0
    );

    // The fifth fires the trigger: a fresh summary of episodes 1-5.
    let r = env.run_stdin(
        &["ingest", "--session", "s1", "--json"],
        line("user", "And the rollback plan?").as_bytes(),
    );
    r.assert_ok();
    assert_eq!(server.generations().len(), 1);
    let row: serde_json::Value = serde_json::from_str(r.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(
        (row["first_episode"].as_u64(), row["last_episode"].as_u64()),
        (Some(1), Some(5))
    );

    // Five more: an update of the same row, carrying the previous summary.
    let mut more = String::new();
    for i in 0..5 {
        more.push_str(&line(
            "assistant",
            &format!("Rollback step {i}: redeploy the previous image tag."),
        ));
    }
    env.run_stdin(&["ingest", "--session", "s1"], more.as_bytes())
        .assert_ok();
    let gens = server.generations();
    assert_eq!(gens.len(), 2);
    let prompt = gens[1].body["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.starts_with("Current summary:") && prompt.contains("Rollback step 4"),
        "{prompt}"
    );
    assert!(!prompt.contains("Step 0."), "old episodes are not re-sent");
    let chain = env.chain("s1").unwrap();
    assert_covers(&chain, 10);
    assert_eq!(chain["summaries"].as_array().unwrap().len(), 1);

    let text = env.run(&["summaries", "s1"]);
    text.assert_ok();
    assert!(
        text.stdout
            .starts_with("session s1: 10 episodes, 1 summary row, 0 unsummarized"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("episodes 1-10"));
}

#[test]
fn environment_thresholds_are_used() {
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "extractive")
        .with("SUMMARY_MIN_EPISODES", "2")
        .with("SUMMARY_THRESHOLD_TOKENS", "5");
    let input = line(
        "user",
        "Please book the conference room for Thursday afternoon.",
    ) + &line(
        "assistant",
        "The conference room is booked for Thursday at two.",
    );
    env.run_stdin(&["ingest", "--session", "s2"], input.as_bytes())
        .assert_ok();
    assert_covers(&env.chain("s2").unwrap(), 2);
}

#[test]
fn a_bad_line_stops_ingest_but_keeps_what_came_before() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let input = line("user", "first")
        + &line("assistant", "second")
        + "{not json\n"
        + &line("user", "never read");
    let r = env.run_stdin(&["ingest", "--session", "s3"], input.as_bytes());
    r.assert_fails(
        2,
        &["-:3: not valid JSON", "the 2 earlier episodes are stored"],
    );
    assert_eq!(env.chain("s3").unwrap()["episodes"], 2);
}

#[test]
fn summaries_of_an_unknown_session_names_the_known_ones() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    env.run(&["summaries", "nope"])
        .assert_fails(2, &["no session 'nope'", "known sessions: chat"]);
}

#[test]
fn a_failing_model_keeps_every_message_and_the_summary_backs_off() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("ABRIDGE_RETRIES", "1");
    let text = "We compared the two rollout plans and agreed to measure the replica lag budget on staging before Friday.";
    let input: String = (0..12)
        .map(|i| {
            line(
                if i % 2 == 0 { "user" } else { "assistant" },
                &format!("{text} ({i})"),
            )
        })
        .collect();
    server.push_faults([Fault::Status {
        code: 500,
        message: "model crashed".into(),
    }]);
    let r = env.run_stdin(&["ingest", "--session", "f"], input.as_bytes());
    r.assert_fails(
        3,
        &[
            "not refreshed",
            "all 12 episodes are stored",
            "next attempt in",
        ],
    );
    // Every message is stored; the one failed call was not retried message after message.
    let chain = env.chain("f").unwrap();
    assert_eq!(chain["episodes"], 12);
    assert_eq!(chain["summaries"], serde_json::Value::Array(vec![]));
    assert_eq!(server.generations().len(), 1, "no storm while backing off");
    let st = env.run(&["status", "f", "--json"]).json();
    assert_eq!(st[0]["state"], "backing-off", "{st:#}");
    assert_eq!(st[0]["failures"], 1);
    // An explicit refresh tries now, succeeds and clears the marker.
    env.run(&["refresh", "f"]).assert_ok();
    assert_covers(&env.chain("f").unwrap(), 12);
    assert_eq!(env.run(&["status", "f", "--json"]).json()[0]["failures"], 0);
}

#[test]
fn context_runs_a_due_refresh_first_and_says_when_one_waits() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("ABRIDGE_MODE", "idle");
    let mut input = String::new();
    for i in 0..12 {
        input.push_str(&line(
            if i % 2 == 0 { "user" } else { "assistant" },
            &format!("Message {i}: the replica lag, the index rebuild and the rollback plan."),
        ));
    }
    env.run_stdin(&["ingest", "--session", "c"], input.as_bytes())
        .assert_ok();
    assert!(
        server.generations().is_empty(),
        "idle mode summarizes nothing yet"
    );
    // Idle and not quiet long enough: the context is what is stored, and it says a refresh
    // waits.
    let r = env.run(&["context", "c", "--budget", "200", "--pairs", "1", "--json"]);
    r.assert_ok();
    let v = r.json();
    assert_eq!(
        (v["refreshed"].as_bool(), v["covered"].as_u64()),
        (Some(false), Some(0))
    );
    assert!(v["omitted"].as_u64().unwrap() > 0, "{v}");
    assert!(r.stderr.contains("a refresh is due"), "{}", r.stderr);
    assert!(server.generations().is_empty());
    // Eager: many messages beyond the summary are summarized first, through the session's
    // job, and the context then covers them.
    env.run(&["mode", "c", "eager"]).assert_ok();
    let r = env.run(&[
        "context",
        "c",
        "--budget",
        "200",
        "--pairs",
        "1",
        "--json",
        "--refresh-after",
        "4",
    ]);
    r.assert_ok();
    let v = r.json();
    assert_eq!(
        (v["refreshed"].as_bool(), v["covered"].as_u64()),
        (Some(true), Some(12)),
        "{v}"
    );
    assert_eq!(v["omitted"], 0);
    assert_eq!(v["messages"][0]["role"], "system");
    assert!(!server.generations().is_empty());
    let jobs = env.run(&["jobs", "--json"]).json();
    assert_eq!(jobs[0]["state"], "succeeded", "{jobs}");
}

#[test]
fn the_default_mode_folds_only_what_left_the_recent_window_and_the_context_misses_nothing() {
    let server = TestServer::start();
    let env = Env::new()
        .with_default_mode()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    // Sixty messages fed one at a time, a context read after each.
    let long = "The deployment pipeline builds the container image, runs the unit and integration tests, scans the image for known vulnerabilities, signs it, and pushes it to the staging registry.";
    let mut calls_before = 0;
    for i in 0..60 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        env.run_stdin(
            &["ingest", "--session", "s1"],
            line(role, &format!("{long} Step {i}.")).as_bytes(),
        )
        .assert_ok();
        let c = env.run(&["context", "s1", "--budget", "100000", "--json"]);
        c.assert_ok();
        let w = c.json();
        assert_eq!(w["omitted"].as_u64(), Some(0), "message {i}: {w}");
        let calls = server.generations().len();
        if calls > calls_before {
            // A fold never takes the newest 8 messages, and takes a batch at once.
            let last = env.chain("s1").unwrap()["summaries"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()["last_episode"]
                .as_u64()
                .unwrap();
            assert!(last <= i as u64 + 1 - 8, "message {i}: folded up to {last}");
            calls_before = calls;
        }
    }
    let r = env.run(&["mode", "s1"]);
    r.assert_ok();
    assert!(r.stdout.contains("window mode"), "{}", r.stdout);
    let calls = server.generations().len();
    assert!(
        (1..=6).contains(&calls),
        "60 messages folded in a few batches, not every 5 messages: {calls} calls"
    );
}
