//! Golden transcripts (tests/golden/transcripts): a file in, the episodes the sandboxed parser
//! yields out (or its error), fed whole and in 7-byte chunks through the Rust host. The JS
//! host runs the same cases (js/test/golden.test.js), so both parse byte for byte alike.
//! `ABRIDGE_BLESS=1` rewrites `expected.json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use abridge_engine::Abridge;
use abridge_engine::types::{ParseBatch, ParseError, ParseOptions, TranscriptFormat};
use abridge_store::SqliteStore;
use serde_json::{Value, json};

fn format_name(f: TranscriptFormat) -> &'static str {
    match f {
        TranscriptFormat::Jsonl => "jsonl",
        TranscriptFormat::Openai => "openai",
        TranscriptFormat::ClaudeCode => "claude-code",
        TranscriptFormat::Chatgpt => "chatgpt",
        TranscriptFormat::Codex => "codex",
    }
}

/// Everything the parser said about `bytes`, as JSON.
async fn parse(engine: &Abridge, opts: &ParseOptions, bytes: &[u8], step: usize) -> Value {
    let mut p = engine.parser(opts).await.expect("parser");
    let mut format = None;
    let mut convs: Vec<Value> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let mut take = |b: ParseBatch| {
        format = b.format.map(format_name).or(format);
        warnings.extend(b.warnings);
        // Whole mode: each conversation arrives complete, once; nothing to merge.
        for c in b.conversations {
            assert!(
                convs.iter().all(|x| x["index"] != c.index),
                "conversation {} delivered twice",
                c.index
            );
            let episodes: Vec<Value> = c
                .episodes
                .into_iter()
                .map(|e| {
                    json!({
                        "role": e.role.as_str(), "content": e.content,
                        "timestamp_ms": e.timestamp_ms, "source_key": e.source_key,
                        "speaker": e.speaker,
                    })
                })
                .collect();
            convs.push(
                json!({"index": c.index, "id": c.id, "title": c.title, "episodes": episodes}),
            );
        }
    };
    let error = |e: ParseError| -> Value {
        match e {
            ParseError::InvalidUtf8((line, offset)) => {
                json!({"error": "invalid-utf8", "line": line, "offset": offset})
            }
            ParseError::Malformed((line, message)) => {
                json!({"error": "malformed", "line": line, "message": message})
            }
            ParseError::UnknownFormat => json!({"error": "unknown-format"}),
            ParseError::EmptyFile => json!({"error": "empty-file"}),
            ParseError::NoMessages(f) => json!({"error": "no-messages", "format": format_name(f)}),
            ParseError::TooManyEpisodes(n) => json!({"error": "too-many-episodes", "limit": n}),
        }
    };
    for chunk in bytes.chunks(step.max(1)) {
        match p.feed(chunk).await.expect("no trap") {
            Ok(b) => take(b),
            Err(e) => return error(e),
        }
    }
    match p.finish().await.expect("no trap") {
        Ok(b) => take(b),
        Err(e) => return error(e),
    }
    json!({"format": format, "conversations": convs, "warnings": warnings})
}

fn options(dir: &Path, name: &str) -> ParseOptions {
    let o: Value = std::fs::read_to_string(dir.join("options.json"))
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(json!({}));
    ParseOptions {
        format: None,
        include_tools: o["include_tools"].as_bool().unwrap_or(false),
        skip_invalid: o["skip_invalid"].as_bool().unwrap_or(false),
        first_line: o["first_line"].as_u64().unwrap_or(0) as u32,
        name: name.to_string(),
        max_episode_bytes: o["max_episode_bytes"].as_u64().unwrap_or(0) as u32,
        whole: true,
        max_episodes: 0,
    }
}

#[tokio::test]
async fn golden_transcripts_parse_the_same_whatever_the_chunking() {
    let engine = Abridge::builder()
        .store(Arc::new(SqliteStore::in_memory().unwrap()))
        .cache_dir(Some(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abridge-component-cache"),
        ))
        .build()
        .unwrap();
    let bless = std::env::var_os("ABRIDGE_BLESS").is_some();
    let dirs = crate::harness::golden_cases("transcripts");
    assert!(dirs.len() >= 15, "golden transcripts missing");
    for dir in dirs {
        let input = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_stem().is_some_and(|s| s == "input"))
            .unwrap_or_else(|| panic!("{}: no input file", dir.display()));
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&input).unwrap();
        let opts = options(&dir, &name);
        let whole = parse(&engine, &opts, &bytes, bytes.len()).await;
        let chunked = parse(&engine, &opts, &bytes, 7).await;
        assert_eq!(
            chunked,
            whole,
            "{}: 7-byte chunks differ from one feed",
            dir.display()
        );
        let expected = dir.join("expected.json");
        let got = serde_json::to_string_pretty(&whole).unwrap() + "\n";
        if bless {
            std::fs::write(&expected, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected).unwrap_or_else(|_| {
            panic!("{} missing (ABRIDGE_BLESS=1 writes it)", expected.display())
        });
        assert_eq!(got, want, "{}", dir.display());
    }
}
