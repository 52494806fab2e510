//! Parser tests: every format, malformed input, and the same episodes whatever the chunking.

use super::*;

/// Parse `bytes` fed in chunks of `step` bytes.
fn parse_in(bytes: &[u8], opts: Options, step: usize) -> Result<Batch, ParseError> {
    let mut p = Parser::new(opts);
    let mut all = Batch::default();
    let merge = |b: Batch, all: &mut Batch| {
        all.format = b.format.or(all.format);
        all.warnings.extend(b.warnings);
        for c in b.conversations {
            match all.conversations.iter_mut().find(|x| x.index == c.index) {
                Some(x) => {
                    x.episodes.extend(c.episodes);
                    x.id = c.id.or(x.id.take());
                    x.title = c.title.or(x.title.take());
                }
                None => all.conversations.push(c),
            }
        }
    };
    for chunk in bytes.chunks(step.max(1)) {
        let b = p.feed(chunk)?;
        merge(b, &mut all);
    }
    let b = p.finish()?;
    merge(b, &mut all);
    Ok(all)
}

fn opts() -> Options {
    Options {
        name: "t".into(),
        ..Options::default()
    }
}

fn parse(text: &str) -> Result<Batch, ParseError> {
    parse_in(text.as_bytes(), opts(), 1 << 20)
}

/// Parse `bytes` in chunks of `step` in whole mode: each batch's conversations are simply
/// concatenated (no host merges anything), after checking none is delivered twice or empty.
fn parse_whole(bytes: &[u8], opts: Options, step: usize) -> Result<Batch, ParseError> {
    let mut p = Parser::new(Options {
        whole: true,
        ..opts
    });
    let mut all = Batch::default();
    let add = |b: Batch, all: &mut Batch| {
        all.format = b.format.or(all.format);
        all.warnings.extend(b.warnings);
        for c in b.conversations {
            assert!(
                !c.episodes.is_empty(),
                "an empty conversation was delivered"
            );
            assert!(
                all.conversations.iter().all(|x| x.index < c.index),
                "conversation {} delivered twice or out of order",
                c.index
            );
            all.conversations.push(c);
        }
    };
    for chunk in bytes.chunks(step.max(1)) {
        add(p.feed(chunk)?, &mut all);
    }
    add(p.finish()?, &mut all);
    Ok(all)
}

/// Every chunking gives the same result as one feed, and whole mode gives the same
/// conversations, each in one piece.
fn same_in_every_chunking(bytes: &[u8], o: Options) -> Result<Batch, ParseError> {
    let whole = parse_in(bytes, o.clone(), bytes.len().max(1));
    for step in [1, 2, 3, 7, 64, 1000] {
        assert_eq!(parse_in(bytes, o.clone(), step), whole, "chunks of {step}");
        let mut merged = whole.clone();
        if let Ok(m) = &mut merged {
            m.conversations.retain(|c| !c.episodes.is_empty());
        }
        assert_eq!(
            parse_whole(bytes, o.clone(), step),
            merged,
            "whole mode, chunks of {step}"
        );
    }
    whole
}

fn texts(b: &Batch) -> Vec<(Role, &str)> {
    b.conversations[0]
        .episodes
        .iter()
        .map(|e| (e.role, e.content.as_str()))
        .collect()
}

#[test]
fn timestamps() {
    assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(
        parse_timestamp("2025-09-19T17:34:29.181Z"),
        Some(1_758_303_269_181)
    );
    assert_eq!(
        parse_timestamp("2025-09-19T19:34:29.181+02:00"),
        Some(1_758_303_269_181)
    );
    assert_eq!(parse_timestamp("yesterday"), None);
    assert_eq!(
        timestamp_value(Some(&serde_json::json!(1_700_000_000.5))),
        Some(1_700_000_000_500)
    );
}

