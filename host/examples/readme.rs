//! The README's Rust snippet, compiled by `cargo test` and run by CI: embed the engine with a
//! SQLite store and Ollama, append a message, and read back the context for the next call.
//! (Below the summary threshold no model is called, so it runs without Ollama.)

use std::sync::Arc;
use std::time::Duration;

use abridge_backend::Ollama;
use abridge_engine::Abridge;
use abridge_engine::types::{Config, ContextRequest, NewEpisode, Role};
use abridge_store::SqliteStore;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(&dir.path().join("memory.db"))?;
    let ollama = Ollama::new("http://localhost:11434", Duration::from_secs(300))?;
    let engine = Abridge::builder()
        .store(Arc::new(store))
        .llm(Arc::new(ollama))
        .build()?;
    let cfg = Config::default();
    let message = NewEpisode {
        role: Role::User,
        content: "Book the small meeting room for Thursday at 10.".into(),
        source_key: "m1".into(),
        // The rest left as it comes: no time or speaker, no client item (the client's own
        // record, handed back as given), and what the engine fills in as it appends.
        ..Default::default()
    };
    engine.append("session-1", &[message]).await?;
    engine.after_episode_written("session-1", &cfg).await?;
    let request = ContextRequest {
        budget: 2000,
        // What the next call is about: the earlier turns that match it are included too.
        query: Some("When is the meeting room booked?".into()),
        // The rest as documented (the last 4 pairs verbatim, refresh beyond 8, no pins).
        ..Default::default()
    };
    let window = engine.context("session-1", request, &cfg).await?;
    let (n, tokens) = (window.messages.len(), window.tokens);
    println!("{n} messages, {tokens} tokens for the next call");
    Ok(())
}
