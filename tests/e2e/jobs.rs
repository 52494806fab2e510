//! Durable jobs: crash and resume, one run per idempotency key, cancellation, progress.

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use abridge_test_llm::{LoggedRequest, Options};
use serde_json::Value;

use crate::harness::*;

/// A long conversation: `n` episodes of about 60 words each, without ids.
fn long_transcript(env: &Env, name: &str, n: usize) -> String {
    let mut s = String::new();
    for i in 1..=n {
        let role = if i % 2 == 1 { "user" } else { "assistant" };
        let text = format!(
            "Message {i} marker-{i}: {}",
            "the migration plan covers tables indexes and the replica lag budget ".repeat(6)
        );
        s.push_str(&serde_json::json!({"role": role, "content": text}).to_string());
        s.push('\n');
    }
    env.write(name, s).display().to_string()
}

fn system(g: &LoggedRequest) -> String {
    g.body["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Map prompts by their conversation text, with how often each was asked.
fn maps(gens: &[LoggedRequest]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for g in gens
        .iter()
        .filter(|g| system(g).starts_with("You write summaries"))
    {
        *m.entry(g.body["messages"][1]["content"].to_string())
            .or_default() += 1;
    }
    m
}

fn slow_server(ms: u64) -> TestServer {
    TestServer::start_with(Options {
        delay: Duration::from_millis(ms),
        ..Options::default()
    })
}

fn spawn_summarize(env: &Env, file: &str, extra: &[&str]) -> Child {
    let mut args = vec!["summarize", file];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    env.command(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn abridge")
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn jobs(env: &Env) -> Vec<Value> {
    let r = env.run(&["jobs", "--json"]);
    r.assert_ok();
    r.json().as_array().unwrap().clone()
}

#[test]
fn kill_9_mid_job_then_restart_resumes_with_cached_partials_and_loses_nothing() {
    let server = slow_server(60);
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let file = long_transcript(&env, "long.jsonl", 300);
    let mut child = spawn_summarize(&env, &file, &[]);
    wait_for("ten map answers", || server.generations().len() >= 12);
    child.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix.
    child.wait().unwrap();
    let first = server.generations();

    // The job is left running under a dead worker; nothing was summarized, nothing lost.
    let js = jobs(&env);
    assert_eq!(js.len(), 1, "{js:#?}");
    assert_eq!(js[0]["state"], "running");
    assert_eq!(js[0]["attempts"], 1);
    let chain = env.chain("long").expect("episodes stored");
    assert_eq!(chain["episodes"], 300);
    assert_eq!(chain["summaries"], Value::Array(vec![]));

    // Restart: the job resumes (attempt 2) and finishes.
    let id = js[0]["id"].as_u64().unwrap();
    let r = env.run(&["jobs", "run", "--json"]);
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!("resuming job {id}")),
        "{}",
        r.stderr
    );
    let done: Value = serde_json::from_str(r.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["attempts"], 2);

    // Every episode is covered exactly once, nothing skipped.
    let chain = env.chain("long").unwrap();
    assert_covers(&chain, 300);
    assert_eq!(chain["summaries"][0]["skipped"], Value::Array(vec![]));
    // Answers that arrived before the kill were cached: at most the two requests in flight
    // (concurrency 2) are asked again.
    let all = server.generations();
    let (before, after) = (maps(&first), maps(&all[first.len()..]));
    let repeated = after.keys().filter(|k| before.contains_key(*k)).count();
    assert!(
        before.len() >= 10 && repeated <= 2,
        "{} maps before the kill, {repeated} asked again",
        before.len()
    );
    // Each chunk's text went to the model, and each episode sits in exactly one chunk.
    let union: String = maps(&all).keys().cloned().collect();
    for i in [1, 77, 150, 299, 300] {
        assert_eq!(
            union.matches(&format!("marker-{i}:")).count(),
            1,
            "episode {i}"
        );
    }
    // Nothing is left to run.
    let r = env.run(&["jobs", "run"]);
    r.assert_ok();
    assert!(r.stderr.contains("no queued or interrupted jobs"));
}

#[test]
fn the_same_work_asked_twice_at_once_runs_once() {
    // Slow enough that the first run is still going when the second one asks (over a second).
    let server = slow_server(100);
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let file = long_transcript(&env, "twice.jsonl", 240);
    let a = spawn_summarize(&env, &file, &[]);
    wait_for("the first job to start", || {
        !server.generations().is_empty()
    });
    let b = spawn_summarize(&env, &file, &[]);
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (ra, rb) = (Run::from(a), Run::from(b));
    ra.assert_ok();
    rb.assert_ok();
    assert!(
        rb.stderr.contains("joining it") && rb.stderr.contains("waiting for it"),
        "{}",
        rb.stderr
    );
    assert_eq!(ra.stdout, rb.stdout, "both print the one summary");
    assert_eq!(jobs(&env).len(), 1);
    let m = maps(&server.generations());
    assert!(
        m.values().all(|&n| n == 1),
        "a chunk was asked twice: {m:?}"
    );
    assert_covers(&env.chain("twice").unwrap(), 240);
}

#[test]
fn a_cancelled_job_writes_nothing_and_a_rerun_reuses_its_answers() {
    let server = slow_server(80);
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let file = long_transcript(&env, "cancel.jsonl", 200);
    let child = spawn_summarize(&env, &file, &[]);
    wait_for("six answers", || server.generations().len() >= 6);
    let id = jobs(&env)[0]["id"].as_u64().unwrap().to_string();
    let r = env.run(&["jobs", "cancel", &id]);
    r.assert_ok();
    assert!(r.stdout.contains("cancel requested"), "{}", r.stdout);
    let out = Run::from(child.wait_with_output().unwrap());
    out.assert_fails(
        3,
        &[&format!("job {id} was cancelled"), "nothing was written"],
    );
    let js = jobs(&env);
    assert_eq!(js[0]["state"], "cancelled");
    assert_eq!(
        env.chain("cancel").unwrap()["summaries"],
        Value::Array(vec![])
    );
    // Cancelling it again is refused; a rerun is a new job that reuses the cached answers.
    env.run(&["jobs", "cancel", &id])
        .assert_fails(2, &["already cancelled"]);
    let asked = server.generations().len();
    let mut args = vec!["summarize", file.as_str()];
    args.extend_from_slice(SMALL);
    env.run(&args).assert_ok();
    let again = maps(&server.generations()[asked..]);
    let before = maps(&server.generations()[..asked]);
    assert!(again.keys().filter(|k| before.contains_key(*k)).count() <= 2);
    assert_covers(&env.chain("cancel").unwrap(), 200);
    let js = jobs(&env);
    assert_eq!(js.len(), 2);
    assert_eq!(js[0]["state"], "succeeded");
    env.run(&["jobs", "show", &js[0]["id"].to_string()])
        .assert_ok();
    env.run(&["jobs", "show", "9"])
        .assert_fails(2, &["no job 9"]);
}

#[test]
fn progress_goes_to_stderr_as_lines_off_a_terminal_and_not_with_json() {
    let server = slow_server(5);
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let file = long_transcript(&env, "progress.jsonl", 120);
    let mut args = vec!["summarize", file.as_str()];
    args.extend_from_slice(SMALL);
    let r = env.run(&args);
    r.assert_ok();
    assert!(
        r.stderr.contains(" (session progress): map ")
            && r.stderr.contains("chunks 100%")
            && r.stderr.contains("reduce level 1"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains('\r'), "no bar off a terminal");

    let env2 = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let file = long_transcript(&env2, "progress.jsonl", 120);
    let mut args = vec!["summarize", file.as_str(), "--json"];
    args.extend_from_slice(SMALL);
    let r = env2.run(&args);
    r.assert_ok();
    assert!(!r.stderr.contains("chunks"), "{}", r.stderr);
    assert_covers(&r.json(), 120);
}

/// A job of the local tenant (the command line's): a message in session `mine`, refreshed.
fn local_job(env: &crate::harness::Env) {
    env.run_stdin(
        &["ingest", "--session", "mine", "-"],
        b"{\"role\": \"user\", \"content\": \"deploy the api on friday\"}\n",
    )
    .assert_ok();
    env.run(&["refresh", "mine"]).assert_ok();
}

/// `abridge jobs` aligns its id column with the widest id, and `jobs show` names no model for
/// an extractive run.
#[test]
fn the_job_list_is_aligned_and_an_extractive_job_names_no_model() {
    let env = crate::harness::Env::new().with("ABRIDGE_BACKEND", "extractive");
    local_job(&env);
    let out = env.run(&["jobs"]).assert_ok().stdout.clone();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 2, "{out}");
    let state_at = |l: &str, w: &str| l.find(w).unwrap_or_else(|| panic!("{w} in {l}"));
    assert_eq!(
        state_at(lines[0], "state"),
        state_at(lines[1], "succeeded"),
        "{out}"
    );
    let id = lines[1].split_whitespace().next().unwrap();
    let show = env.run(&["jobs", "show", id]).assert_ok().stdout.clone();
    assert!(show.contains("model:     none (extractive"), "{show}");
    assert!(!show.contains("qwen"), "{show}");
    let v = env.run(&["jobs", "show", id, "--json"]).assert_ok().json();
    assert_eq!(v["model"], "extractive");
}

/// The command line is the `local` tenant: `abridge jobs` lists its jobs only, never another
/// tenant's (nor the separator of tenant-scoped names).
#[test]
fn the_job_list_shows_the_local_tenants_jobs_only() {
    let env = crate::serve::extractive();
    let acme = crate::serve::token(&env, "acme", &[]);
    let srv = crate::serve::Server::start(&env, &[]);
    crate::serve::post_messages(
        &srv.addr,
        Some(&acme),
        "big1",
        &serde_json::json!({"role": "user", "content": "deploy the api on friday"}),
    )
    .expect(202);
    crate::serve::request(
        &srv.addr,
        "POST",
        "/v1/sessions/big1/refresh",
        Some(&acme),
        b"{}",
    );
    // The other tenant has a job in the same database.
    let theirs = crate::serve::get(&srv.addr, "/v1/jobs", Some(&acme)).expect(200);
    assert!(!theirs["jobs"].as_array().unwrap().is_empty(), "{theirs}");
    drop(srv);
    local_job(&env);
    let out = env.run(&["jobs"]).assert_ok().stdout.clone();
    assert!(out.contains("mine"), "{out}");
    assert!(!out.contains("big1") && !out.contains('\u{1f}'), "{out}");
    let v = env.run(&["jobs", "--json"]).assert_ok().json();
    assert!(
        v.as_array().unwrap().iter().all(|j| j["session"] == "mine"),
        "{v}"
    );
}
