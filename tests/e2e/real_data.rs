//! Real transcripts from ../shared/data/transcripts (skipped, with a note, when absent).

use crate::harness::*;

#[test]
fn real_transcripts_summarize_with_no_model_and_through_the_test_server() {
    let files = [
        "claude_code/obra-episodic-memory/tiny-conversation.jsonl",
        "claude_code/obra-episodic-memory/short-conversation.jsonl",
        "claude_code/simonw-claude-code-transcripts/sample_session.jsonl",
        "chatgpt_export/mitkury-chatgpt-export-parser/example-conversation.json",
        "openai_messages/derived_from_obra_tiny.json",
    ];
    let server = TestServer::start();
    for rel in files {
        let Some(path) = shared(rel) else { return };
        let env = Env::new().with("EXTRACTION_URL", &closed_port_url());
        let r = env.run(&["summarize", &path, "--json"]);
        r.assert_ok();
        let v = r.json();
        assert_eq!(v["backend"], "extractive", "{rel}");
        let n = v["episodes"].as_u64().unwrap();
        assert!(n >= 2, "{rel}: {n} episodes");
        assert_covers(&v, n);

        let env = Env::new().with("EXTRACTION_URL", &server.url());
        let r = env.run(&["summarize", &path, "--json"]);
        r.assert_ok();
        assert_eq!(r.json()["backend"], "ollama", "{rel}");
        assert_covers(&r.json(), n);
    }
}

#[test]
fn a_large_real_session_is_covered_completely_within_the_context() {
    let Some(path) = shared("claude_code/obra-episodic-memory/large-conversation.jsonl") else {
        return;
    };
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let r = env.run(&[
        "summarize",
        &path,
        "--json",
        "--context-length",
        "2048",
        "--max-output-tokens",
        "300",
    ]);
    r.assert_ok();
    let v = r.json();
    let n = v["episodes"].as_u64().unwrap();
    assert!(n > 50, "{n} episodes");
    assert_covers(&v, n);
    let gens = server.generations();
    for g in &gens {
        assert_eq!(g.body["options"]["num_ctx"], 2048);
        assert_eq!(g.body["truncate"], false);
    }
    assert!(gens.len() > 3, "{} calls", gens.len());
}

#[test]
fn backfill_of_the_real_transcripts_directory_plans_then_summarizes_then_rests() {
    let Some(dir) = shared("") else { return };
    let server = TestServer::start();
    let env = Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    let r = env.run(&["backfill", &dir, "--dry-run", "--json"]);
    r.assert_ok();
    let v = r.json();
    assert!(v["counts"]["planned"].as_u64().unwrap() >= 5, "{v:#}");
    assert!(server.generations().is_empty() && !env.db().exists());

    let r = env.run(&["backfill", &dir, "--json"]);
    r.assert_ok();
    let v = r.json();
    assert_eq!(v["counts"]["failed"], 0, "{v:#}");
    let ok = v["counts"]["ok"].as_u64().unwrap();
    assert!(ok >= 5, "{v:#}");
    for row in v["results"].as_array().unwrap() {
        if row["status"] == "ok" {
            let chain = env.chain(row["session"].as_str().unwrap()).unwrap();
            assert_covers(&chain, row["episodes"].as_u64().unwrap());
        }
    }
    let calls = server.generations().len();
    let r = env.run(&["backfill", &dir, "--json"]);
    r.assert_ok();
    assert_eq!(r.json()["counts"]["unchanged"].as_u64().unwrap(), ok);
    assert_eq!(server.generations().len(), calls, "a re-run calls no model");
}

/// The digest and ledger of real coding sessions hold identifiers and short requests, never
/// paragraphs or logs: every entry within the ledger's bound, no one-word request, no padding;
/// and the largest session's context still has room for its identifiers.
#[test]
fn real_coding_sessions_keep_ledger_entries_short_and_requests_clean() {
    let max = abridge_guest::ledger::MAX_ENTRY_CHARS;
    for rel in [
        "claude_code/obra-episodic-memory/tiny-conversation.jsonl",
        "claude_code/obra-episodic-memory/short-conversation.jsonl",
        "claude_code/obra-episodic-memory/long-conversation.jsonl",
        "claude_code/obra-episodic-memory/large-conversation.jsonl",
        "claude_code/simonw-claude-code-transcripts/sample_session.jsonl",
    ] {
        let Some(path) = shared(rel) else { return };
        let env = Env::new().with("ABRIDGE_BACKEND", "extractive");
        let v = env.run(&["summarize", &path, "--json"]).assert_ok().json();
        let session = v["session"].as_str().unwrap().to_string();
        let rows = env
            .run(&["summaries", &session, "--json"])
            .assert_ok()
            .json();
        let mut entries = 0;
        for row in rows["summaries"].as_array().unwrap() {
            for e in row["ledger"].as_array().into_iter().flatten() {
                entries += 1;
                let text = e["text"].as_str().unwrap();
                let n = text.chars().count();
                assert!(
                    n <= max,
                    "{rel}: a {} entry of {n} characters: {}",
                    e["kind"],
                    &text[..200.min(text.len())]
                );
                if e["kind"] == "request" {
                    assert!(
                        text.split_whitespace().count() >= 2,
                        "{rel}: one-word request {text:?}"
                    );
                    assert!(
                        !text.contains("  ") && text == text.trim(),
                        "{rel}: padding in {text:?}"
                    );
                    assert!(
                        text.lines().count() <= 13,
                        "{rel}: {} lines",
                        text.lines().count()
                    );
                }
            }
        }
        assert!(entries > 0, "{rel}: no ledger");
        if rel.contains("large") {
            let c = env.run(&["context", &session, "--json"]).assert_ok().json();
            assert!(
                c["identifiers"].as_u64().unwrap() > 0,
                "{rel}: {}",
                c["parts"]
            );
        }
    }
}
