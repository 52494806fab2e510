//! The app layer in process, on a SQLite store in memory with a manual clock: what the CLI and
//! `abridge serve` do, tested without subprocesses or sleeps.

use std::sync::Arc;
use std::time::Duration;

use abridge_app::sources::SessionMode;
use abridge_app::{App, AppConfig, ErrorKind, Limits};
use abridge_engine::types::{
    Config, Error, FinishReason, Mode, NewEpisode, Request, Response, Role,
};
use abridge_engine::{Clock, ComponentSource, LlmBackend, ManualClock, Runtime};
use abridge_store::SqliteStore;

/// A model that says how many conversation lines it was shown.
struct Scripted;

#[async_trait::async_trait]
impl LlmBackend for Scripted {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        let text = req.prompt.text();
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

/// An app in `mode` on a SQLite store in memory, with a manual clock at 2026-01-01.
fn open(mode: Mode) -> (Arc<ManualClock>, App) {
    let clock = Arc::new(ManualClock::at(1_767_225_600_000));
    let app = open_on(
        clock.clone(),
        mode,
        Arc::new(SqliteStore::in_memory().unwrap()),
    );
    (clock, app)
}

fn open_on(clock: Arc<ManualClock>, mode: Mode, store: Arc<SqliteStore>) -> App {
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
            memory: Default::default(),
            embedder: None,
            master_key: None,
            seal_vectors: false,
        },
        store,
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
            ..Default::default()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_mode_waits_for_the_quiet_window_on_the_manual_clock_then_a_worker_refreshes() {
    let (clock, app) = open(Mode::Idle);
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
    let c = me
        .context(
            "s",
            abridge_app::ContextAsk {
                pairs: 2,
                ..abridge_app::ContextAsk::new(2_000)
            },
        )
        .await
        .unwrap();
    let whole = c.full_tokens;
    assert!(c.refresh_pending && c.covered == 0, "{c:?}");
    let job = c.job.expect("a due refresh is queued");
    assert_eq!(me.session("s").await.unwrap().active_job, Some(job.id));

    // A worker runs it; its events tell when the summary lands.
    let mut events = app.events().subscribe(me.tenant(), None).await.live;
    let workers = app.start_workers(1);
    let done = me
        .wait_job(job.id, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state.as_str(), "succeeded", "{:?}", done.error);
    // The job row ends before the worker publishes its last events: read them as they come,
    // up to the job's own end.
    let mut kinds = Vec::new();
    while !kinds.iter().any(|k| k == "job.succeeded") {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Ok(ev)) => kinds.push(ev.kind),
            other => panic!("no job.succeeded event ({other:?}): {kinds:?}"),
        }
    }
    assert!(kinds.contains(&"summary.written".to_string()), "{kinds:?}");
    // A budget the whole history does not fit (one that does gets the history verbatim).
    let c = me
        .context(
            "s",
            abridge_app::ContextAsk {
                pairs: 2,
                ..abridge_app::ContextAsk::new(whole as u32 - 1)
            },
        )
        .await
        .unwrap();
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
    let (clock, app) = open(Mode::Eager);
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
    // The inline refresh ran as the session's job too (the one way a refresh runs): it is
    // listed, succeeded, beside the queued one.
    let states: Vec<String> = me
        .list_jobs(None, 10)
        .await
        .unwrap()
        .iter()
        .map(|j| j.state.clone())
        .collect();
    assert_eq!(states, vec!["queued", "succeeded"]);

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
    use abridge_app::backfill::{self, BackfillOptions, ScanFilter};
    let (_clock, app) = open(Mode::Eager);
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
    // A dry run first: plans on its own in-memory copy, stores nothing, calls no model.
    let dry_pass = async || {
        let dry = me.backfill_dry_run().unwrap();
        let scan = backfill::scan(dir.path(), &ScanFilter::default()).unwrap();
        let mut out = Vec::new();
        for f in &scan.files {
            let p = dry.plan_file(f, &opts, &cfg).await.unwrap();
            let calls: u32 = p.sessions.iter().map(|s| s.plan.calls).sum();
            out.push((f.rel.clone(), p.outcome.status, calls));
        }
        out.sort();
        out
    };
    let planned = dry_pass().await;
    assert_eq!(
        planned[0],
        ("notes.json".into(), "skipped", 0),
        "{planned:?}"
    );
    assert_eq!(planned[1].1, "planned", "{planned:?}");
    assert!(planned[1].2 >= 1, "{planned:?}");
    assert_eq!(
        planned[2],
        ("proj/b.jsonl".into(), "skipped", 0),
        "{planned:?}"
    );
    assert!(me.session_ids().await.unwrap().is_empty());

    let first = pass().await;
    assert_eq!(
        first,
        vec![
            ("notes.json".into(), "skipped", "".into()),
            ("proj/a.jsonl".into(), "ok", "a".into()),
            ("proj/b.jsonl".into(), "skipped", "".into()),
        ],
        "{first:?}"
    );
    assert_eq!(me.session("a").await.unwrap().covered, 6);
    // Nothing changed: nothing is read again, and the dry run says so too.
    let again = pass().await;
    assert!(again.iter().all(|(_, s, _)| *s == "unchanged"), "{again:?}");
    let planned = dry_pass().await;
    assert!(
        planned.iter().all(|(_, s, _)| *s == "unchanged"),
        "{planned:?}"
    );
    // The file grows: only its new episodes are summarized.
    std::fs::write(dir.path().join("proj/a.jsonl"), jsonl(9, "alpha")).unwrap();
    let grown = pass().await;
    assert_eq!(grown[1].1, "ok", "{grown:?}");
    assert_eq!(me.session("a").await.unwrap().covered, 9);
    // reset forgets the file too, so the next backfill brings the session back.
    me.reset("a").await.unwrap();
    let back = pass().await;
    assert_eq!(back[1].1, "ok", "{back:?}");
    assert_eq!(me.session("a").await.unwrap().episodes, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_in_process_baselines_waits_for_whole_lines_and_idle_quiet_then_resumes() {
    use abridge_app::watch::{WatchNote, WatchOptions};
    use std::io::Write;
    let (clock, app) = open(Mode::Idle);
    let me = app.local();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("live.jsonl");
    let add = |text: &str| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&file)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };
    let body = jsonl(8, "the index rebuild");
    let lines: Vec<&str> = body.split_inclusive('\n').collect();
    add(&lines[..2].concat());
    let notes = Arc::new(std::sync::Mutex::new(Vec::<WatchNote>::new()));
    let sink = {
        let notes = notes.clone();
        Arc::new(move |n: WatchNote| notes.lock().unwrap().push(n))
    };
    let taken = || std::mem::take(&mut *notes.lock().unwrap());
    let mut w = me
        .watcher(dir.path(), WatchOptions::default(), sink.clone())
        .await
        .unwrap();

    // First sight: a baseline after what the file holds; nothing imported, no model call.
    w.pass().await.unwrap();
    let baseline = lines[..2].concat().len() as u64;
    assert_eq!(
        taken(),
        vec![WatchNote::Baseline {
            file: "live.jsonl".into(),
            offset: baseline
        }]
    );
    assert!(me.session_ids().await.unwrap().is_empty());

    // Three whole lines and half of the next: only the whole ones are imported, numbered as
    // the file's own lines 3-5.
    let (head, tail) = lines[5].split_at(20);
    add(&format!("{}{}", lines[2], lines[3]));
    add(&format!("{}{head}", lines[4]));
    w.pass().await.unwrap();
    let n = taken();
    assert!(
        n.contains(&WatchNote::Imported {
            file: "live.jsonl".into(),
            added: 3,
            session: "live".into()
        }),
        "{n:?}"
    );
    let s = me.session("live").await.unwrap();
    assert_eq!((s.episodes, s.covered, s.state.as_str()), (3, 0, "waiting"));

    // The line is finished; idle mode waits for a minute of quiet on the manual clock.
    add(&format!("{tail}{}{}", lines[6], lines[7]));
    w.pass().await.unwrap();
    assert_eq!(me.session("live").await.unwrap().episodes, 6);
    assert_eq!(w.refreshed(), 0);
    assert_eq!(w.pending(), vec!["live".to_string()]);
    clock.advance(61_000);
    w.pass().await.unwrap();
    assert!(taken().contains(&WatchNote::Summarized {
        session: "live".into(),
        through: 6
    }));
    assert_eq!(me.session("live").await.unwrap().covered, 6);
    assert!(w.pending().is_empty());
    assert_eq!((w.imported(), w.refreshed()), (6, 1));
    drop(w);

    // A new watcher resumes at the recorded offset: nothing read twice, nothing refreshed.
    let mut w = me
        .watcher(dir.path(), WatchOptions::default(), sink.clone())
        .await
        .unwrap();
    w.pass().await.unwrap();
    assert_eq!((w.imported(), w.refreshed()), (0, 0));
    assert!(taken().is_empty());

    // Replaced by a shorter file: read again from the start. Its lines 1-2 (before the
    // baseline) are new to the session; line 3 is known and not stored twice.
    std::fs::write(&file, lines[..3].concat()).unwrap();
    w.pass().await.unwrap();
    let n = taken();
    assert!(
        n.contains(&WatchNote::Shrank {
            file: "live.jsonl".into()
        }) && n.contains(&WatchNote::Imported {
            file: "live.jsonl".into(),
            added: 2,
            session: "live".into()
        }),
        "{n:?}"
    );
    assert_eq!(me.session("live").await.unwrap().episodes, 8);

    // The follow loop ends when stopped, from another task.
    let stop = w.stopper();
    let follow =
        tokio::spawn(async move { w.follow(Duration::from_millis(20), false).await.map(|()| w) });
    stop.stop();
    let w = tokio::time::timeout(Duration::from_secs(30), follow)
        .await
        .expect("a stopped watcher returns")
        .unwrap()
        .unwrap();
    assert_eq!(w.imported(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_by_a_short_lived_app_are_written_when_it_is_dropped() {
    use abridge_store::EventStore;
    let clock = Arc::new(ManualClock::at(1_767_225_600_000));
    let store = Arc::new(SqliteStore::in_memory().unwrap());
    let app = open_on(clock.clone(), Mode::Eager, store.clone());
    let me = app.local();
    let now = clock.now_ms() as i64;
    let posted = me
        .append("s", episodes(1, 10, now), Vec::new())
        .await
        .unwrap();
    let job = posted.job.expect("eager: a refresh is queued");
    drop(me);
    drop(app);
    let rows = store.recent_events(10).await.unwrap();
    assert!(
        rows.iter()
            .any(|r| r.kind == "job.queued" && r.job == Some(job.id)),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_and_a_post_of_the_same_messages_queue_the_same_target() {
    use abridge_app::{Bring, ImportRequest};
    // Window mode folds what falls out of its window: the verdict's fold point is not the
    // last episode, so a rule that queued "everything" for an upload would differ here.
    let (_clock, app) = open(Mode::Window);
    let me = app.local();
    let lines = jsonl(400, "the index rebuild");
    let messages: Vec<abridge_app::MessageIn> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let posted = me.post("posted", messages).await.unwrap();
    let req = ImportRequest {
        session: Some("uploaded"),
        ..ImportRequest::new(
            "upload.jsonl",
            abridge_app::transcript::Input::Bytes(lines.as_bytes()),
        )
    };
    let uploaded = me.import(req, Bring::Queue).await.unwrap();
    let post_job = posted
        .job
        .expect("400 messages in window mode queue a fold");
    let upload_job = uploaded.conversations[0]
        .job
        .clone()
        .expect("the same messages uploaded queue a fold");
    assert_eq!(post_job.target, upload_job.target);
    assert!(
        post_job.target < 400,
        "the window's newest messages stay unfolded: {}",
        post_job.target
    );
    // Asked for (a refresh), every episode is the work.
    let asked = me.refresh("uploaded").await.unwrap().unwrap();
    assert_eq!(
        asked.id, upload_job.id,
        "a queued refresh of the session coalesces"
    );
}
