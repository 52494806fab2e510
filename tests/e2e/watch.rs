//! `abridge watch DIR`: baseline, incremental import with a partial last line, summaries kept
//! fresh through a model fault (backoff, the good summary kept), Ctrl-C, and restart resume.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

fn line(i: usize) -> String {
    format!(
        "{{\"role\":\"{}\",\"content\":\"Turn {i}: the replica lag budget and the maintenance window for the upgrade\"}}\n",
        if i % 2 == 1 { "user" } else { "assistant" }
    )
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn spawn_watch(env: &Env, dir: &Path, extra: &[&str]) -> Child {
    let d = dir.display().to_string();
    let mut args = vec![
        "watch",
        d.as_str(),
        "--poll-ms",
        "50",
        "--threshold-tokens",
        "20",
        "--min-new-episodes",
        "2",
        "--retries",
        "1",
    ];
    args.extend_from_slice(extra);
    env.command(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn abridge watch")
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// (episodes, last covered episode) of a session, or None before it exists.
fn coverage(env: &Env, session: &str) -> Option<(u64, u64)> {
    let c = env.chain(session)?;
    let covered = c["summaries"]
        .as_array()
        .unwrap()
        .last()
        .map_or(0, |r| r["last_episode"].as_u64().unwrap());
    Some((c["episodes"].as_u64().unwrap(), covered))
}

fn status(env: &Env, session: &str) -> Value {
    let r = env.run(&["status", session, "--json"]);
    r.assert_ok();
    r.json()[0].clone()
}

fn interrupt(child: Child) -> Run {
    let pid = child.id().to_string();
    let ok = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(ok.success());
    Run::from(child.wait_with_output().unwrap())
}

#[test]
fn watch_follows_a_growing_transcript_through_faults_ctrl_c_and_restarts() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("ABRIDGE_REFRESH_RETRY_SECS", "1");
    let dir = env.dir.path().join("projects");
    std::fs::create_dir_all(dir.join("p")).unwrap();
    let file = dir.join("p/s1.jsonl");
    append(&file, &(1..=3).map(line).collect::<String>());

    let child = spawn_watch(&env, &dir, &[]);
    // The existing lines are a baseline: not imported, no model call.
    wait_until("the watcher to start", || env.db().exists());
    std::thread::sleep(Duration::from_millis(300));
    assert!(env.chain("s1").is_none());
    assert!(server.generations().is_empty());

    // Four new turns and a partial fifth: the four are imported and summarized.
    let partial = line(8);
    let (head, tail) = partial.split_at(30);
    append(&file, &((4..=7).map(line).collect::<String>() + head));
    wait_until("the first summary", || coverage(&env, "s1") == Some((4, 4)));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(coverage(&env, "s1"), Some((4, 4)), "the partial line waits");
    let summary = env.chain("s1").unwrap()["summaries"][0]["content"].clone();

    // The line completes and another arrives, but the model fails: the good summary stays,
    // the session backs off, and the next attempt (after a second) succeeds.
    server.push_faults([Fault::Status {
        code: 500,
        message: "model crashed".into(),
    }]);
    append(&file, &(tail.to_string() + &line(9)));
    wait_until("the failed refresh", || status(&env, "s1")["failures"] == 1);
    let st = status(&env, "s1");
    assert_eq!(coverage(&env, "s1"), Some((6, 4)));
    assert_eq!(env.chain("s1").unwrap()["summaries"][0]["content"], summary);
    assert!(st["last_error"].as_str().unwrap().contains("500"), "{st:#}");
    wait_until("the retried refresh", || {
        coverage(&env, "s1") == Some((6, 6))
    });
    assert_eq!(status(&env, "s1")["failures"], 0);

    // Ctrl-C stops cleanly.
    let r = interrupt(child);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("watch: stopped"), "{}", r.stderr);
    assert!(r.stderr.contains("baseline"), "{}", r.stderr);

    // Lines written while it was down are imported after a restart, from the stored offset.
    append(&file, &(10..=11).map(line).collect::<String>());
    let child = spawn_watch(&env, &dir, &[]);
    wait_until("the resumed import", || {
        coverage(&env, "s1") == Some((8, 8))
    });
    // The summary records how far it reaches: its last episode, the bytes of the file read
    // (all of it, here) and the last exchange's own time.
    let row = env.chain("s1").unwrap()["summaries"][0].clone();
    assert_eq!(
        row["source"]["bytes"].as_u64(),
        Some(std::fs::metadata(&file).unwrap().len()),
        "{row:#}"
    );
    assert!(row["covered_until_ms"].as_i64().is_some());
    append(&file, &line(12));
    wait_until("one more line", || {
        coverage(&env, "s1").is_some_and(|c| c.0 == 9)
    });
    let r = interrupt(child);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(coverage(&env, "s1").unwrap().0, 9, "no line imported twice");
}

#[test]
fn backfill_and_idle_mode_in_one_pass() {
    let server = TestServer::start();
    // Settings from the environment hold for every command (watch, status, context).
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama")
        .with("ABRIDGE_MODE", "idle")
        .with("SUMMARY_THRESHOLD_TOKENS", "20");
    let dir = env.dir.path().join("projects");
    std::fs::create_dir_all(&dir).unwrap();
    // An old conversation (quiet for years) and a live one (last turn just now).
    let old: String = (1..=6)
        .map(|i| {
            format!(
                "{{\"role\":\"{}\",\"content\":\"Old turn {i} about the billing export\",\"timestamp\":\"2024-01-01T10:0{i}:00Z\"}}\n",
                if i % 2 == 1 { "user" } else { "assistant" }
            )
        })
        .collect();
    append(&dir.join("old.jsonl"), &old);
    append(
        &dir.join("live.jsonl"),
        &(1..=6).map(line).collect::<String>(),
    );
    let d = dir.display().to_string();
    let args = ["watch", d.as_str(), "--once", "--backfill"];
    env.run(&args).assert_ok();
    // The quiet one was summarized; the live one waits for an hour of quiet, with no call.
    assert_eq!(coverage(&env, "old"), Some((6, 6)));
    assert_eq!(coverage(&env, "live"), Some((6, 0)));
    let st = status(&env, "live");
    assert_eq!(st["state"], "waiting", "{st:#}");
    assert!(st["due_at_ms"].as_u64().is_some());
    let calls = server.generations().len();
    env.run(&args).assert_ok();
    assert_eq!(
        server.generations().len(),
        calls,
        "nothing changed: no call"
    );
    // A session can have its own mode: eager makes the live one due at once; default returns
    // it to the global idle mode.
    env.run(&["mode", "live", "eager"]).assert_ok();
    let st = status(&env, "live");
    assert_eq!(
        (st["mode"].as_str(), st["state"].as_str()),
        (Some("eager"), Some("due")),
        "{st:#}"
    );
    let r = env.run(&["mode", "live", "default"]);
    r.assert_ok();
    assert!(r.stdout.contains("idle mode"), "{}", r.stdout);
    assert_eq!(status(&env, "live")["mode"], "idle");
    // With a one-second window it is idle a moment later.
    std::thread::sleep(Duration::from_millis(1100));
    let mut quick = args.to_vec();
    quick.extend(["--quiescence-secs", "1"]);
    env.run(&quick).assert_ok();
    assert_eq!(coverage(&env, "live"), Some((6, 6)));
    // A history that fits the budget is the context, verbatim; one that does not gets the
    // summary first, within the budget, and saves tokens.
    let r = env.run(&[
        "context", "live", "--budget", "2000", "--pairs", "1", "--json",
    ]);
    r.assert_ok();
    let c = r.json();
    let whole = c["full_tokens"].as_u64().unwrap();
    assert_eq!(c["tokens"].as_u64(), Some(whole), "{c}");
    assert_ne!(c["messages"][0]["role"], "system");
    let budget = (whole - 1).to_string();
    let r = env.run(&[
        "context", "live", "--budget", &budget, "--pairs", "1", "--json",
    ]);
    r.assert_ok();
    let c = r.json();
    assert!(c["tokens"].as_u64().unwrap() < whole, "{c}");
    assert_eq!(c["messages"][0]["role"], "system", "{c}");
    // reset clears the session.
    env.run(&["reset", "live"]).assert_ok();
    assert!(env.chain("live").is_none());
}

#[test]
fn a_file_that_appears_while_watching_is_imported_whole() {
    let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
    let dir = env.dir.path().join("projects");
    std::fs::create_dir_all(dir.join("p")).unwrap();
    // There at the start: a baseline, not imported.
    append(
        &dir.join("p/old.jsonl"),
        &(1..=3).map(line).collect::<String>(),
    );
    let child = spawn_watch(&env, &dir, &[]);
    wait_until("the watcher to start", || env.db().exists());
    std::thread::sleep(Duration::from_millis(300));
    // A new session file, written elsewhere and moved into place already holding lines (as a
    // new Claude Code session or a copied file): every line is imported, nothing baselined.
    let outside = env.dir.path().join("c.jsonl");
    append(&outside, &(1..=6).map(line).collect::<String>());
    std::fs::rename(&outside, dir.join("p/c.jsonl")).unwrap();
    wait_until("the new file's six messages", || {
        coverage(&env, "c").is_some_and(|(n, _)| n == 6)
    });
    let out = interrupt(child);
    assert!(
        env.chain("old").is_none(),
        "the file present at the start was imported"
    );
    assert!(
        !out.stderr.contains("c.jsonl — baseline"),
        "the new file was baselined: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("old.jsonl — baseline"),
        "{}",
        out.stderr
    );
}