#[test]
fn a_message_without_content_is_an_error_that_shows_the_shape() {
    for (line, hint) in [
        ("{\"role\":\"user\"}\n", false),
        ("{\"role\":\"user\",\"text\":\"hi\"}\n", true),
    ] {
        match parse(line) {
            Err(ParseError::Malformed { line: 1, message }) => {
                assert!(message.contains("needs \"content\""), "{message}");
                assert!(
                    message.contains("{\"role\": \"user\", \"content\": "),
                    "{message}"
                );
                assert_eq!(
                    message.contains("name that field \"content\""),
                    hint,
                    "{message}"
                );
            }
            other => panic!("{line}: {other:?}"),
        }
    }
    // An empty or null content is a message with nothing to keep, as before.
    let p = parse(
        "{\"role\":\"assistant\",\"content\":null}\n{\"role\":\"user\",\"content\":\"hi\"}\n",
    )
    .unwrap();
    assert_eq!(p.conversations[0].episodes.len(), 1);
}

#[test]
fn jsonl_with_errors_reported_by_line() {
    let ok = "{\"role\":\"user\",\"content\":\"hi\"}\n\n{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"hello\"}],\"timestamp\":\"2025-01-01T00:00:00Z\"}\n";
    let p = same_in_every_chunking(ok.as_bytes(), opts()).unwrap();
    assert_eq!(p.format, Some(Format::Jsonl));
    assert_eq!(p.conversations[0].episodes.len(), 2);
    assert_eq!(
        p.conversations[0].episodes[1].timestamp_ms,
        Some(1_735_689_600_000)
    );
    // Keys are the file's line numbers and a content hash: the same in every host.
    assert_eq!(
        p.conversations[0].episodes[0].source_key,
        position_key(1, Role::User, "hi")
    );
    assert_eq!(
        p.conversations[0].episodes[1].source_key.split(':').next(),
        Some("3")
    );

    let bad =
        "{\"role\":\"user\",\"content\":\"hi\"}\n{oops\n{\"role\":\"user\",\"content\":\"x\"}\n";
    match parse(bad) {
        Err(ParseError::Malformed { line: 2, message }) => {
            assert!(message.starts_with("not valid JSON") && message.contains("--skip-invalid"));
        }
        other => panic!("{other:?}"),
    }
    let skipped = same_in_every_chunking(
        bad.as_bytes(),
        Options {
            skip_invalid: true,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(
        (
            skipped.conversations[0].episodes.len(),
            skipped.warnings.len()
        ),
        (2, 1)
    );

    // A partial last line (no newline) is tolerated.
    let partial = "{\"role\":\"user\",\"content\":\"hi\"}\n{\"role\":\"assis";
    let p = same_in_every_chunking(partial.as_bytes(), opts()).unwrap();
    assert_eq!(
        (p.conversations[0].episodes.len(), p.warnings.len()),
        (1, 1)
    );

    // A watcher resuming at line 40 numbers lines from 41.
    let p = parse_in(
        b"{\"role\":\"user\",\"content\":\"hi\"}\n",
        Options {
            first_line: 40,
            ..opts()
        },
        100,
    )
    .unwrap();
    assert!(p.conversations[0].episodes[0].source_key.starts_with("41:"));
}

#[test]
fn refusals() {
    assert_eq!(parse("hello world"), Err(ParseError::UnknownFormat));
    assert_eq!(parse(""), Err(ParseError::EmptyFile));
    assert_eq!(parse(" \n\t\n"), Err(ParseError::EmptyFile));
    assert_eq!(parse("[]"), Err(ParseError::UnknownFormat));
    assert_eq!(
        parse_in(
            b"[]",
            Options {
                format: Some(Format::OpenAi),
                ..opts()
            },
            10
        ),
        Err(ParseError::NoMessages(Format::OpenAi))
    );
    assert_eq!(
        parse_in(
            b"{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":\"\xff\"}\n",
            opts(),
            5
        ),
        Err(ParseError::Utf8 {
            line: 2,
            offset: 30 + 26
        })
    );
    // --skip-invalid skips a line that is not UTF-8.
    let p = parse_in(
        b"{\"role\":\"user\",\"content\":\"caf\xe9\"}\n{\"role\":\"user\",\"content\":\"tea\"}\n",
        Options {
            skip_invalid: true,
            ..opts()
        },
        7,
    )
    .unwrap();
    assert_eq!(texts(&p), vec![(Role::User, "tea")]);
    assert_eq!(p.warnings, vec!["t:1: invalid UTF-8; skipped".to_string()]);
    match parse("{\"role\":\"wizard\",\"content\":\"a\"}\n") {
        Err(ParseError::Malformed { message, .. }) => {
            assert!(message.contains("unknown role 'wizard'"))
        }
        other => panic!("{other:?}"),
    }
    // A truncated export.
    assert!(matches!(
        parse("[{\"role\":\"user\",\"content\":\"a\"},"),
        Err(ParseError::Malformed { .. })
    ));
}

#[test]
fn openai_messages_as_object_and_as_array() {
    let t = r#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42"},{"role":"assistant","content":"It is 42."}]}"#;
    let p = same_in_every_chunking(t.as_bytes(), opts()).unwrap();
    assert_eq!(p.format, Some(Format::OpenAi));
    let roles: Vec<Role> = p.conversations[0].episodes.iter().map(|e| e.role).collect();
    assert_eq!(roles, vec![Role::System, Role::User, Role::Assistant]);
    // The same messages as a pretty-printed top-level array, with the same keys.
    let arr = "[\n  {\"role\": \"system\", \"content\": \"be brief\"},\n  {\"role\": \"user\", \"content\": \"hi\"},\n  {\"role\": \"assistant\", \"content\": \"It is 42.\"}\n]\n";
    let q = same_in_every_chunking(arr.as_bytes(), opts()).unwrap();
    assert_eq!(q.format, Some(Format::OpenAi));
    assert_eq!(
        q.conversations[0].episodes[1].source_key,
        p.conversations[0].episodes[1].source_key
    );
}

#[test]
fn claude_code_merges_split_assistant_turns_and_drops_noise() {
    let lines = [
        r#"{"type":"summary","summary":"Fix CI","leafUuid":"x"}"#,
        r#"{"type":"user","uuid":"u1","sessionId":"S","timestamp":"2025-01-01T00:00:00Z","message":{"role":"user","content":"Why does CI fail?"}}"#,
        r#"{"type":"assistant","uuid":"a1","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"thinking","thinking":"hmm"}]}}"#,
        r#"{"type":"assistant","uuid":"a2","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"Let me look."}]}}"#,
        r#"{"type":"assistant","uuid":"a3","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t","name":"Bash","input":{"command":"ls"}}]}}"#,
        r#"{"type":"user","uuid":"u2","sessionId":"S","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"a b"}]}}"#,
        r#"{"type":"assistant","uuid":"a4","sessionId":"S","message":{"id":"m2","role":"assistant","content":[{"type":"text","text":"The lockfile is stale."}]}}"#,
        r#"{"type":"user","uuid":"u3","sessionId":"S","isMeta":true,"message":{"role":"user","content":"meta"}}"#,
        r#"{"type":"user","uuid":"u4","sessionId":"S","message":{"role":"user","content":"<command-name>/clear</command-name>"}}"#,
    ];
    let text = lines.join("\n") + "\n";
    let p = same_in_every_chunking(text.as_bytes(), opts()).unwrap();
    assert_eq!(p.format, Some(Format::ClaudeCode));
    let c = &p.conversations[0];
    assert_eq!(
        (c.id.as_deref(), c.title.as_deref()),
        (Some("S"), Some("Fix CI"))
    );
    assert_eq!(
        texts(&p),
        vec![
            (Role::User, "Why does CI fail?"),
            (Role::Assistant, "Let me look."),
            // A tool call is an action line for the digest (see `crate::digest`).
            (Role::Tool, "[action] Bash: ls"),
            (Role::Assistant, "The lockfile is stale.")
        ]
    );
    assert_eq!(c.episodes[2].source_key, "a3#act0");
    let with_tools = same_in_every_chunking(
        text.as_bytes(),
        Options {
            include_tools: true,
            ..opts()
        },
    )
    .unwrap();
    let c = &with_tools.conversations[0];
    assert_eq!(c.episodes[2].content, "[action] Bash: ls");
    // With tools, the result is kept too.
    assert_eq!(
        (c.episodes[3].role, c.episodes[3].content.as_str()),
        (Role::Tool, "a b")
    );
}

#[test]
fn claude_code_tool_calls_become_digest_lines_and_failures_name_their_call() {
    let lines = [
        r#"{"type":"user","uuid":"u1","sessionId":"S","message":{"role":"user","content":"Fix the build."}}"#,
        r#"{"type":"assistant","uuid":"a1","sessionId":"S","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"Running it."},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"cargo build","description":"Build"}}]}}"#,
        r#"{"type":"user","uuid":"u2","sessionId":"S","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":"   Compiling x\nerror[E0425]: cannot find value `y`\n"}]}}"#,
        r#"{"type":"assistant","uuid":"a2","sessionId":"S","message":{"id":"m2","role":"assistant","content":[{"type":"tool_use","id":"t2","name":"Edit","input":{"file_path":"src/lib.rs","old_string":"a","new_string":"b"}},{"type":"tool_use","id":"t3","name":"TodoWrite","input":{"todos":[{"content":"Fix build","status":"completed"},{"content":"Run tests; then docs","status":"pending"}]}}]}}"#,
    ];
    let text = lines.join(
        "
",
    ) + "
";
    let p = same_in_every_chunking(text.as_bytes(), opts()).unwrap();
    assert_eq!(
        texts(&p),
        vec![
            (Role::User, "Fix the build."),
            (Role::Assistant, "Running it."),
            (Role::Tool, "[action] Bash: cargo build"),
            (
                Role::Tool,
                "[failed] Bash: cargo build → error[E0425]: cannot find value `y`"
            ),
            (Role::Tool, "[action] Edit src/lib.rs"),
            (
                Role::Tool,
                "[action] TodoWrite: [completed] Fix build; [pending] Run tests, then docs"
            ),
        ]
    );
}

#[test]
fn chatgpt_follows_the_current_branch_one_conversation_at_a_time() {
    let t = r#"[{"id":"c1","title":"T","current_node":"n3","mapping":{
        "root":{"id":"root","parent":null,"children":["n1"],"message":null},
        "n1":{"id":"n1","parent":"root","children":["n2","n3"],"message":{"id":"n1","author":{"role":"user"},"create_time":1700000000.0,"content":{"content_type":"text","parts":["Question?"]}}},
        "n2":{"id":"n2","parent":"n1","children":[],"message":{"id":"n2","author":{"role":"assistant"},"content":{"content_type":"text","parts":["Old answer"]}}},
        "n3":{"id":"n3","parent":"n1","children":[],"message":{"id":"n3","author":{"role":"assistant"},"content":{"content_type":"text","parts":["New answer [x]"]}}}}},
        {"id":"c2","title":"Second","mapping":{"r":{"id":"r","parent":null,"children":[],"message":{"id":"m","author":{"role":"user"},"content":{"content_type":"text","parts":["Hello, \"world\" ]"]}}}}}]"#;
    let p = same_in_every_chunking(t.as_bytes(), opts()).unwrap();
    assert_eq!(p.format, Some(Format::ChatGpt));
    assert_eq!(p.conversations.len(), 2);
    let c = &p.conversations[0];
    let got: Vec<&str> = c.episodes.iter().map(|e| e.content.as_str()).collect();
    assert_eq!(got, vec!["Question?", "New answer [x]"]);
    assert_eq!(c.episodes[0].timestamp_ms, Some(1_700_000_000_000));
    assert_eq!(p.conversations[1].id.as_deref(), Some("c2"));
    assert_eq!(p.conversations[1].episodes[0].content, "Hello, \"world\" ]");
}

