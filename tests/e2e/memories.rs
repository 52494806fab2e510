//! Memories and cluster summaries: the app layer in process (SQLite in memory and in a real
//! file) with a model that restates the facts it is shown, and the CLI.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use abridge_app::memories::{Summaries, scope};
use abridge_app::{App, AppConfig, Limits};
use abridge_engine::types::{
    ClusterAction, Config, Error, FinishReason, MemoryFilter, MemoryIn, Request, Response,
};
use abridge_engine::{ComponentSource, LlmBackend, ManualClock, Runtime};
use abridge_store::AppStore;
use abridge_store::SqliteStore;
use abridge_store::tenant::Tenant;
use serde_json::Value;

/// The test server's model in process (it restates every fact line and the current summary it
/// is shown), after a delay, counting its calls and the most in flight.
struct Restating {
    calls: AtomicUsize,
    delay: Duration,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

#[async_trait::async_trait]
impl LlmBackend for Restating {
    async fn generate(&self, req: Request) -> Result<Response, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let text = abridge_test_llm::summarize(&req.prompt.text());
        Ok(Response {
            text,
            finish_reason: FinishReason::Stop,
            prompt_tokens: Some(100),
            output_tokens: Some(40),
            server_ms: None,
        })
    }

    fn name(&self) -> &str {
        "restating"
    }
}

fn open_on(store: Arc<dyn AppStore>, delay: Duration) -> (App, Arc<Restating>) {
    let (app, llm, _) = open_limited(store, delay, Limits::default());
    (app, llm)
}

fn open_limited(
    store: Arc<dyn AppStore>,
    delay: Duration,
    limits: Limits,
) -> (App, Arc<Restating>, Arc<ManualClock>) {
    let llm = Arc::new(Restating {
        calls: AtomicUsize::new(0),
        delay,
        in_flight: AtomicUsize::new(0),
        most_in_flight: AtomicUsize::new(0),
    });
    let clock = Arc::new(ManualClock::at(1_767_225_600_000));
    let runtime = Runtime::load(
        &ComponentSource::Embedded,
        Some(&crate::harness::cache_dir()),
    )
    .expect("the engine component loads");
    let app = App::open_with(
        AppConfig {
            db: "memories".into(),
            config: Config {
                model: "restating".into(),
                ..Config::default()
            },
            llm: llm.clone(),
            backend_name: "restating".into(),
            batch_concurrency: 2,
            job_lease: Duration::from_secs(30),
            clock: clock.clone(),
            runtime: Arc::new(runtime),
            log: Arc::new(|_, _| {}),
            limits,
            events_kept: 100,
            memory: Default::default(),
            embedder: None,
            master_key: None,
            seal_vectors: false,
        },
        store,
    )
    .unwrap();
    (app, llm, clock)
}

fn open() -> (App, Arc<Restating>) {
    open_on(Arc::new(SqliteStore::in_memory().unwrap()), Duration::ZERO)
}

const EDITOR: [&str; 4] = [
    "Alice prefers the dark theme in her editor",
    "Alice uses a dark theme with large fonts in the editor",
    "Alice wants the editor theme dark at night",
    "Alice likes a dark editor theme with high contrast",
];

fn fact(id: &str, text: &str) -> MemoryIn {
    MemoryIn {
        id: id.into(),
        scope: scope("alice", "web", "prod", "preference", "editor"),
        text: text.into(),
        importance: None,
        replaces: None,
    }
}

/// `abridge memory add` of one of Alice's editor preferences.
fn add_fact<'a>(text: &'a str, id: &'a str) -> [&'a str; 11] {
    [
        "memory",
        "add",
        text,
        "--user",
        "alice",
        "--type",
        "preference",
        "--key",
        "editor",
        "--id",
        id,
    ]
}

