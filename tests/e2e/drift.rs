//! Summaries that do not drift, through the binary: the ledger and the second level in the
//! store, `summaries --all`, `expand`, `focus`, `pin`, and the backlog trigger.

use serde_json::Value;

use crate::harness::*;

fn line(role: &str, text: &str) -> String {
    serde_json::json!({"role": role, "content": text}).to_string() + "\n"
}

fn turns(from: usize, to: usize) -> String {
    (from..=to)
        .map(|i| {
            line(
                if i % 2 == 1 { "user" } else { "assistant" },
                &format!(
                    "Message {i}: the change to src/mod{i}.rs for ticket #{} is ready; the build took {} ms on v1.{i}.0.",
                    500 + i,
                    40 + i
                ),
            )
        })
        .collect()
}

fn json_of(r: &Run) -> Value {
    serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

#[test]
fn compacted_rows_stay_readable_and_every_row_expands_to_its_exact_episodes() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("SUMMARY_MAX_TOKENS", "30")
        .with("SUMMARY_BUDGET_TOKENS", "200");
    env.run_stdin(&["ingest", "--session", "d"], turns(1, 80).as_bytes())
        .assert_ok();
    env.run(&["refresh", "d"]).assert_ok();
    let all = json_of(env.run(&["summaries", "d", "--all", "--json"]).assert_ok());
    let rows = all["summaries"].as_array().unwrap();
    let active = env.chain("d").unwrap();
    assert_covers(&active, 80);
    let earlier: Vec<&Value> = rows
        .iter()
        .filter(|r| r["level"].as_u64() > Some(0))
        .collect();
    assert!(!earlier.is_empty(), "a second level was written: {all}");
    let compacted = rows
        .iter()
        .filter(|r| !r["compacted_into"].is_null())
        .count();
    assert!(compacted >= 2);
    assert_eq!(
        rows.len(),
        active["summaries"].as_array().unwrap().len() + compacted
    );
    // Each row, compacted or not, expands to exactly the episodes it covers.
    for r in rows {
        let id = r["id"].as_u64().unwrap().to_string();
        let x = json_of(env.run(&["expand", "d", &id, "--json"]).assert_ok());
        let ids = expanded_ids(&x);
        let (a, b) = (
            r["first_episode"].as_u64().unwrap(),
            r["last_episode"].as_u64().unwrap(),
        );
        assert_eq!(ids, (a..=b).collect::<Vec<_>>());
    }
    // A ledger entry leads back to its episode.
    let latest = active["summaries"].as_array().unwrap().last().unwrap();
    let entry = latest["ledger"].as_array().unwrap().last().unwrap();
    let text = entry["text"].as_str().unwrap();
    let id = latest["id"].as_u64().unwrap().to_string();
    let x = json_of(
        env.run(&["expand", "d", &id, "--identifier", text, "--json"])
            .assert_ok(),
    );
    assert_eq!(x["episodes"][0]["id"], entry["episode"]);
    assert!(x["episodes"][0]["content"].as_str().unwrap().contains(text));
    // An unknown row is refused with what to do.
    let r = env.run(&["expand", "d", "9999"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("summaries d --all"), "{}", r.stderr);
    // The context covers everything within its budget, the ledger included.
    let c = json_of(
        env.run(&["context", "d", "--budget", "1500", "--json"])
            .assert_ok(),
    );
    assert_eq!(c["covered_from"], 1, "{c}");
    assert_eq!(c["omitted_ranges"], serde_json::json!([]), "{c}");
    assert!(c["tokens"].as_u64().unwrap() <= 1500);
    assert!(c["identifiers"].as_u64().unwrap() > 0, "{c}");
    assert!(c["level"].as_u64().unwrap() >= 1);
}

/// A fold prompt puts what stays from one fold to the next first (the instructions and the
/// session's focus, then the previous summary) and the new episodes last, so a local runner's
/// KV cache serves chained folds: each fold after the first shares at least the instructions
/// and the focus with the one before, and its new episodes come after every shared character.
#[test]
fn chained_fold_prompts_share_what_stays_first() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    env.run_stdin(&["ingest", "--session", "k"], turns(1, 6).as_bytes())
        .assert_ok();
    let focus = "keep every decision about the release and the file paths it touches";
    env.run(&["focus", "k", focus]).assert_ok();
    let before = server.generations().len();
    for (a, b) in [(7, 20), (21, 34), (35, 48), (49, 62)] {
        env.run_stdin(&["ingest", "--session", "k"], turns(a, b).as_bytes())
            .assert_ok();
    }
    let gens = server.generations();
    let shares = server.prefix_shares();
    assert!(gens.len() >= before + 3, "{} folds", gens.len() - before);
    for (g, s) in gens.iter().zip(&shares).skip(before + 1) {
        let system = g.body["messages"][0]["content"].as_str().unwrap();
        let user = g.body["messages"][1]["content"].as_str().unwrap();
        // The focus is part of the instructions, not after the conversation.
        assert!(system.ends_with(focus), "{system}");
        assert!(
            s.shared > system.chars().count(),
            "a fold shares {} of {} characters with the one before: {system}",
            s.shared,
            s.total
        );
        // The new exchanges are last: the shared prefix ends before them.
        if let Some(at) = user.find("New exchanges:") {
            let new_from = system.chars().count() + 1 + user[..at].chars().count();
            assert!(s.shared <= new_from, "{} > {new_from}", s.shared);
        }
    }
}