#[test]
fn chatgpt_link_cycles_end_with_a_warning() {
    let children = r#"[{"id":"cyc","mapping":{
        "root":{"id":"root","parent":null,"children":["n1"],"message":null},
        "n1":{"id":"n1","parent":"root","children":["n2"],"message":{"id":"n1","author":{"role":"user"},"content":{"content_type":"text","parts":["Q"]}}},
        "n2":{"id":"n2","parent":"n1","children":["n1"],"message":{"id":"n2","author":{"role":"assistant"},"content":{"content_type":"text","parts":["A"]}}}}}]"#;
    let p = parse(children).unwrap();
    assert_eq!(texts(&p), vec![(Role::User, "Q"), (Role::Assistant, "A")]);
    assert!(p.warnings[0].contains("cycle"));
    let parents = r#"[{"id":"cyc","current_node":"a","mapping":{
        "a":{"id":"a","parent":"b","children":[],"message":{"id":"a","author":{"role":"user"},"content":{"content_type":"text","parts":["A"]}}},
        "b":{"id":"b","parent":"a","children":[],"message":{"id":"b","author":{"role":"assistant"},"content":{"content_type":"text","parts":["B"]}}}}}]"#;
    let p = parse(parents).unwrap();
    assert_eq!(p.conversations[0].episodes.len(), 2);
    assert!(p.warnings[0].contains("cycle"));
}