fn calls(llm: &Restating) -> usize {
    llm.calls.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_facts_one_summary_refreshed_in_place_and_deletes_never_resurface() {
    let (app, llm) = open();
    let me = app.local();
    // Two facts: no summary, recall returns the raw memories.
    let r = me
        .remember(
            vec![fact("m1", EDITOR[0]), fact("m2", EDITOR[1])],
            Summaries::Leave,
        )
        .await
        .unwrap()
        .memories;
    assert!(r.iter().all(|x| !x.due));
    // Written without an importance, a memory has the guest's default.
    assert_eq!(me.memory("m1").await.unwrap().importance, 0.5);
    // The third is due; its summary names all three sources, in one call.
    let r = me
        .remember(vec![fact("m3", EDITOR[2])], Summaries::Leave)
        .await
        .unwrap()
        .memories;
    assert!(r[0].due);
    let c = r[0].cluster;
    let o = me.summarize_due(&[c]).await.remove(0).unwrap().unwrap();
    assert_eq!(o.action, ClusterAction::Created);
    let s = o.summary.unwrap();
    assert_eq!(s.covered, 3);
    assert_eq!(
        me.cluster_summary(s.id).await.unwrap().sources,
        ["m1", "m2", "m3"]
    );
    for t in &EDITOR[..3] {
        assert!(s.text.contains(t), "{}", s.text);
    }
    assert_eq!(calls(&llm), 1);
    let hits = me
        .recall("dark editor theme", &MemoryFilter::default(), 10)
        .await
        .unwrap();
    let sum = hits
        .iter()
        .find(|h| h.kind == "summary")
        .expect("the summary is recalled");
    assert_eq!(sum.sources, ["m1", "m2", "m3"]);
    assert_eq!(
        hits.iter().filter(|h| h.kind == "memory").count(),
        3,
        "sources stay"
    );
    let sources = me.summary_sources(s.id).await.unwrap();
    assert_eq!(
        sources.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        ["m1", "m2", "m3"]
    );

    // A fourth: refreshed in place with one call; the same member set again: no call.
    let r = me
        .remember(vec![fact("m4", EDITOR[3])], Summaries::Leave)
        .await
        .unwrap()
        .memories;
    let o = me
        .summarize_due(&[r[0].cluster])
        .await
        .remove(0)
        .unwrap()
        .unwrap();
    assert_eq!(o.action, ClusterAction::Refreshed);
    assert_eq!(o.summary.as_ref().unwrap().id, s.id);
    assert_eq!(calls(&llm), 2);
    let again = me
        .remember(vec![fact("m4", EDITOR[3])], Summaries::Leave)
        .await
        .unwrap()
        .memories;
    assert!(!again[0].created && !again[0].due);
    let o = me.summarize_cluster(c).await.unwrap().unwrap();
    assert_eq!(o.action, ClusterAction::Unchanged);
    assert_eq!(calls(&llm), 2);

    // Deleting a source drops it and its text at once, and the rebuild leaves it out.
    let f = me.forget("m2", Summaries::Leave).await.unwrap();
    assert!(f.summary_deleted && f.due);
    let hits = me
        .recall("dark theme large fonts", &MemoryFilter::default(), 10)
        .await
        .unwrap();
    assert!(
        hits.iter().all(|h| !h.text.contains("large fonts")),
        "{hits:?}"
    );
    let o = me
        .summarize_due(&[f.cluster])
        .await
        .remove(0)
        .unwrap()
        .unwrap();
    let s = o.summary.unwrap();
    assert!(!s.text.contains("large fonts"), "{}", s.text);
    assert_eq!(
        me.cluster_summary(s.id).await.unwrap().sources,
        ["m1", "m3", "m4"]
    );
    // Under three: the summary goes and recall falls back to the raw memories.
    me.forget("m1", Summaries::Leave).await.unwrap();
    let o = me.summarize_cluster(c).await.unwrap().unwrap();
    assert!(matches!(
        o.action,
        ClusterAction::TooFew | ClusterAction::Deleted
    ));
    let hits = me
        .recall("dark editor theme", &MemoryFilter::default(), 10)
        .await
        .unwrap();
    assert!(hits.iter().all(|h| h.kind == "memory"));
    assert_eq!(hits.len(), 2);
    assert_eq!(
        me.forget("m1", Summaries::Leave).await.unwrap_err().kind,
        abridge_app::ErrorKind::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_identical_memories_never_see_each_other() {
    let (app, _) = open();
    let (a, b) = (
        app.tenant(&Tenant::new("acme").unwrap()),
        app.tenant(&Tenant::new("globex").unwrap()),
    );
    for t in [&a, &b] {
        let items = (0..3).map(|i| fact(&format!("m{i}"), EDITOR[i])).collect();
        let r = t.remember(items, Summaries::Leave).await.unwrap().memories;
        t.summarize_due(&[r[2].cluster]).await.remove(0).unwrap();
    }
    a.forget("m0", Summaries::Leave).await.unwrap();
    // b's cluster and summary are untouched by a's delete.
    let bc = b.clusters(&MemoryFilter::default()).await.unwrap();
    assert_eq!(bc.len(), 1);
    assert_eq!(bc[0].members, ["m0", "m1", "m2"]);
    let bs = bc[0].summary.expect("b keeps its summary");
    assert_eq!(b.summary_sources(bs).await.unwrap().len(), 3);
    assert!(a.memory("m0").await.is_err());
    assert!(b.memory("m0").await.is_ok());
    // Recall in a never returns b's rows.
    let hits = a
        .recall("dark editor theme", &MemoryFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(hits.len(), 2);
    assert!(hits.iter().all(|h| h.kind == "memory"));
    // A foreign summary id is not found.
    let ac = a.clusters(&MemoryFilter::default()).await.unwrap();
    assert!(ac[0].summary.is_none());
    assert_eq!(
        a.cluster_summary(bs).await.unwrap_err().kind,
        abridge_app::ErrorKind::NotFound,
        "b's summary id is not a's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inline_path_and_the_sweeper_racing_make_one_summary() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("m.db")).unwrap());
    let (app, llm) = open_on(store, Duration::from_millis(300));
    let me = app.local();
    let items = (0..3).map(|i| fact(&format!("m{i}"), EDITOR[i])).collect();
    let r = me.remember(items, Summaries::Leave).await.unwrap().memories;
    let c = r[2].cluster;
    let (inline, sweep) = tokio::join!(me.summarize_cluster(c), app.sweep(None, 20));
    let inline = inline.unwrap();
    let sweep = sweep.unwrap();
    assert_eq!(calls(&llm), 1, "one model call: {inline:?} {sweep:?}");
    let made =
        usize::from(inline.is_some_and(|o| o.action == ClusterAction::Created)) + sweep.written;
    assert_eq!(made, 1, "{sweep:?}");
    // Both settled: a second sweep does nothing.
    let again = app.sweep(None, 20).await.unwrap();
    assert_eq!((again.clusters, calls(&llm)), (0, 1), "{again:?}");
    let cl = me.clusters(&MemoryFilter::default()).await.unwrap();
    assert!(cl[0].settled && cl[0].summary.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_caps_each_scope_per_run_and_settles_what_it_did() {
    let (app, llm) = open();
    let me = app.local();
    // Ten clusters of one user and project (different keys).
    for k in 0..10 {
        let items = (0..3)
            .map(|i| MemoryIn {
                id: format!("k{k}-{i}"),
                scope: scope("alice", "web", "prod", "preference", &format!("topic{k}")),
                text: EDITOR[i].into(),
                importance: Some(0.5),
                replaces: None,
            })
            .collect();
        me.remember(items, Summaries::Leave).await.unwrap();
    }
    let r = app.sweep(None, 4).await.unwrap();
    assert_eq!((r.clusters, r.written, r.deferred), (4, 4, 6), "{r:?}");
    let r = app.sweep(None, 100).await.unwrap();
    assert_eq!((r.clusters, r.written), (6, 6), "{r:?}");
    assert_eq!(calls(&llm), 10);
    assert_eq!(app.sweep(None, 100).await.unwrap().clusters, 0);
}

/// Decisions of the guest over the golden input, as JSON.
async fn decisions(app: &App) -> Value {
    let me = app.local();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/golden/clusters/memories.jsonl"),
    )
    .unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        let r = me
            .remember(
                vec![MemoryIn {
                    id: s("id"),
                    scope: scope(
                        &s("user"),
                        &s("project"),
                        &s("environment"),
                        &s("type"),
                        &s("key"),
                    ),
                    text: s("text"),
                    importance: Some(0.5),
                    replaces: None,
                }],
                Summaries::Leave,
            )
            .await
            .unwrap()
            .memories;
        out.insert(
            s("id"),
            serde_json::json!({"cluster": r[0].cluster, "created": r[0].created, "due": r[0].due}),
        );
    }
    serde_json::to_value(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_cluster_decisions() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden/clusters/expected.json");
    let (mem, _) = open();
    let got = decisions(&mem).await;
    let dir = tempfile::tempdir().unwrap();
    let (sql, _) = open_on(
        Arc::new(SqliteStore::open(&dir.path().join("g.db")).unwrap()),
        Duration::ZERO,
    );
    assert_eq!(
        decisions(&sql).await,
        got,
        "SQLite in memory and in a file agree"
    );
    if std::env::var_os("ABRIDGE_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(got, want);
}

#[test]
fn the_cli_adds_lists_recalls_and_deletes_memories() {
    let env = crate::harness::Env::new().with("ABRIDGE_BACKEND", "extractive");
    for (i, t) in EDITOR[..3].iter().enumerate() {
        env.run(&add_fact(t, &format!("m{i}"))).assert_ok();
    }
    let last = env.run(&["memory", "list", "--user", "alice", "--json"]);
    assert_eq!(last.assert_ok().stdout.lines().count(), 3);
    let r = env.run(&["recall", "dark editor theme", "--json", "-k", "10"]);
    let v = r.json();
    let results = v["results"].as_array().unwrap();
    let summary = results
        .iter()
        .find(|x| x["kind"] == "summary")
        .expect("the third add made a summary");
    assert_eq!(summary["sources"], serde_json::json!(["m0", "m1", "m2"]));
    env.run(&["memory", "delete", "m1"]).assert_ok();
    let v = env.run(&["recall", "dark editor theme", "--json"]).json();
    assert!(
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["kind"] == "memory")
    );
    env.run(&["memory", "show", "m1"])
        .assert_fails(2, &["no memory 'm1'", "abridge memory list"]);
    env.run(&[
        "memory",
        "add",
        "x",
        "--user",
        "alice",
        "--key",
        "k",
        "--importance",
        "2",
    ])
    .assert_fails(2, &["from 0 to 1"]);
    let bad = env.write("bad.jsonl", "{\"user\": \"a\"\nnot json\n");
    env.run(&["memory", "import", bad.to_str().unwrap()])
        .assert_fails(2, &["line 1"]);
}

/// The CLI's smallest memory is its text and its user, as over HTTP and MCP: related facts
/// without a key cluster by meaning and get one summary; a message without content is an
/// error, not a silent nothing.
#[test]
fn the_cli_takes_a_memory_without_a_key_and_refuses_a_message_without_content() {
    let env = crate::harness::Env::new().with("ABRIDGE_BACKEND", "extractive");
    for t in &EDITOR[..3] {
        env.run(&["memory", "add", t, "--user", "alice"])
            .assert_ok();
    }
    let v = env
        .run(&["recall", "dark editor theme", "--json", "-k", "10"])
        .json();
    let summary = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "summary")
        .expect("the three facts made one cluster and its summary");
    assert_eq!(summary["sources"].as_array().unwrap().len(), 3);
    let lines = env.write("m.jsonl", "{\"role\": \"user\", \"text\": \"hi\"}\n");
    env.run(&["ingest", "--session", "s", lines.to_str().unwrap()])
        .assert_fails(2, &["needs \"content\"", "name that field \"content\""]);
}

#[test]
fn cluster_summaries_over_http_with_the_test_server() {
    let server = abridge_test_llm::TestServer::start();
    let env = crate::harness::Env::new()
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_BACKEND", "ollama");
    for (i, t) in EDITOR.iter().enumerate() {
        env.run(&add_fact(t, &format!("m{i}"))).assert_ok();
    }
    let v = env
        .run(&["recall", "dark editor theme", "--json", "-k", "10"])
        .json();
    let s = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "summary")
        .expect("a summary")
        .clone();
    assert_eq!(s["sources"], serde_json::json!(["m0", "m1", "m2", "m3"]));
    let text = s["text"].as_str().unwrap();
    for t in EDITOR {
        assert!(text.contains(t), "{text}");
    }
    // Two model calls over HTTP: the summary at three, the refresh at four.
    let facts: Vec<_> = server
        .generations()
        .into_iter()
        .filter(|r| {
            let b = r.body.to_string();
            b.contains("Facts:") || b.contains("New facts:")
        })
        .collect();
    assert_eq!(facts.len(), 2, "{facts:?}");
    assert!(facts[1].body.to_string().contains("Current summary:"));
}

/// Whether `needle` occurs in the database file or its WAL.
fn on_disk(db: &std::path::Path, needle: &[u8]) -> bool {
    let mut hay = std::fs::read(db).unwrap_or_default();
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    hay.extend(std::fs::read(&wal).unwrap_or_default());
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_canary_is_in_neither_the_database_nor_its_wal_and_keys_rotate() {
    const CANARY: &str = "canary-7f3a9c-quokka";
    let add = |env: &crate::harness::Env, i: usize| {
        env.run(&add_fact(
            &format!("Alice keeps the {CANARY} theme in her editor, note {i}"),
            &format!("c{i}"),
        ))
    };
    // Control: without a key the canary is on disk in the clear (the test can see it), and
    // the first command says so (once for the database).
    let plain = crate::harness::Env::new().with("ABRIDGE_BACKEND", "extractive");
    for i in 0..3 {
        let r = add(&plain, i);
        r.assert_ok();
        assert_eq!(
            r.stderr.contains("stored unencrypted"),
            i == 0,
            "{}",
            r.stderr
        );
    }
    assert!(on_disk(&plain.db(), CANARY.as_bytes()));

    let env = crate::harness::Env::new().with("ABRIDGE_BACKEND", "extractive");
    let key = env.run(&["keys", "new"]);
    let keyfile = env.write("master.key", key.assert_ok().stdout.as_bytes());
    let env = env.with("ABRIDGE_MASTER_KEY_FILE", keyfile.to_str().unwrap());
    for i in 0..3 {
        let r = add(&env, i);
        r.assert_ok();
        assert!(!r.stderr.contains("unencrypted"), "{}", r.stderr);
    }
    // The summary was written (it states the canary) and everything reads back.
    let v = env
        .run(&["recall", "editor theme", "--json", "-k", "10"])
        .json();
    let rs = v["results"].as_array().unwrap();
    assert!(
        rs.iter()
            .any(|x| x["kind"] == "summary" && x["text"].as_str().unwrap().contains(CANARY))
    );
    assert!(
        !on_disk(&env.db(), CANARY.as_bytes()),
        "the canary is on disk in the clear"
    );
    assert!(!on_disk(&env.db(), b"quokka"));
    // Without the key, or with another, the text does not read; the error says what to do.
    let with_key = |key: Option<&std::path::Path>, args: &[&str]| {
        let mut c = env.command(args);
        match key {
            Some(k) => c.env("ABRIDGE_MASTER_KEY_FILE", k),
            None => c.env_remove("ABRIDGE_MASTER_KEY_FILE"),
        };
        crate::harness::Run::from(c.output().unwrap())
    };
    with_key(None, &["memory", "show", "c0"])
        .assert_fails(4, &["encrypted", "ABRIDGE_MASTER_KEY_FILE"]);
    let other = env.write("other.key", env.run(&["keys", "new"]).stdout.as_bytes());
    with_key(Some(&other), &["memory", "show", "c0"])
        .assert_fails(4, &["not the key this database was written with"]);
    // Rotation: the new key reads everything, the old one no longer does.
    env.run(&["keys", "rotate", "--new-key-file", other.to_str().unwrap()])
        .assert_ok();
    let shown = with_key(Some(&other), &["memory", "show", "c1"]);
    assert!(shown.assert_ok().stdout.contains(CANARY));
    env.run(&["memory", "show", "c1"])
        .assert_fails(4, &["not the key"]);
    // A new write after rotation is sealed too (under the new data key version).
    with_key(
        Some(&other),
        &add_fact(&format!("Alice keeps the {CANARY} theme, note 3"), "c3"),
    )
    .assert_ok();
    assert!(!on_disk(&env.db(), CANARY.as_bytes()));
}

fn cluster_of(key: &str, n: usize) -> Vec<MemoryIn> {
    (0..n)
        .map(|i| MemoryIn {
            id: format!("{key}-{i}"),
            scope: scope("alice", "web", "prod", "preference", key),
            text: EDITOR[i].into(),
            importance: Some(0.5),
            replaces: None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monthly_ceiling_turns_summaries_off_and_recall_still_answers() {
    let limits = Limits {
        ceiling: Some(abridge_app::Ceiling {
            tokens: Some(250),
            cost: None,
            price_input: 0.0,
            price_output: 0.0,
        }),
        ..Limits::default()
    };
    let (app, llm, clock) = open_limited(
        Arc::new(SqliteStore::in_memory().unwrap()),
        Duration::ZERO,
        limits,
    );
    let me = app.local();
    // Each call spends 100 prompt + 40 output tokens: two summaries reach 280 of 250.
    for key in ["a", "b"] {
        let r = me
            .remember(cluster_of(key, 3), Summaries::Leave)
            .await
            .unwrap()
            .memories;
        me.summarize_cluster(r[2].cluster).await.unwrap().unwrap();
    }
    let u = me.usage().await.unwrap();
    assert_eq!(
        (u.calls, u.prompt_tokens, u.output_tokens, u.exhausted),
        (2, 200, 80, true)
    );
    assert_eq!(u.month, "2026-01");
    let r = me
        .remember(cluster_of("c", 3), Summaries::Leave)
        .await
        .unwrap()
        .memories;
    assert!(r[2].due, "the write itself is stored and reported");
    let e = me.summarize_cluster(r[2].cluster).await.unwrap_err();
    match e.kind {
        abridge_app::ErrorKind::QuotaExhausted {
            spent,
            limit,
            resets_at_ms,
        } => {
            assert_eq!((spent, limit), (280, 250));
            assert_eq!(resets_at_ms, 1_769_904_000_000, "2026-02-01T00:00Z");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(calls(&llm), 2, "no call over the ceiling");
    // Recall still answers, from the raw memories.
    let hits = me
        .recall("dark editor theme", &MemoryFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(hits.len(), 9);
    assert!(hits.iter().all(|h| h.kind == "memory"));
    let s = app.sweep(None, 20).await.unwrap();
    assert_eq!((s.refused, s.written), (1, 0), "{s:?}");
    // A new month: the budget is back.
    clock.set(1_769_904_000_000);
    assert!(!me.usage().await.unwrap().exhausted);
    let s = app.sweep(None, 20).await.unwrap();
    assert_eq!(s.written, 1, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_runs_at_most_its_share_of_cluster_summaries_and_the_sweeper_cools_down() {
    let limits = Limits {
        cluster_jobs_per_tenant: 1,
        sweep_cooldown_ms: 120_000,
        ..Limits::default()
    };
    let (app, llm, clock) = open_limited(
        Arc::new(SqliteStore::in_memory().unwrap()),
        Duration::from_millis(100),
        limits,
    );
    let me = app.local();
    let mut clusters = Vec::new();
    for key in ["a", "b", "c"] {
        clusters.push(
            me.remember(cluster_of(key, 3), Summaries::Leave)
                .await
                .unwrap()
                .memories[2]
                .cluster,
        );
    }
    let runs = clusters.iter().map(|&c| me.summarize_cluster(c));
    for r in futures::future::join_all(runs).await {
        assert!(r.unwrap().is_some());
    }
    assert_eq!(calls(&llm), 3);
    assert_eq!(
        llm.most_in_flight.load(Ordering::SeqCst),
        1,
        "one at a time for the tenant"
    );
    // The periodic sweeper leaves a tenant alone for the cooldown after sweeping it.
    me.remember(cluster_of("d", 3), Summaries::Leave)
        .await
        .unwrap();
    let first = app.sweep_periodic(20).await.unwrap();
    assert_eq!(first.written, 1, "{first:?}");
    me.remember(cluster_of("e", 3), Summaries::Leave)
        .await
        .unwrap();
    let cooling = app.sweep_periodic(20).await.unwrap();
    assert_eq!((cooling.clusters, cooling.cooling), (0, 1), "{cooling:?}");
    clock.advance(121_000);
    let later = app.sweep_periodic(20).await.unwrap();
    assert_eq!(later.written, 1, "{later:?}");
}

#[test]
fn memories_embedded_by_a_server_model_and_a_missing_model_stores_nothing() {
    let server = abridge_test_llm::TestServer::start();
    let model = abridge_test_llm::Options::default().models[0].clone();
    let env = crate::harness::Env::new()
        .with("ABRIDGE_BACKEND", "extractive")
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_EMBED_MODEL", &model);
    for (i, t) in EDITOR[..3].iter().enumerate() {
        env.run(&add_fact(t, &format!("m{i}"))).assert_ok();
    }
    let v = env
        .run(&["recall", "dark editor theme", "--json", "-k", "10"])
        .json();
    assert!(v["results"].as_array().unwrap().len() >= 3, "{v}");
    let embeds: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/embed")
        .collect();
    assert!(
        embeds.len() >= 4,
        "three writes and a query: {}",
        embeds.len()
    );
    assert_eq!(embeds[0].body["input"], serde_json::json!([EDITOR[0]]));
    assert_eq!(embeds[0].body["truncate"], false);
    // A model the server does not have: the write fails, says what to do, stores nothing.
    let missing = crate::harness::Env::new()
        .with("ABRIDGE_BACKEND", "extractive")
        .with("EXTRACTION_URL", &server.url())
        .with("ABRIDGE_EMBED_MODEL", "no-such-embedder");
    missing
        .run(&[
            "memory", "add", "x y z", "--user", "u", "--key", "k", "--id", "x",
        ])
        .assert_fails(3, &["no-such-embedder"]);
    missing
        .run(&["memory", "show", "x"])
        .assert_fails(2, &["no memory 'x'"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_tenant_destroys_its_data_keys_and_leaves_others_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let key = abridge_store::crypto::Secret::random().unwrap();
    let store = Arc::new(
        SqliteStore::open(&path)
            .unwrap()
            .with_master_key(key.clone()),
    );
    let (app, _) = open_on(store, Duration::ZERO);
    let (a, b) = (
        app.tenant(&Tenant::new("acme").unwrap()),
        app.tenant(&Tenant::new("globex").unwrap()),
    );
    for t in [&a, &b] {
        let r = t
            .remember(cluster_of("editor", 3), Summaries::Leave)
            .await
            .unwrap()
            .memories;
        t.summarize_cluster(r[2].cluster).await.unwrap();
    }
    let keys = |tenant: &str| -> i64 {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.query_row(
            "SELECT COUNT(*) FROM data_keys WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!((keys("acme"), keys("globex")), (1, 1));
    let d = a.delete_tenant().await.unwrap();
    assert_eq!(d.memories, 3);
    assert_eq!((keys("acme"), keys("globex")), (0, 1));
    assert!(
        a.clusters(&MemoryFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        b.memories(&MemoryFilter::default(), 0, 10).await.unwrap().1,
        3
    );
    assert_eq!(
        b.clusters(&MemoryFilter::default()).await.unwrap()[0]
            .members
            .len(),
        3
    );
}

/// Usage counts every call the model served: a session's summary as well as a cluster's, so
/// the monthly ceiling sees what the model spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_counts_session_summaries_as_well_as_cluster_summaries() {
    let (app, llm) = open_on(Arc::new(SqliteStore::in_memory().unwrap()), Duration::ZERO);
    let me = app.local();
    let episodes: Vec<abridge_engine::types::NewEpisode> = (0..12)
        .map(|i| abridge_engine::types::NewEpisode {
            role: if i % 2 == 0 {
                abridge_engine::types::Role::User
            } else {
                abridge_engine::types::Role::Assistant
            },
            content: format!("fact {i}: the deploy of service {i} moves to friday"),
            source_key: format!("k{i}"),
            tokens: 0,
            ..Default::default()
        })
        .collect();
    me.append("chat", episodes, Vec::new()).await.unwrap();
    let cfg = Config {
        model: "restating".into(),
        ..Config::default()
    };
    let cfg = me.for_session("chat", &cfg).await.unwrap();
    me.run_or_join("chat", u64::MAX, &cfg).await.unwrap();
    let session_calls = llm.calls.load(Ordering::SeqCst) as u64;
    assert!(session_calls >= 1);
    let u = me.usage().await.unwrap();
    assert_eq!(
        (u.calls, u.prompt_tokens, u.output_tokens),
        (session_calls, 100 * session_calls, 40 * session_calls),
        "{u:?}"
    );
    let r = me
        .remember(cluster_of("a", 3), Summaries::Leave)
        .await
        .unwrap()
        .memories;
    me.summarize_cluster(r[2].cluster).await.unwrap().unwrap();
    let u = me.usage().await.unwrap();
    assert_eq!(u.calls, llm.calls.load(Ordering::SeqCst) as u64, "{u:?}");
    assert!(u.calls > session_calls);
}
