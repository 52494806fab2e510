//! Embedding abridge in another Rust program through its app layer (the one the CLI and
//! `abridge serve` use), with your own parts: a scripted model (no server), a fixed clock and
//! a database file of your choosing. It shows both refresh styles: a caller that waits
//! (`append_inline`, as the CLI's ingest) and a service that answers at once and summarizes
//! in the background (`append` + workers + events, as `abridge serve`).
//! Run: `cargo run -p abridge --example custom_host`.

use std::sync::Arc;

use std::time::Duration;

use abridge_app::{App, AppConfig, ContextAsk, Limits};
use abridge_engine::types::{
    Config, Error, FinishReason, Level, Mode, NewEpisode, Prompt, Request, Response, Role,
};
use abridge_engine::{Clock, ComponentSource, LlmBackend, Runtime};

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

fn episode(i: u64) -> NewEpisode {
    NewEpisode {
        role: if i % 2 == 1 {
            Role::User
        } else {
            Role::Assistant
        },
        content: format!(
            "Message {i}: the release branch needs one more review before the tag is cut."
        ),
        timestamp_ms: None,
        source_key: i.to_string(),
        // The rest (speaker, the client's item, and what the engine fills in) left empty.
        ..Default::default()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let app = App::open(AppConfig {
        db: dir.path().join("memory.db"),
        config: Config {
            threshold_tokens: 20,
            // The eager trigger (a fold every five messages), to show each message's effect;
            // the default, window mode, folds only what left the recent eight.
            mode: Mode::Eager,
            ..Config::default()
        },
        llm: Arc::new(Scripted),
        backend_name: "scripted".into(),
        batch_concurrency: 4,
        job_lease: Duration::from_secs(30),
        clock: Arc::new(Fixed),
        runtime: Arc::new(Runtime::load(&ComponentSource::Embedded, None)?),
        log: Arc::new(|level, msg| {
            if matches!(level, Level::Warn) {
                eprintln!("engine: {msg}");
            }
        }),
        limits: Limits::default(),
        events_kept: 100,
        memory: Default::default(),
        embedder: None,
        master_key: None,
        seal_vectors: false,
    })?;
    let me = app.local();

    // 1. The caller waits: each message is stored and, when the trigger holds, summarized
    //    before the call returns.
    let cfg = me.session_config("demo").await?;
    for i in 1..=10 {
        let out = me.append_inline("demo", &[episode(i)], &cfg).await?;
        for row in out.written {
            println!(
                "after episode {i}: summary {} covers {}-{}: {}",
                row.id, row.first_episode, row.last_episode, row.content
            );
        }
    }
    let chain = me.summaries("demo").await?;
    assert_eq!(
        (chain.len(), chain[0].first_episode, chain[0].last_episode),
        (1, 1, 10)
    );
    assert!(
        chain[0]
            .content
            .ends_with("It updates the earlier summary.")
    );
    println!("ok: one summary row covers episodes 1-10");

    // 2. A service: messages are stored at once, the refresh runs as a job on the workers,
    //    and its events say when the summary lands.
    let workers = app.start_workers(2);
    let mut events = app.events().subscribe(me.tenant(), None).await.live;
    let posted = me
        .append("service", (1..=10).map(episode).collect(), Vec::new())
        .await?;
    let job = posted
        .job
        .expect("ten messages over the threshold queue a refresh");
    println!("stored {} messages; job {} queued", posted.stored, job.id);
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
        if ev.job == Some(job.id) {
            println!("event {}: {}", ev.kind, ev.data);
            if ev.kind == "job.succeeded" {
                break;
            }
            anyhow::ensure!(ev.kind != "job.failed", "the job failed: {}", ev.data);
        }
    }
    // A history that fits the budget is sent whole; one that does not gets the summary.
    let whole = me
        .context(
            "service",
            ContextAsk {
                pairs: 2,
                ..ContextAsk::new(2_000)
            },
        )
        .await?;
    assert_eq!(u64::from(whole.tokens), whole.full_tokens);
    let budget = u32::try_from(whole.full_tokens - 1)?;
    let context = me
        .context(
            "service",
            ContextAsk {
                pairs: 2,
                ..ContextAsk::new(budget)
            },
        )
        .await?;
    assert_eq!(context.covered, 10);
    println!(
        "ok: the context holds the summary and {} recent messages in {} tokens",
        context.recent, context.tokens
    );
    workers.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