#[test]
fn long_messages_are_split_into_parts_and_lines_past_the_limit_refused() {
    let para = "The rollout plan covers the replica, the cut-over and the rollback. ".repeat(40);
    let long = format!("{para}\n\n{para}\n\n{para}");
    let line = serde_json::json!({"role": "user", "content": long, "id": "big"}).to_string() + "\n";
    let o = Options {
        max_episode_bytes: 4096,
        ..opts()
    };
    let p = same_in_every_chunking(line.as_bytes(), o).unwrap();
    let eps = &p.conversations[0].episodes;
    assert!(eps.len() >= 3, "{} parts", eps.len());
    assert!(eps.iter().all(|e| e.content.len() <= 4096));
    let joined: String = eps.iter().map(|e| e.content.as_str()).collect();
    assert_eq!(joined, long);
    assert_eq!(eps[0].source_key, format!("id:big#part1/{}", eps.len()));

    // Without boundaries, a cut between characters (never inside one).
    let cjk = "漢".repeat(5000);
    let parts = split_parts(&cjk, 1000);
    assert!(parts.iter().all(|p| p.len() <= 1000 && !p.is_empty()));
    assert_eq!(parts.concat(), cjk);
}

#[test]
fn harness_tags_are_stripped_in_linear_time() {
    let mut text = String::from("Please check. ");
    for _ in 0..100_000 {
        text.push_str("<system-reminder>noise</system-reminder>x <command-name>");
    }
    // Quadratic, this is minutes; linear, milliseconds.
    let out = strip_harness(&text);
    assert!(out.starts_with("Please check. x"), "{}", &out[..40]);
    assert!(!out.contains("system-reminder"));
    assert_eq!(strip_harness("a <b>c</b> <system-reminder>x"), "a <b>c</b>");
}

