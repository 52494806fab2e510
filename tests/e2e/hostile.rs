//! Hostile input found by probing a real machine: cyclic exports, link loops, endless input,
//! pathological lines, same-named files, re-imports, escape sequences, concurrent openers,
//! other programs' databases, a closed stdout. Each test failed before its fix.

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;

use crate::harness::*;

fn extractive() -> Env {
    Env::new().with("ABRIDGE_BACKEND", "extractive")
}

fn chat_lines(n: usize, topic: &str) -> String {
    (1..=n)
        .map(|i| {
            format!(
                "{{\"role\":\"{}\",\"content\":\"Message {i} about {topic}: the index rebuild, the replica lag and the rollback plan.\"}}\n",
                if i % 2 == 1 { "user" } else { "assistant" }
            )
        })
        .collect()
}

fn sessions(env: &Env) -> Vec<(String, u64)> {
    if !env.db().exists() {
        return Vec::new();
    }
    let db = rusqlite::Connection::open(env.db()).unwrap();
    let mut st = db
        .prepare("SELECT session, count(*) FROM episodes GROUP BY session ORDER BY session")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn a_chatgpt_export_whose_children_form_a_cycle_ends() {
    let env = extractive();
    // No current_node, and n2's child points back at n1: following the last child loops.
    let export = r#"[{"id":"cyc","title":"Loop","mapping":{
        "root":{"id":"root","parent":null,"children":["n1"],"message":null},
        "n1":{"id":"n1","parent":"root","children":["n2"],"message":{"id":"n1","author":{"role":"user"},"content":{"content_type":"text","parts":["How do I rotate the keys?"]}}},
        "n2":{"id":"n2","parent":"n1","children":["n1"],"message":{"id":"n2","author":{"role":"assistant"},"content":{"content_type":"text","parts":["Create the new key, deploy it, then retire the old one."]}}}}}]"#;
    let dir = env.dir.path().join("export");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("conversations.json");
    std::fs::write(&file, export).unwrap();
    let f = file.display().to_string();
    let d = dir.display().to_string();
    for args in [
        vec!["summarize", f.as_str(), "--dry-run"],
        vec!["summarize", f.as_str()],
        vec!["backfill", d.as_str()],
    ] {
        let r = env.run_within(60, &args);
        r.assert_ok();
        assert!(r.stderr.contains("cycle"), "{args:?}: {}", r.stderr);
    }
    assert_eq!(sessions(&env), vec![("cyc".to_string(), 2)]);
}

#[test]
fn symlink_loops_under_backfill_and_watch_end_and_links_out_are_not_followed() {
    let env = extractive();
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("private.jsonl"), chat_lines(6, "secrets")).unwrap();
    let root = env.dir.path().join("tree");
    std::fs::create_dir_all(root.join("p1")).unwrap();
    std::fs::create_dir_all(root.join("p2")).unwrap();
    std::fs::write(root.join("p1/a.jsonl"), chat_lines(6, "alpha")).unwrap();
    std::fs::write(root.join("p2/b.jsonl"), chat_lines(6, "beta")).unwrap();
    // Three self-links (a naive walk of two took 73 s and 131,071 "files"; three never ended).
    symlink("..", root.join("p1/up")).unwrap();
    symlink("..", root.join("p2/up")).unwrap();
    symlink(".", root.join("here")).unwrap();
    symlink(&outside, root.join("out")).unwrap();
    let d = root.display().to_string();
    let r = env.run_within(60, &["backfill", &d]);
    r.assert_ok();
    assert!(r.stderr.contains("loop"), "{}", r.stderr);
    assert!(r.stderr.contains("--follow-links"), "{}", r.stderr);
    assert_eq!(
        sessions(&env),
        vec![("a".to_string(), 6), ("b".to_string(), 6)]
    );
    let r = env.run_within(60, &["watch", &d, "--once", "--backfill"]);
    r.assert_ok();
    assert_eq!(sessions(&env).len(), 2, "{}", r.stderr);
    // Asked for, a link out of the tree is followed.
    env.run_within(60, &["backfill", &d, "--follow-links"])
        .assert_ok();
    assert!(sessions(&env).iter().any(|(s, _)| s == "private"));
}

