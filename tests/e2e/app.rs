//! The app layer in process, on the in-memory store with a manual clock: what the CLI and
//! `abridge serve` do, tested without subprocesses or sleeps.

use std::sync::Arc;
use std::time::Duration;

use abridge::app::{App, AppConfig, ErrorKind, Limits};
use abridge::sources::SessionMode;
use abridge::types::{
    Config, Error, FinishReason, Mode, NewEpisode, Prompt, Request, Response, Role,
};
use abridge::{Clock, ComponentSource, LlmBackend, ManualClock, MemoryStore, Runtime};

/// A model that says how many conversation lines it was shown.
struct Scripted;

#[async_trait::async_trait]
impl LlmBackend for Scripted {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let text = match &req.prompt {
            Prompt::Chat(ms) => ms
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            Prompt::Raw(s) => s.clone(),
        };
        let lines = text.lines().filter(|l| l.starts_with("User: ")).count();
        Ok(Response {
            text: format!("The user asked {lines} questions about the rollback plan."),
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

fn open(clock: Arc<ManualClock>, mode: Mode) -> App {
    let runtime = Runtime::load(
        &ComponentSource::Embedded,
        Some(&crate::harness::cache_dir()),
    )
    .expect("the engine component loads");
    App::open_with(
        AppConfig {
            db: "memory".into(),
            config: Config {
                threshold_tokens: 20,
                mode,
                quiescence_secs: 60,
                ..Config::default()
            },
            llm: Arc::new(Scripted),
            backend_name: "scripted".into(),
            batch_concurrency: 2,
            job_lease: Duration::from_secs(30),
            clock,
            runtime: Arc::new(runtime),
            log: Arc::new(|_, _| {}),
            limits: Limits::default(),
            events_kept: 100,
        },
        Arc::new(MemoryStore::new()),
    )
    .unwrap()
}

fn episodes(from: u64, n: u64, at_ms: i64) -> Vec<NewEpisode> {
    (from..from + n)
        .map(|i| NewEpisode {
            role: if i % 2 == 1 {
                Role::User
            } else {
                Role::Assistant
            },
            content: format!("Message {i}: when do we roll back the index rebuild?"),
            timestamp_ms: Some(at_ms),
            source_key: format!("k{i}"),
            tokens: 0,
            speaker: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_mode_waits_for_the_quiet_window_on_the_manual_clock_then_a_worker_refreshes() {
    let clock = Arc::new(ManualClock::at(1_767_225_600_000));
    let app = open(clock.clone(), Mode::Idle);
    let me = app.local();
    let now = clock.now_ms() as i64;
    let posted = me
        .append("s", episodes(1, 10, now), Vec::new())
        .await
        .unwrap();
    assert_eq!((posted.stored, posted.episodes), (10, 10));
    assert!(
        posted.job.is_none(),
        "idle: nothing is due while the talk goes on"
    );
    assert_eq!(me.session("s").await.unwrap().state, "waiting");

    // A minute of quiet on the manual clock: the next context queues the refresh and says
    // so, without waiting for it.
    clock.advance(61_000);
    let c = me.context("s", 2_000, 2, 8, None).await.unwrap();
    assert!(c.refresh_pending && c.covered == 0, "{c:?}");
    let job = c.job.expect("a due refresh is queued");
    assert_eq!(me.session("s").await.unwrap().active_job, Some(job.id));

    // A worker runs it; its events tell when the summary lands.
    let mut events = app.events().subscribe(me.tenant(), None).live;
    let workers = app.start_workers(1);
    let done = me
        .wait_job(job.id, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state.as_str(), "succeeded", "{:?}", done.error);
    let mut kinds = Vec::new();
    while let Ok(ev) = events.try_recv() {
        kinds.push(ev.kind);
    }
    assert!(kinds.contains(&"summary.written".to_string()), "{kinds:?}");
    let c = me.context("s", 2_000, 2, 8, None).await.unwrap();
    assert_eq!((c.covered, c.refresh_pending), (10, false));
    assert!(
        c.messages[0].content.contains("rollback plan"),
        "{:?}",
        c.messages
    );
    assert_eq!(me.session("s").await.unwrap().state, "fresh");
    workers.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_clears_every_table_of_the_session_in_the_memory_store() {
    let clock = Arc::new(ManualClock::at(1_767_225_600_000));
    let app = open(clock.clone(), Mode::Eager);
    let me = app.local();
    let now = clock.now_ms() as i64;
    // Inline refresh as the CLI's ingest: the trigger holds at the fifth message.
    let cfg = me.session_config("s").await.unwrap();
    let out = me
        .append_inline("s", &episodes(1, 6, now), &cfg)
        .await
        .unwrap();
    assert_eq!(out.written.len(), 1, "{out:?}");
    me.mark_source("s", "/t/s.jsonl", 6, 600).await.unwrap();
    me.set_mode(
        "s",
        Some(SessionMode {
            mode: Mode::Idle,
            quiescence_secs: Some(5),
        }),
    )
    .await
    .unwrap();
    let job = me.refresh("s").await.unwrap();
    assert!(job.is_none(), "every episode is covered");
    me.append("s", episodes(7, 1, now), Vec::new())
        .await
        .unwrap();
    let queued = me
        .refresh("s")
        .await
        .unwrap()
        .expect("a refresh of episode 7");
    assert_eq!(me.list_jobs(None, 10).await.unwrap().len(), 1);

    assert_eq!(me.reset("s").await.unwrap(), 7);
    let gone = me.session("s").await.unwrap_err();
    assert_eq!(gone.kind, ErrorKind::NotFound);
    assert!(
        me.job(queued.id).await.is_err(),
        "its queued job went with it"
    );
    assert_eq!(me.source_mark("s", 6).await.unwrap(), None);
    // Back again, it starts from nothing: the global mode, no summary.
    me.append("s", episodes(1, 2, now), Vec::new())
        .await
        .unwrap();
    let v = me.session("s").await.unwrap();
    assert_eq!(
        (v.own_mode, v.mode.as_str(), v.covered),
        (false, "eager", 0)
    );
    assert!(me.summaries("s").await.unwrap().is_empty());
}

fn jsonl(n: usize, topic: &str) -> String {
    (1..=n)
        .map(|i| {
            format!(
                "{{\"role\":\"{}\",\"content\":\"Message {i} about {topic}: the rollback plan.\"}}\n",
                if i % 2 == 1 { "user" } else { "assistant" }
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_in_process_passes_over_unchanged_files_and_reset_brings_a_session_back() {
    use abridge::app::backfill::{self, BackfillOptions, ScanFilter};
    let clock = Arc::new(ManualClock::at(1_767_225_600_000));
    let app = open(clock.clone(), Mode::Eager);
    let me = app.local();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("proj")).unwrap();
    std::fs::write(dir.path().join("proj/a.jsonl"), jsonl(6, "alpha")).unwrap();
    std::fs::write(dir.path().join("proj/b.jsonl"), jsonl(2, "beta")).unwrap();
    std::fs::write(dir.path().join("notes.json"), "{\"hello\": 1}").unwrap();
    let opts = BackfillOptions {
        min_episodes: 3,
        read: Default::default(),
        max_bytes: 1 << 20,
    };
    let cfg = me.session_config("x").await.unwrap();
    let pass = async || {
        let scan = backfill::scan(dir.path(), &ScanFilter::default()).unwrap();
        let mut out = Vec::new();
        for f in &scan.files {
            let o = me.backfill_file(f, &opts, &cfg).await.unwrap();
            out.push((f.rel.clone(), o.status, o.sessions.join(" ")));
        }
        out.sort();
        out
    };
    let first = pass().await;
    assert_eq!(
        first,
        vec![
            ("notes.json".into(), "skipped", "".into()),
            ("proj/a.jsonl".into(), "ok", "proj/a".into()),
            ("proj/b.jsonl".into(), "skipped", "".into()),
        ],
        "{first:?}"
    );
    assert_eq!(me.session("proj/a").await.unwrap().covered, 6);
    // Nothing changed: nothing is read again.
    let again = pass().await;
    assert!(again.iter().all(|(_, s, _)| *s == "unchanged"), "{again:?}");
    // The file grows: only its new episodes are summarized.
    std::fs::write(dir.path().join("proj/a.jsonl"), jsonl(9, "alpha")).unwrap();
    let grown = pass().await;
    assert_eq!(grown[1].1, "ok", "{grown:?}");
    assert_eq!(me.session("proj/a").await.unwrap().covered, 9);
    // reset forgets the file too, so the next backfill brings the session back.
    me.reset("proj/a").await.unwrap();
    let back = pass().await;
    assert_eq!(back[1].1, "ok", "{back:?}");
    assert_eq!(me.session("proj/a").await.unwrap().episodes, 9);
}