/// Which session settings a fold honours is the app's choice, not the front end's: `refresh`,
/// `summarize`, `backfill` and the hooks (which hand the app a configuration of their own) and
/// `POST …/refresh` all fold with the session's own focus. Each session is summarized offline
/// first and given a focus; then each front end, with the model, folds it (rewriting the
/// offline rows, or folding what was added since), and every prompt it sends ends with the
/// focus.
#[test]
fn every_front_end_folds_with_the_session_focus() {
    use crate::serve::{Server, request, wait_job};
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let offline = |args: &[&str]| {
        let mut all = vec!["--backend", "extractive"];
        all.extend_from_slice(args);
        env.run(&all).assert_ok().stdout.clone()
    };
    let focus = |session: &str| {
        let f = format!("keep the release decisions of {session} and every file path");
        env.run(&["focus", session, &f]).assert_ok();
        f
    };
    // Every prompt sent since `before` ends with the focus, and there was one at least.
    let folded_with = |what: &str, before: usize, focus: &str| {
        let gens = server.generations();
        assert!(gens.len() > before, "{what} asked the model nothing");
        for g in &gens[before..] {
            let system = g.body["messages"][0]["content"].as_str().unwrap_or("");
            assert!(
                system.ends_with(focus),
                "{what} sent a fold prompt without the session's focus: {system}"
            );
        }
    };
    let claude = |session: &str, from: usize, to: usize| -> String {
        (from..=to)
            .map(|i| {
                let role = if i % 2 == 1 { "user" } else { "assistant" };
                serde_json::json!({"type": role, "uuid": format!("{session}-{i}"), "sessionId": session,
                    "message": {"role": role, "content": format!("Message {i}: src/mod{i}.rs for ticket #{} ships in v1.{i}.0.", 500 + i)}})
                .to_string()
                    + "\n"
            })
            .collect()
    };
    let append = |path: &std::path::Path, text: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };

    // `abridge refresh`: the offline rows rewritten by the model.
    env.run_stdin(
        &["--backend", "extractive", "ingest", "--session", "r"],
        turns(1, 30).as_bytes(),
    )
    .assert_ok();
    let f = focus("r");
    let before = server.generations().len();
    env.run(&["refresh", "r"]).assert_ok();
    folded_with("abridge refresh", before, &f);

    // `abridge summarize FILE`: run again once the file has grown.
    let file = env.write("sum.jsonl", turns(1, 30));
    let path = file.display().to_string();
    offline(&["summarize", &path, "--session", "sum"]);
    let f = focus("sum");
    append(&file, &turns(31, 50));
    let before = server.generations().len();
    env.run(&["summarize", &path, "--session", "sum"])
        .assert_ok();
    folded_with("abridge summarize", before, &f);

    // `abridge backfill DIR`: run again once a transcript in it has grown.
    let dir = env.dir.path().join("projects/-home-me-app");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bf-1.jsonl");
    std::fs::write(&file, claude("bf-1", 1, 30)).unwrap();
    let root = env.dir.path().join("projects").display().to_string();
    let v: Value = serde_json::from_str(offline(&["backfill", &root, "--json"]).trim()).unwrap();
    let session = v["results"][0]["session"].as_str().unwrap().to_string();
    let f = focus(&session);
    append(&file, &claude("bf-1", 31, 50));
    let before = server.generations().len();
    env.run(&["backfill", &root]).assert_ok();
    folded_with("abridge backfill", before, &f);

    // `abridge hook` (Claude Code's PreCompact): the transcript summarized offline by an
    // earlier hook, then grown.
    let file = env.write("hook-1.jsonl", claude("hook-1", 1, 30));
    let payload = |event: &str| {
        serde_json::json!({"session_id": "hook-1", "transcript_path": file, "cwd": "/project",
            "hook_event_name": event})
        .to_string()
    };
    env.run_stdin(
        &["--backend", "extractive", "hook"],
        payload("Stop").as_bytes(),
    )
    .assert_ok();
    let f = focus("hook-1");
    append(&file, &claude("hook-1", 31, 50));
    let before = server.generations().len();
    env.run_stdin(&["hook"], payload("PreCompact").as_bytes())
        .assert_ok();
    folded_with("abridge hook", before, &f);

    // `POST /v1/sessions/{id}/refresh` on `abridge serve`.
    env.run_stdin(
        &["--backend", "extractive", "ingest", "--session", "p"],
        turns(1, 30).as_bytes(),
    )
    .assert_ok();
    let f = focus("p");
    let before = server.generations().len();
    let srv = Server::start(&env, &[]);
    let job = request(&srv.addr, "POST", "/v1/sessions/p/refresh", None, b"").expect(202);
    let done = wait_job(&srv.addr, None, job["id"].as_u64().unwrap());
    assert_eq!(done["state"], "succeeded", "{done}");
    folded_with("POST …/refresh", before, &f);
}