/// Feed `source` bytes of endless input to `abridge summarize FILE --max-bytes LIMIT` and
/// return the run; the writer stops when the reader goes.
fn endless_into(env: &Env, file: &str, via_stdin: bool, limit: &str) -> Run {
    let mut child = env
        .command(&["summarize", file, "--max-bytes", limit, "--session", "s"])
        .env("ABRIDGE_REPORT_PEAK_RSS", "1")
        .stdin(if via_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = chat_lines(1, "endless");
    let mut sink: Box<dyn Write + Send> = if via_stdin {
        Box::new(child.stdin.take().unwrap())
    } else {
        Box::new(std::fs::OpenOptions::new().write(true).open(file).unwrap())
    };
    let writer = std::thread::spawn(move || {
        // Up to 400 MB, far past the limit; a bounded reader stops long before.
        for _ in 0..(400 << 20) / line.len() {
            if sink.write_all(line.as_bytes()).is_err() {
                return;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    Run::from(out)
}

fn peak_rss_mb(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("peak RSS"))
        .unwrap_or_else(|| panic!("no peak RSS line in {stderr}"));
    let kb: u64 = line
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("a number");
    kb / 1024
}

#[test]
fn max_bytes_bounds_memory_for_stdin_and_fifos() {
    let env = extractive();
    let r = endless_into(&env, "-", true, "2000000");
    r.assert_fails(2, &["over the 2000000-byte limit", "--max-bytes"]);
    assert!(peak_rss_mb(&r.stderr) < 120, "{}", r.stderr);

    let fifo = env.dir.path().join("fifo.jsonl");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(ok.success());
    let r = endless_into(&env, &fifo.display().to_string(), false, "2000000");
    r.assert_fails(2, &["over the 2000000-byte limit"]);
    assert!(peak_rss_mb(&r.stderr) < 120, "{}", r.stderr);
    assert!(sessions(&env).is_empty());
}

#[test]
fn a_huge_line_full_of_harness_tags_is_read_in_linear_time() {
    let env = extractive();
    // 8.7 MB of tags in one user line: the quadratic strip took 29 s; twice that never ended
    // in CI's budget. Linear, it is a moment.
    let mut text = String::from("Please check the deploy. ");
    while text.len() < 9_000_000 {
        text.push_str("<system-reminder>noise</system-reminder>x <command-name>");
    }
    let line = serde_json::json!({
        "type": "user", "uuid": "u1", "sessionId": "big",
        "message": {"role": "user", "content": text}
    });
    let reply = serde_json::json!({
        "type": "assistant", "uuid": "a1", "sessionId": "big",
        "message": {"id": "m", "role": "assistant", "content": [{"type": "text", "text": "Deploy checked."}]}
    });
    let f = env.write("big.jsonl", format!("{line}\n{reply}\n"));
    let r = env.run_within(120, &["summarize", &f.display().to_string(), "--dry-run"]);
    r.assert_ok();
}

#[test]
fn same_named_files_in_different_folders_stay_separate_sessions() {
    let env = extractive();
    let root = env.dir.path().join("projects");
    for (d, topic) in [("p1", "billing"), ("p2", "search")] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        std::fs::write(root.join(d).join("notes.jsonl"), chat_lines(8, topic)).unwrap();
    }
    env.run(&["backfill", &root.display().to_string()])
        .assert_ok();
    // A folder is not part of a session's id: the first `notes` is `notes`, the second is set
    // apart by a stable suffix from its path.
    let found = sessions(&env);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0], ("notes".to_string(), 8));
    let other = found[1].0.clone();
    assert!(
        other.starts_with("notes-") && other.len() == "notes-".len() + 6,
        "{other}"
    );
    // Every entry point names a file alike: summarize of either file, wherever it is run
    // from, finds the session backfill made (nothing is stored twice).
    for d in ["p1", "p2"] {
        let r = env.run(&[
            "summarize",
            &root.join(d).join("notes.jsonl").display().to_string(),
        ]);
        r.assert_ok();
        assert!(r.stderr.contains(", 0 new"), "{}", r.stderr);
    }
    assert_eq!(sessions(&env), found);
    // A unique prefix names a session; an ambiguous one says which sessions it could be.
    let r = env.run(&["summaries", &other[..9]]);
    r.assert_ok();
    let r = env.run(&["summaries", "not"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("start of 2 sessions"), "{}", r.stderr);
    // summarize names a single file the same way backfill does.
    std::fs::write(root.join("top.jsonl"), chat_lines(4, "top")).unwrap();
    env.run(&["summarize", &root.join("top.jsonl").display().to_string()])
        .assert_ok();
    env.run(&["backfill", &root.display().to_string()])
        .assert_ok();
    assert!(sessions(&env).contains(&("top".to_string(), 4)));
    assert_eq!(sessions(&env).len(), 3);
}

#[test]
fn watch_after_backfill_and_a_rewritten_file_import_nothing_twice() {
    let env = extractive();
    let root = env.dir.path().join("live");
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("chat.jsonl");
    std::fs::write(&file, chat_lines(30, "upgrade")).unwrap();
    let d = root.display().to_string();
    env.run(&["backfill", &d]).assert_ok();
    assert_eq!(sessions(&env), vec![("chat".to_string(), 30)]);
    env.run(&["watch", &d, "--once", "--backfill"]).assert_ok();
    assert_eq!(sessions(&env), vec![("chat".to_string(), 30)]);
    // Appended lines arrive once; a file rewritten shorter (the same first lines) adds none.
    let mut all = chat_lines(34, "upgrade");
    std::fs::write(&file, &all).unwrap();
    env.run(&["watch", &d, "--once"]).assert_ok();
    assert_eq!(sessions(&env), vec![("chat".to_string(), 34)]);
    all.truncate(chat_lines(20, "upgrade").len());
    std::fs::write(&file, &all).unwrap();
    env.run(&["watch", &d, "--once"]).assert_ok();
    env.run(&["backfill", &d]).assert_ok();
    assert_eq!(sessions(&env), vec![("chat".to_string(), 34)]);
}

#[test]
fn reset_forgets_the_source_so_backfill_brings_the_session_back() {
    let env = extractive();
    let root = env.dir.path().join("projects");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("chat.jsonl"), chat_lines(10, "cache")).unwrap();
    let d = root.display().to_string();
    env.run(&["backfill", &d]).assert_ok();
    env.run(&["reset", "chat"]).assert_ok();
    assert!(env.chain("chat").is_none());
    let (r, _) = (env.run(&["backfill", &d, "--json"]), ());
    r.assert_ok();
    assert_eq!(r.json()["results"][0]["status"], "ok", "{}", r.stdout);
    assert_covers(&env.chain("chat").unwrap(), 10);
}

#[test]
fn escape_sequences_are_printed_escaped_and_odd_ids_stay_nameable() {
    let env = extractive();
    let evil_id = "sess\u{0}ion\u{1b}]0;owned\u{7}";
    let lines = [
        serde_json::json!({"type": "summary", "summary": "Title \u{1b}[2J\u{1b}[31mred", "leafUuid": "x"}),
        serde_json::json!({"type": "user", "uuid": "u1", "sessionId": evil_id,
            "message": {"role": "user", "content": "Clear the screen \u{1b}[2J please, we ship the fix today."}}),
        serde_json::json!({"type": "assistant", "uuid": "a1", "sessionId": evil_id,
            "message": {"id": "m", "role": "assistant", "content": [{"type": "text", "text": "Done \u{1b}[31m — the fix ships today after the review."}]}}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let f = env.write("evil.jsonl", text);
    let r = env.run(&["summarize", &f.display().to_string()]);
    r.assert_ok();
    for out in [&r.stdout, &r.stderr] {
        assert!(!out.contains('\u{1b}') && !out.contains('\0'), "{out:?}");
    }
    // The session id lost its control characters and can be named.
    let names = sessions(&env);
    assert_eq!(names.len(), 1);
    assert_eq!(names[0].0, "sess_ion_]0;owned_");
    let r = env.run(&["summaries", &names[0].0]);
    r.assert_ok();
    assert!(!r.stdout.contains('\u{1b}'), "{:?}", r.stdout);
    // A typed id with control characters is refused with the rule.
    env.run_stdin(&["ingest", "--session", "a\u{1b}b"], b"")
        .assert_fails(2, &["control characters"]);
}

#[test]
fn concurrent_openers_of_a_new_database_all_succeed() {
    let env = extractive();
    let input = chat_lines(4, "race");
    let children: Vec<_> = (0..8)
        .map(|i| {
            let mut c = env
                .command(&["ingest", "--session", &format!("s{i}")])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
            c
        })
        .collect();
    for c in children {
        Run::from(c.wait_with_output().unwrap()).assert_ok();
    }
    assert_eq!(sessions(&env).len(), 8);
}

#[test]
fn another_programs_database_is_refused_untouched_and_a_damaged_one_is_explained() {
    let env = extractive();
    {
        let db = rusqlite::Connection::open(env.db()).unwrap();
        db.execute_batch("CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('ada');")
            .unwrap();
    }
    let before = std::fs::read(env.db()).unwrap();
    env.run(&["summarize", &fixture("chat.jsonl")])
        .assert_fails(4, &["is not an abridge database", "contacts", "--db"]);
    assert_eq!(std::fs::read(env.db()).unwrap(), before);
    assert!(!Path::new(&format!("{}-wal", env.db().display())).exists());

    std::fs::write(env.db(), vec![0x5au8; 8192]).unwrap();
    let r = env.run(&["summarize", &fixture("chat.jsonl")]);
    r.assert_fails(4, &[&env.db().display().to_string(), "move it aside"]);
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let env = extractive();
    env.run(&["summarize", &fixture("chat.jsonl")]).assert_ok();
    for args in [
        &["summaries", "chat"][..],
        &["summarize", &fixture("chat.jsonl")],
    ] {
        let mut child = env
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // `| head -0`: the reader is gone before anything is written
        let out = child.wait_with_output().unwrap();
        let r = Run::from(out);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
}

#[test]
fn misleading_messages_are_fixed() {
    let env = extractive();
    let empty = env.write("empty.jsonl", "");
    env.run(&["summarize", &empty.display().to_string()])
        .assert_fails(2, &["is empty"]);
    let mixed = env.write(
        "mixed.jsonl",
        b"{\"role\":\"user\",\"content\":\"caf\xe9\"}\n{\"role\":\"user\",\"content\":\"tea, please\"}\n{\"role\":\"assistant\",\"content\":\"Tea it is.\"}\n",
    );
    let r = env.run(&[
        "summarize",
        &mixed.display().to_string(),
        "--skip-invalid",
        "--json",
    ]);
    r.assert_ok();
    assert!(
        r.stderr.contains("mixed.jsonl:1: invalid UTF-8; skipped"),
        "{}",
        r.stderr
    );
    let v: Value = r.json();
    assert_eq!(v["episodes"], 2);
}

#[test]
fn two_ingests_of_one_session_both_succeed_and_lose_nothing() {
    let env = extractive();
    let lines = |who: &str| -> String {
        (1..=40)
            .map(|i| {
                format!(
                    "{{\"role\":\"{}\",\"content\":\"{who} message {i} about the index rebuild and the replica lag.\",\"id\":\"{who}-{i}\"}}\n",
                    if i % 2 == 1 { "user" } else { "assistant" }
                )
            })
            .collect()
    };
    let args = [
        "ingest",
        "--session",
        "shared",
        "--threshold-tokens",
        "20",
        "--min-new-episodes",
        "2",
    ];
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|who| {
            let mut c = env
                .command(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let input = lines(who);
            let mut stdin = c.stdin.take().unwrap();
            std::thread::spawn(move || {
                // Line by line, as a chat app sends them, so the two interleave.
                for l in input.lines() {
                    if stdin.write_all(format!("{l}\n").as_bytes()).is_err() {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            });
            c
        })
        .collect();
    for c in children {
        Run::from(c.wait_with_output().unwrap()).assert_ok();
    }
    assert_eq!(sessions(&env), vec![("shared".to_string(), 80)]);
    let chain = env.chain("shared").unwrap();
    let last = chain["summaries"].as_array().unwrap().last().unwrap()["last_episode"]
        .as_u64()
        .unwrap();
    assert!(last >= 79, "coverage stuck at {last}: {chain:#}");
    let st = env.run(&["status", "shared", "--json"]);
    st.assert_ok();
    assert_eq!(st.json()[0]["failures"], 0, "{}", st.stdout);
}

#[test]
fn pop_takes_the_newest_message_back_and_refolds_what_covered_it() {
    let env = extractive();
    let mut lines = chat_lines(10, "cache");
    lines.push_str("{\"role\":\"assistant\",\"content\":\"zebracorn: pasted by mistake.\"}\n");
    let file = env.write("chat.jsonl", &lines);
    env.run(&[
        "summarize",
        &file.display().to_string(),
        "--session",
        "chat",
    ])
    .assert_ok();
    let chain = env.chain("chat").unwrap();
    assert!(chain.to_string().contains("zebracorn"), "{chain}");
    let r = env.run(&["pop", "chat", "--json"]);
    r.assert_ok();
    let gone = r.json();
    assert_eq!(gone["message"]["id"], 11, "{gone}");
    assert_eq!(gone["episodes"], 10, "{gone}");
    assert_eq!(gone["job"]["state"], "succeeded", "{gone}");
    // The refold ran here: the chain covers the 10 left, and nothing of the message.
    let chain = env.chain("chat").unwrap();
    assert_covers(&chain, 10);
    assert!(!chain.to_string().contains("zebracorn"), "{chain}");
    env.run(&["pop", "nobody"])
        .assert_fails(2, &["no session 'nobody'"]);
}