#[test]
fn whole_mode_delivers_a_conversation_when_the_next_one_starts() {
    let conv = |id: &str, text: &str| {
        format!(
            r#"{{"id":"{id}","mapping":{{"r":{{"id":"r","parent":null,"children":[],"message":{{"id":"m","author":{{"role":"user"}},"content":{{"content_type":"text","parts":["{text}"]}}}}}}}}}}"#
        )
    };
    let mut p = Parser::new(Options {
        whole: true,
        ..opts()
    });
    let first = format!("[{},", conv("c1", "one"));
    assert!(p.feed(first.as_bytes()).unwrap().conversations.is_empty());
    // The second conversation starting completes the first.
    let b = p
        .feed(format!("{}]", conv("c2", "two")).as_bytes())
        .unwrap();
    let ids: Vec<_> = b.conversations.iter().map(|c| c.id.as_deref()).collect();
    assert_eq!(ids, vec![Some("c1")]);
    let b = p.finish().unwrap();
    assert_eq!(b.conversations.len(), 1);
    assert_eq!(b.conversations[0].id.as_deref(), Some("c2"));
    assert_eq!(b.conversations[0].episodes[0].content, "two");

    // An error delivers no half-gathered conversation.
    let mut p = Parser::new(Options {
        format: Some(Format::Jsonl),
        whole: true,
        ..opts()
    });
    assert!(matches!(
        p.feed(b"{\"role\":\"user\",\"content\":\"a\"}\n{oops\n"),
        Err(ParseError::Malformed { line: 2, .. })
    ));
    assert!(p.finish().unwrap().conversations.is_empty());
}

