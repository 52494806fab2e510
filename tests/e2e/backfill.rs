//! `abridge backfill DIR`: a Claude Code projects tree imported and summarized; filters, dry
//! run, and re-runs that do no work for unchanged files.

use std::path::Path;

use serde_json::Value;

use crate::harness::*;

/// DIR/alpha/{claude-code.jsonl, chat.jsonl}, DIR/beta/openai.json, DIR/beta/notes.json (not a
/// transcript), DIR/.hidden/x.jsonl (ignored).
fn projects(env: &Env) -> String {
    let root = env.dir.path().join("projects");
    for d in ["alpha", "beta", ".hidden"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let copy = |from: &str, to: &str| {
        std::fs::copy(fixture(from), root.join(to)).unwrap();
    };
    copy("claude-code.jsonl", "alpha/claude-code.jsonl");
    copy("chat.jsonl", "alpha/chat.jsonl");
    copy("openai.json", "beta/openai.json");
    copy("chat.jsonl", ".hidden/x.jsonl");
    std::fs::write(root.join("beta/notes.json"), r#"{"title": "not a chat"}"#).unwrap();
    root.display().to_string()
}

fn backfill(env: &Env, dir: &str, extra: &[&str]) -> (Run, Value) {
    let mut args = vec!["backfill", dir, "--json"];
    args.extend_from_slice(extra);
    let r = env.run(&args);
    let v = serde_json::from_str(r.stdout.trim()).unwrap_or(Value::Null);
    (r, v)
}

fn statuses(v: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["file"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_projects_tree_is_summarized_once_and_rerun_does_no_work() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let dir = projects(&env);

    // A dry run plans without calling the model or creating the database.
    let (r, v) = backfill(
        &env,
        &dir,
        &["--dry-run", "--price-in", "1", "--price-out", "2"],
    );
    r.assert_ok();
    assert!(!env.db().exists(), "a dry run stores nothing");
    assert!(server.generations().is_empty());
    assert_eq!(v["counts"]["planned"], 3, "{v:#}");
    assert!(v["totals"]["calls"].as_u64().unwrap() >= 3);
    assert!(v["totals"]["cost_usd"].as_f64().unwrap() > 0.0);

    let (r, v) = backfill(&env, &dir, &[]);
    r.assert_ok();
    let sep = std::path::MAIN_SEPARATOR;
    let f = |p: &str| p.replace('/', &sep.to_string());
    assert_eq!(
        statuses(&v),
        vec![
            (f("alpha/chat.jsonl"), "ok".into()),
            (f("alpha/claude-code.jsonl"), "ok".into()),
            (f("beta/notes.json"), "skipped".into()),
            (f("beta/openai.json"), "ok".into()),
        ]
    );
    let calls = server.generations().len();
    assert!(calls >= 3);
    // Each session's chain covers all its episodes.
    for r in v["results"].as_array().unwrap() {
        if r["status"] == "ok" {
            let chain = env.chain(r["session"].as_str().unwrap()).unwrap();
            assert_covers(&chain, r["episodes"].as_u64().unwrap());
        }
    }

    // Again: nothing changed, nothing is read or called.
    let (r, v) = backfill(&env, &dir, &[]);
    r.assert_ok();
    assert_eq!(v["counts"]["unchanged"], 4, "{v:#}");
    assert_eq!(server.generations().len(), calls);

    // A file that grew is imported again and its summary refreshed; the others stay put.
    let grown = Path::new(&dir).join("alpha/chat.jsonl");
    let mut text = std::fs::read_to_string(&grown).unwrap();
    for i in 0..6 {
        text.push_str(&format!(
            "{{\"role\":\"user\",\"content\":\"A later question number {i} about the replica lag.\"}}\n"
        ));
    }
    std::fs::write(&grown, text).unwrap();
    let (r, v) = backfill(&env, &dir, &[]);
    r.assert_ok();
    assert_eq!(v["counts"]["ok"], 1, "{v:#}");
    assert_eq!(v["counts"]["unchanged"], 3, "{v:#}");
    assert!(server.generations().len() > calls);
    assert_covers(&env.chain("chat").unwrap(), 18);
}

#[test]
fn filters_limit_and_failures() {
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let dir = projects(&env);
    let (r, v) = backfill(&env, &dir, &["--match", "*alpha*claude*"]);
    r.assert_ok();
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v:#}");
    let (_, v) = backfill(&env, &dir, &["--match", "beta", "--dry-run"]);
    assert_eq!(v["results"].as_array().unwrap().len(), 2, "{v:#}");
    let (_, v) = backfill(&env, &dir, &["--limit", "2", "--dry-run"]);
    assert_eq!(v["results"].as_array().unwrap().len(), 2, "{v:#}");
    let (_, v) = backfill(&env, &dir, &["--since", "2000-01-01", "--dry-run"]);
    assert_eq!(v["results"].as_array().unwrap().len(), 4, "{v:#}");
    let (_, v) = backfill(&env, &dir, &["--since", "1d", "--dry-run"]);
    assert_eq!(v["results"].as_array().unwrap().len(), 4, "{v:#}");
    // The chat fixture has 12 episodes: over the minimum, it is skipped.
    let (r, v) = backfill(
        &env,
        &dir,
        &["--match", "alpha/chat", "--min-episodes", "13"],
    );
    r.assert_ok();
    assert_eq!(v["results"][0]["status"], "skipped", "{v:#}");
    env.run(&["backfill", &dir, "--since", "yesterday"])
        .assert_fails(2, &["--since \"yesterday\" is not a date"]);
    env.run(&["backfill", "/nonexistent/dir"])
        .assert_fails(2, &["cannot open the directory"]);

    // A file with a malformed line fails alone; the others succeed; the exit says so.
    let bad = Path::new(&dir).join("beta/broken.jsonl");
    std::fs::write(&bad, "{\"role\":\"user\",\"content\":\"hi\"}\nnot json\n").unwrap();
    let (r, v) = backfill(&env, &dir, &[]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("1 file(s) failed"), "{}", r.stderr);
    let failed: Vec<_> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0]["detail"]
            .as_str()
            .unwrap()
            .contains("broken.jsonl:2")
    );
    assert_eq!(v["counts"]["ok"], 2, "{v:#}");
}
