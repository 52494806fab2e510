//! Golden summary chains (tests/golden/chains): conversation and settings in; the exact
//! chain and the model requests out (and the contexts at the budgets a case names), against
//! the deterministic test server. The JS host runs
//! the same cases (js/test/golden.test.js). `ABRIDGE_BLESS=1` rewrites `expected.json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use abridge_backend::Ollama;
use abridge_engine::types::{Config, NewEpisode, Role, SummaryRow};
use abridge_engine::{Abridge, Clock};
use abridge_store::SqliteStore;
use serde_json::{Value, json};

use crate::harness::TestServer;

/// Starts at 2026-01-01T00:00:00Z and moves one second per reading.
pub struct TickingClock(AtomicU64);

impl Clock for TickingClock {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(1000, Ordering::SeqCst)
    }
}

fn config(v: &Value) -> Config {
    abridge_engine::types::config_from_json(v)
}

fn row_json(r: &SummaryRow) -> Value {
    json!({
        "id": r.id, "first_episode": r.first_episode, "last_episode": r.last_episode,
        "content": r.content, "tokens": r.tokens, "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens, "model": r.model, "created_ms": r.created_ms, "updated_ms": r.updated_ms,
        "skipped": r.skipped.iter().map(|x| [x.first, x.last]).collect::<Vec<_>>(),
    })
}

async fn run_case(dir: &Path) -> Value {
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("input.json")).unwrap()).unwrap();
    let server = TestServer::start();
    let engine = Abridge::builder()
        .store(Arc::new(SqliteStore::in_memory().unwrap()))
        .llm(Arc::new(
            Ollama::new(&server.url(), Duration::from_secs(30)).unwrap(),
        ))
        .clock(Arc::new(TickingClock(AtomicU64::new(1_767_225_600_000))))
        .cache_dir(Some(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abridge-component-cache"),
        ))
        .build()
        .unwrap();
    let cfg = config(&input["config"]);
    let session = "golden";
    let episodes: Vec<NewEpisode> = input["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, e)| NewEpisode {
            role: Role::parse(e["role"].as_str().unwrap()).unwrap(),
            content: e["content"].as_str().unwrap().to_string(),
            timestamp_ms: e["timestamp_ms"].as_i64(),
            source_key: i.to_string(),
            tokens: 0,
            speaker: e["speaker"].as_str().map(str::to_string),
            ..Default::default()
        })
        .collect();
    match input["mode"].as_str() {
        Some("ingest") => {
            for e in &episodes {
                engine
                    .append(session, std::slice::from_ref(e))
                    .await
                    .unwrap();
                engine.after_episode_written(session, &cfg).await.unwrap();
            }
        }
        _ => {
            engine.append(session, &episodes).await.unwrap();
            engine.summarize_now(session, &cfg).await.unwrap();
        }
    }
    let chain: Vec<Value> = engine
        .chain(session)
        .await
        .unwrap()
        .iter()
        .map(row_json)
        .collect();
    // Batches reach the server concurrently, so requests are compared in a canonical order.
    let mut requests: Vec<Value> = server
        .generations()
        .into_iter()
        .map(|r| json!({"path": r.path, "body": r.body}))
        .collect();
    requests.sort_by_key(|r| r.to_string());
    let mut out = json!({"chain": chain, "requests": requests});
    // Contexts at the budgets the case asks for: the messages and each part's tokens.
    if let Some(budgets) = input["contexts"].as_array() {
        let mut contexts = Vec::new();
        for b in budgets {
            // A budget, or {"budget", "query"}: a context with a query.
            let (budget, query) = match b.as_u64() {
                Some(n) => (n, None),
                None => (
                    b["budget"].as_u64().unwrap(),
                    b["query"].as_str().map(str::to_string),
                ),
            };
            let req = abridge_engine::types::ContextRequest {
                query,
                budget: budget as u32,
                pairs: 2,
                refresh_after: u32::MAX,
                pins: vec![],
                ..Default::default()
            };
            let w = engine.context(session, req, &cfg).await.unwrap();
            let p = &w.parts;
            contexts.push(json!({
                "budget": w.budget,
                "tokens": w.tokens,
                "parts": {"summary": p.summary, "ledger": p.ledger, "digest": p.digest,
                    "pinned": p.pinned, "recent": p.recent, "days": p.days, "found": p.found},
                "omitted_ranges": w.omitted_ranges.iter().map(|r| [r.first, r.last]).collect::<Vec<_>>(),
                "messages": w.messages.iter().map(|m| json!({"role": m.role.as_str(), "content": m.content})).collect::<Vec<_>>(),
                "stable": {"messages": w.stable.messages, "chars": w.stable.chars},
            }));
        }
        out["contexts"] = Value::Array(contexts);
    }
    out
}

#[tokio::test]
async fn golden_chains_match() {
    let dirs = crate::harness::golden_cases("chains");
    assert!(dirs.len() >= 4);
    let mut failures = Vec::new();
    for dir in dirs {
        let got = run_case(&dir).await;
        let path = dir.join("expected.json");
        if std::env::var_os("ABRIDGE_BLESS").is_some() {
            std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
            continue;
        }
        let want: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|_| {
                panic!(
                    "{} is missing; run ABRIDGE_BLESS=1 cargo test --workspace golden",
                    path.display()
                )
            }))
            .unwrap();
        if want != got {
            failures.push(format!(
                "{}\n--- expected\n{}\n--- got\n{}",
                dir.display(),
                serde_json::to_string_pretty(&want).unwrap(),
                serde_json::to_string_pretty(&got).unwrap()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "golden chain mismatches:\n{}",
        failures.join("\n\n")
    );
}