#[test]
fn episodes_before_an_error_come_first_then_the_error() {
    let mut p = Parser::new(Options {
        format: Some(Format::Jsonl),
        ..opts()
    });
    let b = p
        .feed(b"{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"content\":\"b\"}\n{oops\n")
        .unwrap();
    assert_eq!(b.conversations[0].episodes.len(), 2);
    assert!(matches!(
        p.feed(b"{\"role\":\"user\",\"content\":\"c\"}\n"),
        Err(ParseError::Malformed { line: 3, .. })
    ));
    // Nothing after the error.
    assert_eq!(p.feed(b"x").unwrap().conversations.len(), 0);
}

#[test]
fn parse_errors_are_worded_once_with_the_hosts_own_format_flag() {
    assert_eq!(
        describe("a.txt", &ParseError::UnknownFormat, "--format"),
        "cannot tell the format of a.txt — pass --format jsonl|openai|claude-code|chatgpt"
    );
    assert!(
        describe("a", &ParseError::NoMessages(Format::ClaudeCode), "format:")
            .ends_with("(read as claude-code) — check that it is the right file, or pass format:")
    );
    assert!(
        describe("a", &ParseError::Utf8 { line: 3, offset: 9 }, "x")
            .starts_with("a:3: invalid UTF-8 at byte 9")
    );
    assert_eq!(
        describe(
            "m",
            &ParseError::Malformed {
                line: 2,
                message: "bad".into()
            },
            "x"
        ),
        "m:2: bad"
    );
}

#[test]
fn an_input_past_the_episode_limit_is_refused_whole() {
    let five: String = (0..5)
        .map(|i| format!("{{\"role\":\"user\",\"content\":\"m{i}\"}}\n"))
        .collect();
    for whole in [false, true] {
        let o = |max| Options {
            format: Some(Format::Jsonl),
            max_episodes: max,
            whole,
            ..opts()
        };
        assert_eq!(
            parse_in(five.as_bytes(), o(3), 1 << 20),
            Err(ParseError::TooManyEpisodes(3))
        );
        assert_eq!(
            parse_in(five.as_bytes(), o(5), 7).unwrap().conversations[0]
                .episodes
                .len(),
            5
        );
    }
    let e = describe("big.jsonl", &ParseError::TooManyEpisodes(3), "--format");
    assert!(e.contains("split it into parts of at most 3"), "{e}");
}

#[test]
fn every_format_keeps_the_time_it_names() {
    // JSON lines: `timestamp`, `created_at` or `time`; epoch seconds or RFC 3339.
    let jsonl = concat!(
        "{\"role\":\"user\",\"content\":\"a\",\"created_at\":\"2023-05-08T13:56:00Z\"}\n",
        "{\"role\":\"assistant\",\"content\":\"b\",\"time\":1683554160}\n",
    );
    let p = same_in_every_chunking(jsonl.as_bytes(), opts()).unwrap();
    let times: Vec<Option<i64>> = p.conversations[0]
        .episodes
        .iter()
        .map(|e| e.timestamp_ms)
        .collect();
    assert_eq!(times, [Some(1_683_554_160_000), Some(1_683_554_160_000)]);
    // OpenAI-style messages with `created_at`.
    let openai = r#"{"messages":[{"role":"user","content":"a","created_at":1683554160},{"role":"assistant","content":"b"}]}"#;
    let p = same_in_every_chunking(openai.as_bytes(), opts()).unwrap();
    assert_eq!(p.format, Some(Format::OpenAi));
    assert_eq!(
        p.conversations[0].episodes[0].timestamp_ms,
        Some(1_683_554_160_000)
    );
    assert_eq!(p.conversations[0].episodes[1].timestamp_ms, None);
}
