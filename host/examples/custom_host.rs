//! Embedding abridge in another Rust program with your own parts: a scripted model (no
//! server), a fixed clock and the in-memory store. Run: `cargo run -p abridge --example custom_host`.

use std::sync::Arc;

use abridge::types::{Config, Error, FinishReason, NewEpisode, Prompt, Request, Response, Role};
use abridge::{Abridge, Clock, LlmBackend, MemoryStore};

/// A "model" that reports how many conversation lines it was shown.
struct Scripted;

#[async_trait::async_trait]
impl LlmBackend for Scripted {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let Prompt::Chat(messages) = req.prompt else {
            unreachable!("chat rendering is the default")
        };
        let prompt = &messages[1].content;
        let lines = prompt
            .lines()
            .filter(|l| l.starts_with("User: ") || l.starts_with("Assistant: "))
            .count();
        let update = if prompt.starts_with("Current summary:") {
            " It updates the earlier summary."
        } else {
            ""
        };
        Ok(Response {
            text: format!(
                "The user and the assistant exchanged {lines} messages about a release.{update}"
            ),
            finish_reason: FinishReason::Stop,
            prompt_tokens: None,
            output_tokens: None,
            server_ms: None,
        })
    }

    fn name(&self) -> &str {
        "scripted"
    }
}

/// Time stands still at 2026-01-01.
struct Fixed;

impl Clock for Fixed {
    fn now_ms(&self) -> u64 {
        1_767_225_600_000
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let engine = Abridge::builder()
        .store(Arc::new(MemoryStore::new()))
        .llm(Arc::new(Scripted))
        .clock(Arc::new(Fixed))
        .build()?;
    let cfg = Config {
        threshold_tokens: 20,
        ..Config::default()
    };
    for i in 1..=10 {
        let role = if i % 2 == 1 {
            Role::User
        } else {
            Role::Assistant
        };
        let text =
            format!("Message {i}: the release branch needs one more review before the tag is cut.");
        let ep = NewEpisode {
            role,
            content: text,
            timestamp_ms: None,
            source_key: i.to_string(),
            tokens: 0,
            speaker: None,
        };
        engine.append("demo", &[ep]).await?;
        let out = engine.after_episode_written("demo", &cfg).await?;
        for row in out.written {
            println!(
                "after episode {i}: summary {} covers {}-{}: {}",
                row.id, row.first_episode, row.last_episode, row.content
            );
        }
    }
    let chain = engine.chain("demo").await?;
    assert_eq!(
        (chain.len(), chain[0].first_episode, chain[0].last_episode),
        (1, 1, 10)
    );
    assert!(
        chain[0]
            .content
            .ends_with("It updates the earlier summary.")
    );
    assert_eq!(chain[0].updated_ms, 1_767_225_600_000);
    println!("ok: one summary row covers episodes 1-10");
    Ok(())
}