#[test]
fn focus_reaches_the_fold_prompt_and_pins_stay_in_the_context() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    env.run_stdin(&["ingest", "--session", "f"], turns(1, 6).as_bytes())
        .assert_ok();
    let r = env.run(&["focus", "f", "keep decisions and file paths"]);
    assert!(
        r.assert_ok()
            .stdout
            .contains("keep decisions and file paths")
    );
    let before = server.generations().len();
    env.run_stdin(&["ingest", "--session", "f"], turns(7, 40).as_bytes())
        .assert_ok();
    let gens = server.generations();
    assert!(gens.len() > before);
    for g in &gens[before..] {
        assert!(g.body.to_string().contains("keep decisions and file paths"));
    }
    // Pin the first message; a small context keeps it verbatim.
    env.run(&["pin", "f", "1"]).assert_ok();
    assert!(env.run(&["pin", "f"]).assert_ok().stdout.contains("1"));
    let c = json_of(
        env.run(&["context", "f", "--budget", "500", "--json"])
            .assert_ok(),
    );
    assert_eq!(c["pinned"], 1, "{c}");
    assert!(
        c["messages"]
            .to_string()
            .contains("Message 1: the change to src/mod1.rs")
    );
    // Pinning an episode that does not exist is refused.
    let r = env.run(&["pin", "f", "999"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("no episode 999"), "{}", r.stderr);
    env.run(&["pin", "f", "1", "--remove"]).assert_ok();
    env.run(&["focus", "f", "--clear"]).assert_ok();
    assert!(
        env.run(&["focus", "f"])
            .assert_ok()
            .stdout
            .contains("no focus")
    );
    // Window mode per session.
    assert!(
        env.run(&["mode", "f", "window"])
            .assert_ok()
            .stdout
            .contains("window")
    );
}

#[test]
fn two_huge_messages_are_summarized_and_the_context_says_what_it_covers() {
    let env = Env::new().with("EXTRACTION_URL", &closed_port_url());
    let big = |w: &str| format!("{} ", w).repeat(3500);
    let input = line("user", &format!("First. {}", big("alpha beta gamma.")))
        + &line("assistant", &format!("Second. {}", big("delta epsilon.")));
    env.run_stdin(&["ingest", "--session", "h"], input.as_bytes())
        .assert_ok();
    // Two episodes never reach min-episodes, but their backlog is over the limit: summarized.
    assert_covers(&env.chain("h").unwrap(), 2);
    let r = env.run(&["context", "h", "--budget", "2000"]);
    assert!(
        r.assert_ok().stderr.contains("covers episodes 1-2"),
        "{}",
        r.stderr
    );
}

/// The held-out case of issue #25: an 800-message conversation with 40 planted identifiers,
/// read back at a 3,000-token budget. Rows keep every identifier; the context fills the room
/// its summary and recent messages leave with them, so all 40 are there.
#[test]
fn every_planted_identifier_is_in_a_context_whose_budget_can_hold_them() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let topics = [
        "the launch plan",
        "the budget review",
        "hiring",
        "the offsite",
    ];
    let planted: Vec<String> = (0..40)
        .map(|k| match k % 4 {
            0 => format!("services/billing/handler{k}.rs"),
            1 => format!("OPS-{}", 4100 + k),
            2 => format!("v3.{k}.1"),
            _ => format!("https://wiki.example.org/runbook{k}"),
        })
        .collect();
    let text: String = (1..=800usize)
        .map(|i| {
            let role = if i % 2 == 1 { "user" } else { "assistant" };
            let mut t = format!(
                "Message {i}: some thoughts on {} and what we decided about it this week.",
                topics[i % 4]
            );
            if i % 20 == 7 {
                t.push_str(&format!(" Remember {} for later.", planted[i / 20]));
            }
            line(role, &t)
        })
        .collect();
    env.run_stdin(&["ingest", "--session", "held"], text.as_bytes())
        .assert_ok();
    env.run(&["refresh", "held"]).assert_ok();
    let r = env.run(&["context", "held", "--budget", "3000", "--json"]);
    let c = json_of(r.assert_ok());
    assert!(c["tokens"].as_u64().unwrap() <= 3000, "{c}");
    let shown = c.to_string();
    let missing: Vec<&String> = planted
        .iter()
        .filter(|p| !shown.contains(p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of 40 identifiers missing in {} tokens: {missing:?}",
        missing.len(),
        c["tokens"]
    );
    assert!(!shown.contains("left out for the budget"), "{c}");
}
