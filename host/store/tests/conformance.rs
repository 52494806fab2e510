//! The store conformance suite: every store trait (`Store`, `RecallStore`, and the app's
//! tables) behaves the same on SQLite (in a file and in memory) and PostgreSQL. It runs in every
//! `cargo test`; PostgreSQL is started by the harness and reported SKIPPED when it is not
//! installed (`ABRIDGE_REQUIRE_PG=1`, as in CI, makes that a failure).

use std::sync::Arc;

use abridge_engine::types::{
    CachedAnswer, ClusterSummaryWrite, Error, FailureMarker, MemoryFilter, Mode, NewEpisode,
    NewMemory,
};
use abridge_store::jobs::{Claim, Job, JobState};
use abridge_store::sources::{SessionMode, Source, WatchedFile};
use abridge_store::tenant::Tenant;
use abridge_store::{AppStore, EventRow, PgStore, SqliteStore, TenantCap};

mod common;
use common::{compaction, ep, memory, scope, write};

fn conflict(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::Conflict(m)) => m,
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// The rules every store keeps, whatever keeps the rows.
async fn conformance(name: &str, s: Arc<dyn AppStore>) {
    // Episodes: dense ids, a source key once.
    let eps: Vec<NewEpisode> = (1..=4).map(|i| ep(i, &format!("k{i}"))).collect();
    assert_eq!(
        s.append_episodes("s", eps.clone()).await.unwrap(),
        4,
        "{name}"
    );
    assert_eq!(s.append_episodes("s", eps).await.unwrap(), 0, "{name}");
    assert_eq!(
        s.append_episodes("s", vec![ep(5, "k5"), ep(5, "k5")])
            .await
            .unwrap(),
        1,
        "{name}"
    );
    let st = s.stats("s").await.unwrap();
    assert_eq!((st.episodes, st.total_tokens), (5, 50), "{name}");
    let after = s.episodes_after("s", 2, 2).await.unwrap();
    assert_eq!(
        after.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![3, 4],
        "{name}"
    );
    assert_eq!(after[0].timestamp_ms, Some(1_003), "{name}");
    // Each episode carries the running token total through it, across appends and past the
    // duplicates that were not stored.
    let all = s.episodes_after("s", 0, 10).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.tokens_through).collect::<Vec<_>>(),
        vec![10, 20, 30, 40, 50],
        "{name}"
    );
    // And the running total of its text's bytes (UTF-8, whatever is sealed at rest), with
    // its time: coverage figures are subtractions of these.
    let mut sum = 0u64;
    for e in &all {
        sum += e.content.len() as u64;
        assert_eq!(
            s.bytes_through("s", e.id).await.unwrap(),
            Some((sum, e.timestamp_ms)),
            "{name}: episode {}",
            e.id
        );
    }
    assert_eq!(s.bytes_through("s", 6).await.unwrap(), None, "{name}");
    assert_eq!(s.bytes_through("nobody", 1).await.unwrap(), None, "{name}");
    let wide = NewEpisode {
        content: "héllo wörld €😀".into(),
        ..ep(1, "wide")
    };
    s.append_episodes(
        "wide",
        vec![
            wide.clone(),
            NewEpisode {
                source_key: "wide2".into(),
                ..wide
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        s.bytes_through("wide", 2).await.unwrap().map(|b| b.0),
        Some(2 * "héllo wörld €😀".len() as u64),
        "{name}"
    );
    s.reset_session("wide").await.unwrap();
    assert_eq!(s.stats("nobody").await.unwrap().episodes, 0, "{name}");

    // The chain rule: new rows start after the last, updates extend the latest.
    let r1 = s
        .write_summary("s", write(None, 1, 2, "one"))
        .await
        .unwrap();
    assert!(
        conflict(s.write_summary("s", write(None, 2, 3, "x")).await).contains("start at episode 3")
    );
    assert!(conflict(s.write_summary("s", write(None, 3, 9, "x")).await).contains("outside"));
    let r2 = s
        .write_summary("s", write(None, 3, 3, "two"))
        .await
        .unwrap();
    // A row that is not the latest keeps its range: a rewrite (a model replacing what the
    // offline summarizer wrote) may change its text only.
    assert!(
        conflict(s.write_summary("s", write(Some(r1.id), 1, 4, "x")).await)
            .contains("must keep its range 1-2")
    );
    let mut better = write(Some(r1.id), 1, 2, "one, rewritten");
    better.model = "qwen2.5:3b".into();
    let r1b = s.write_summary("s", better).await.unwrap();
    assert_eq!(
        (r1b.id, r1b.first_episode, r1b.last_episode, r1b.level),
        (r1.id, 1, 2, 0),
        "{name}"
    );
    assert_eq!(
        (r1b.content.as_str(), r1b.model.as_str(), r1b.created_ms),
        ("one, rewritten", "qwen2.5:3b", r1.created_ms),
        "{name}"
    );
    assert!(
        conflict(s.write_summary("s", write(Some(9_999), 1, 2, "x")).await)
            .contains("not in the session's active chain")
    );
    // The latest row may be rewritten in place too, but never shrunk.
    s.write_summary("s", write(Some(r2.id), 3, 3, "two, rewritten"))
        .await
        .unwrap();
    assert!(
        conflict(s.write_summary("s", write(Some(r2.id), 2, 3, "x")).await)
            .contains("first episode")
    );
    let r2b = s
        .write_summary("s", write(Some(r2.id), 3, 4, "two+"))
        .await
        .unwrap();
    assert_eq!(
        (r2b.id, r2b.last_episode, r2b.content.as_str()),
        (r2.id, 4, "two+"),
        "{name}"
    );
    let r3 = s
        .write_summary("s", write(None, 5, 5, "three"))
        .await
        .unwrap();
    assert_eq!(
        s.latest_summary("s").await.unwrap().unwrap().id,
        r3.id,
        "{name}"
    );
    assert!(matches!(
        s.write_summary("ghost", write(None, 1, 1, "x")).await,
        Err(Error::InvalidInput(_))
    ));
    // Compaction folds the oldest rows only.
    let comp = |rows: Vec<u64>| compaction(rows, 6_000);
    conflict(s.compact_summaries("s", comp(vec![r2.id, r3.id])).await);
    let c = s
        .compact_summaries("s", comp(vec![r1.id, r2.id]))
        .await
        .unwrap();
    assert_eq!(
        (c.first_episode, c.last_episode, c.level),
        (1, 4, 1),
        "{name}"
    );
    let active = active_ids(&*s, "s").await;
    assert_eq!(active, vec![c.id, r3.id], "{name}");
    let history = s.summary_history("s").await.unwrap();
    assert_eq!(history.len(), 4, "{name}");
    assert_eq!(history[1].compacted_into, Some(c.id), "{name}");

    // Failure markers, partials, calibration, sessions.
    let m = FailureMarker {
        failures: 2,
        last_error: "boom".into(),
        retry_after_ms: 9,
        failed_ms: 8,
    };
    s.set_failure("s", Some(m.clone())).await.unwrap();
    assert_eq!(s.failure("s").await.unwrap().unwrap().failures, 2, "{name}");
    s.set_failure("s", None).await.unwrap();
    assert!(s.failure("s").await.unwrap().is_none(), "{name}");
    let a = CachedAnswer {
        text: "p".into(),
        prompt_tokens: 3,
        output_tokens: 4,
    };
    s.put_partial("key", &a).await.unwrap();
    s.put_partial("key", &a).await.unwrap();
    assert_eq!(
        s.partial("key").await.unwrap().unwrap().output_tokens,
        4,
        "{name}"
    );
    s.record_calibration("m", 10, 12).await.unwrap();
    s.record_calibration("m", 10, 12).await.unwrap();
    let cal = s.calibration("m").await.unwrap().unwrap();
    assert_eq!((cal.estimated, cal.reported), (20, 24), "{name}");
    s.append_episodes("t", vec![ep(1, "a")]).await.unwrap();
    assert_eq!(s.sessions().await.unwrap(), vec!["t", "s"], "{name}");

    // Per-session settings and sources.
    s.set_session_mode(
        "s",
        Some(&SessionMode {
            mode: Mode::Window,
            quiescence_secs: Some(30),
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        s.session_mode("s").await.unwrap().unwrap().quiescence_secs,
        Some(30)
    );
    s.set_session_label("s", Some(r#"{"title":"Fix CI"}"#))
        .await
        .unwrap();
    assert_eq!(
        s.session_label("s").await.unwrap().as_deref(),
        Some(r#"{"title":"Fix CI"}"#),
        "{name}"
    );
    s.set_session_focus("s", Some("paths")).await.unwrap();
    assert_eq!(
        s.session_focus("s").await.unwrap().as_deref(),
        Some("paths")
    );
    assert!(s.set_pin("s", 3, true).await.unwrap());
    assert!(!s.set_pin("s", 3, true).await.unwrap());
    assert_eq!(s.pins("s").await.unwrap(), vec![3], "{name}");
    let src = Source {
        path: "/x.jsonl".into(),
        size: 10,
        mtime_ms: 1,
        sha256: "h".into(),
        status: "imported".into(),
        sessions: vec!["s".into()],
        episodes: 5,
        detail: None,
    };
    s.put_source(&src, 1).await.unwrap();
    s.put_source(&src, 2).await.unwrap();
    assert_eq!(
        s.source("/x.jsonl").await.unwrap().unwrap().sessions,
        vec!["s"]
    );
    s.put_watched(
        &WatchedFile {
            path: "/x.jsonl".into(),
            session: Some("s".into()),
            format: None,
            offset: 7,
            lines: Some(2),
        },
        1,
    )
    .await
    .unwrap();
    assert_eq!(s.watched_files().await.unwrap()[0].offset, 7, "{name}");
    s.record_mark("s", "/x.jsonl", 4, 100).await.unwrap();
    assert_eq!(s.mark_covering("s", 5).await.unwrap().unwrap().bytes, 100);
    // A reset forgets all of it, the file included; the other session stays.
    s.reset_session("s").await.unwrap();
    assert_eq!(s.stats("s").await.unwrap().episodes, 0, "{name}");
    assert!(s.summary_history("s").await.unwrap().is_empty(), "{name}");
    assert!(s.source("/x.jsonl").await.unwrap().is_none(), "{name}");
    assert!(s.pins("s").await.unwrap().is_empty(), "{name}");
    assert!(s.session_mode("s").await.unwrap().is_none(), "{name}");
    assert!(s.session_label("s").await.unwrap().is_none(), "{name}");
    assert_eq!(s.sessions().await.unwrap(), vec!["t"], "{name}");

    // Jobs: one active per key, claims, the tenant cap, leases. (Whether a lease is live is
    // the job service's rule; here a running job is live until its lease runs out.)
    let cfg = abridge_engine::types::config_to_json(&abridge_engine::types::Config::default())
        .to_string();
    let live_at = |now: u64| {
        move |j: &Job| j.state == JobState::Running && j.lease_until_ms.is_some_and(|u| u > now)
    };
    let acme = Tenant::new("acme").unwrap();
    let acme_cap = || {
        Some(TenantCap {
            tenant: &acme,
            max: 1,
        })
    };
    let acme_tables = s.for_tenant(&acme);
    let local_tables = s.for_tenant(&Tenant::local());
    let (j1, new) = acme_tables.job_enqueue("a", 3, &cfg, 1_000).await.unwrap();
    assert!(new, "{name}");
    let (again, created) = acme_tables.job_enqueue("a", 3, &cfg, 1_000).await.unwrap();
    assert_eq!(
        (again.id, created),
        (j1.id, false),
        "{name}: one active job per session and target"
    );
    let (j2, _) = acme_tables.job_enqueue("b", 1, &cfg, 1_000).await.unwrap();
    let (j3, _) = local_tables.job_enqueue("c", 1, &cfg, 1_000).await.unwrap();
    let live = live_at(1_000);
    let store = &s;
    let claim = |id, owner: &'static str, cap| {
        let live = &live;
        async move {
            store
                .job_claim(id, owner, 1_000, 61_000, live, cap)
                .await
                .unwrap()
        }
    };
    assert!(
        matches!(claim(j1.id, "h1:1", acme_cap()).await, Claim::Taken(_)),
        "{name}"
    );
    assert!(
        matches!(claim(j1.id, "h2:1", None).await, Claim::Busy(_)),
        "{name}"
    );
    // acme runs one job (its cap) on h1: h2 may not take its second, but may take another
    // tenant's.
    assert!(
        matches!(claim(j2.id, "h2:1", acme_cap()).await, Claim::Busy(_)),
        "{name}"
    );
    let local = Tenant::local();
    let local_cap = Some(TenantCap {
        tenant: &local,
        max: 1,
    });
    assert!(
        matches!(claim(j3.id, "h2:1", local_cap).await, Claim::Taken(_)),
        "{name}"
    );
    assert_eq!(
        acme_tables.jobs_list(None, 10).await.unwrap().len(),
        2,
        "{name}"
    );
    assert_eq!(
        local_tables.jobs_list(None, 10).await.unwrap().len(),
        1,
        "{name}"
    );
    assert!(
        s.jobs_list(None, 10).await.unwrap().len() >= 3,
        "{name}: the whole view lists every tenant's jobs"
    );
    s.job_finish(j1.id, JobState::Succeeded, None, 2_000)
        .await
        .unwrap();
    assert!(
        matches!(claim(j2.id, "h2:1", acme_cap()).await, Claim::Taken(_)),
        "{name}"
    );
    // The heartbeat of the lease holder renews it; anyone else has lost it.
    let p = abridge_engine::Progress::default();
    assert_eq!(
        s.job_heartbeat(j2.id, "h2:1", 90_000, p, 0, 3_000)
            .await
            .unwrap(),
        abridge_store::jobs::Beat::Go,
        "{name}"
    );
    assert_eq!(
        s.job_heartbeat(j2.id, "h1:1", 90_000, p, 0, 3_000)
            .await
            .unwrap(),
        abridge_store::jobs::Beat::Lost,
        "{name}"
    );
    // A lease that runs out passes on: the job is claimed again, as attempt 2.
    let later = live_at(100_000);
    match s
        .job_claim(j2.id, "h1:1", 100_000, 160_000, &later, None)
        .await
        .unwrap()
    {
        Claim::Taken(j) => assert_eq!((j.attempts, j.lease_owner.as_deref()), (2, Some("h1:1"))),
        other => panic!("{name}: {other:?}"),
    }
    assert_eq!(s.jobs_active().await.unwrap().len(), 2, "{name}");
    // A worker's candidates: every running job, and each tenant's oldest queued few —
    // however long one tenant's queue is.
    let mut flood = Vec::new();
    let view = |t: &str| s.for_tenant(&Tenant::new(t).unwrap());
    for i in 0..12 {
        let (j, _) = view("flood")
            .job_enqueue(&format!("s{i}"), 1, "{}", 50_000 + i)
            .await
            .unwrap();
        flood.push(j.id);
    }
    let (calm, _) = view("calm")
        .job_enqueue("s", 1, "{}", 60_000)
        .await
        .unwrap();
    let (own, _) = s.job_enqueue("local-s", 1, "{}", 60_001).await.unwrap();
    let active = s.jobs_active().await.unwrap();
    let running: Vec<u64> = active
        .iter()
        .filter(|j| j.state == JobState::Running)
        .map(|j| j.id)
        .collect();
    for per in [1u32, 2] {
        let got: Vec<u64> = s
            .jobs_runnable(per)
            .await
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        let mut want: Vec<u64> = running.clone();
        want.extend(&flood[..per as usize]);
        want.extend([calm.id, own.id]);
        let mut got_sorted = got.clone();
        got_sorted.sort_unstable();
        assert_eq!(got, got_sorted, "{name}: oldest first");
        for id in &want {
            assert!(
                got.contains(id),
                "{name} per {per}: {id} missing from {got:?}"
            );
        }
        assert_eq!(
            got.iter().filter(|id| flood.contains(id)).count(),
            per as usize,
            "{name}: the flooding tenant's oldest {per} only"
        );
    }
    for id in flood.iter().chain([&calm.id, &own.id]) {
        s.job_cancel(*id, 70_000).await.unwrap();
    }
    let counts = s.job_counts().await.unwrap();
    assert!(
        counts.contains(&("succeeded".to_string(), 1)),
        "{name}: {counts:?}"
    );

    // Tokens.
    let id = s
        .insert_token("acme", "hash1", "abr_1", false, Some("l"), 1)
        .await
        .unwrap();
    assert!(s.any_live_token().await.unwrap(), "{name}");
    assert_eq!(s.live_token("hash1").await.unwrap().unwrap().tenant, "acme");
    assert!(s.revoke_token(id, 2).await.unwrap() && !s.revoke_token(id, 3).await.unwrap());
    assert!(s.live_token("hash1").await.unwrap().is_none(), "{name}");

    // Events: dense ids per tenant, bounded.
    let ev = |kind: &str| EventRow {
        tenant: "acme".into(),
        id: 0,
        kind: kind.into(),
        at_ms: 1,
        session_key: None,
        job: Some(1),
        data: "{}".into(),
    };
    assert_eq!(
        s.append_events("acme", 0, &[ev("a"), ev("b")], 3)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.append_events("acme", 5, &[ev("c"), ev("d")], 3)
            .await
            .unwrap(),
        6
    );
    let after: Vec<u64> = s
        .events_after("acme", 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(
        after,
        vec![6, 7],
        "{name}: ids within `keep` of the newest are kept"
    );
    assert_eq!(
        s.event_heads().await.unwrap(),
        vec![("acme".to_string(), 7)],
        "{name}"
    );
    assert_eq!(s.recent_events(2).await.unwrap().len(), 2, "{name}");

    // Recall: clusters keep sums, summaries cover exactly their members, tenants are apart.
    let a = s
        .put_memory(
            "acme",
            memory("m1", "the port is 8080", [1.0, 0.0, 0.0], None),
        )
        .await
        .unwrap();
    assert!(a.created && a.members == 1, "{name}");
    let b = s
        .put_memory(
            "acme",
            memory("m2", "the port is 8081", [0.0, 1.0, 0.0], Some(a.cluster)),
        )
        .await
        .unwrap();
    assert_eq!((b.cluster, b.members), (a.cluster, 2), "{name}");
    assert!(
        !s.put_memory(
            "acme",
            memory("m1", "the port is 8080", [1.0, 0.0, 0.0], None)
        )
        .await
        .unwrap()
        .created
    );
    assert!(
        s.put_memory("acme", memory("m1", "other", [1.0, 0.0, 0.0], None))
            .await
            .is_err()
    );
    conflict(
        s.put_memory("acme", memory("m3", "x", [1.0, 0.0, 0.0], Some(99)))
            .await,
    );
    let cents = s.centroids("acme", &scope("k")).await.unwrap();
    assert_eq!(cents[0].vector, vec![0.5, 0.5, 0.0], "{name}");
    assert!(
        s.centroids("globex", &scope("k")).await.unwrap().is_empty(),
        "{name}"
    );
    // A cluster's members after a seq, its count and version, read in one snapshot.
    let set = s.members_after("acme", a.cluster, 0).await.unwrap();
    let ids: Vec<&str> = set.members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!((ids, set.count), (vec!["m1", "m2"], 2), "{name}");
    let (seq1, seq2) = (set.members[0].seq, set.members[1].seq);
    assert!(seq1 < seq2, "{name}: seq follows the write order");
    let later = s.members_after("acme", a.cluster, seq1).await.unwrap();
    assert_eq!(later.members.len(), 1, "{name}");
    assert_eq!(
        (later.members[0].id.as_str(), later.version),
        ("m2", set.version)
    );
    let none = s.members_after("acme", a.cluster, u64::MAX).await.unwrap();
    assert_eq!((none.members.len(), none.count), (0, 2), "{name}");
    let foreign = s.members_after("globex", a.cluster, 0).await.unwrap();
    assert_eq!((foreign.members.len(), foreign.count), (0, 0), "{name}");
    assert_eq!(
        s.member_ids("acme", a.cluster, seq1).await.unwrap(),
        ["m1"],
        "{name}"
    );
    assert!(
        s.member_ids("globex", a.cluster, seq2)
            .await
            .unwrap()
            .is_empty()
    );
    let w = |expect: Option<String>, version: u64| ClusterSummaryWrite {
        cluster: a.cluster,
        expect,
        member_hash: "h1".into(),
        covered_seq: seq2,
        covered: 2,
        version,
        text: "ports 8080 and 8081".into(),
        tokens: 5,
        importance: 0.5,
        model: "m".into(),
        vector_model: "emb".into(),
        vector: vec![0.5, 0.5, 0.0],
        calls: 1,
        prompt_tokens: 10,
        output_tokens: 5,
        now_ms: 20,
    };
    // Members read at an older version: the set changed since, nothing is written.
    assert!(
        !s.write_cluster_summary("acme", w(None, set.version - 1))
            .await
            .unwrap(),
        "{name}"
    );
    assert!(
        !s.write_cluster_summary("globex", w(None, set.version))
            .await
            .unwrap(),
        "{name}: another tenant's cluster"
    );
    assert!(
        s.write_cluster_summary("acme", w(None, set.version))
            .await
            .unwrap()
    );
    assert!(
        !s.write_cluster_summary("acme", w(None, set.version))
            .await
            .unwrap()
    );
    let sum = s.cluster_summary("acme", a.cluster).await.unwrap().unwrap();
    assert_eq!(sum.text, "ports 8080 and 8081", "{name}");
    assert_eq!((sum.covered_seq, sum.covered), (seq2, 2), "{name}");
    let hits = s
        .search("acme", &[1.0, 0.0, 0.0], "emb", &MemoryFilter::default(), 5)
        .await
        .unwrap();
    assert_eq!(hits[0].id, "m1", "{name}");
    assert_eq!(hits[0].text, "the port is 8080", "{name}");
    assert!(
        hits.iter().any(|h| (h.covered, h.covered_seq) == (2, seq2)),
        "{name}"
    );
    assert!(
        s.search(
            "globex",
            &[1.0, 0.0, 0.0],
            "emb",
            &MemoryFilter::default(),
            5
        )
        .await
        .unwrap()
        .is_empty()
    );
    let (list, total) = s
        .list_memories("acme", &MemoryFilter::default(), 1, 5)
        .await
        .unwrap();
    assert_eq!(
        (list.len(), total, list[0].id.as_str()),
        (1, 2, "m2"),
        "{name}"
    );
    let cl = s.clusters("acme", &MemoryFilter::default()).await.unwrap();
    assert_eq!(cl[0].member_ids, vec!["m1", "m2"], "{name}");
    let v = s.cluster_version("acme", a.cluster).await.unwrap().unwrap();
    assert!(
        !s.unsettled(Some("acme"), 10).await.unwrap().is_empty(),
        "{name}"
    );
    s.settle("acme", a.cluster, v).await.unwrap();
    assert!(
        s.unsettled(Some("acme"), 10).await.unwrap().is_empty(),
        "{name}"
    );
    assert!(
        s.claim_cluster("acme", a.cluster, "o1", 1, 100)
            .await
            .unwrap()
    );
    assert!(
        !s.claim_cluster("acme", a.cluster, "o2", 50, 100)
            .await
            .unwrap()
    );
    assert!(
        s.claim_cluster("acme", a.cluster, "o2", 100, 200)
            .await
            .unwrap()
    );
    s.release_cluster("acme", a.cluster, "o2").await.unwrap();
    let gone = s.delete_memory("acme", "m2").await.unwrap().unwrap();
    assert_eq!(gone.text, "the port is 8081", "{name}");
    assert!(
        s.delete_memory("acme", "m2").await.unwrap().is_none(),
        "{name}"
    );
    assert_eq!(
        s.centroids("acme", &scope("k")).await.unwrap()[0].vector,
        vec![1.0, 0.0, 0.0]
    );
    // Re-embedding a cluster under another model: the members named get their new vectors
    // (an id that is not a member changes nothing), the sum becomes theirs, the membership
    // version moves, and search finds them under the new model only.
    let version = s.members_after("acme", a.cluster, 0).await.unwrap().version;
    s.set_vectors(
        "acme",
        a.cluster,
        "emb-2",
        vec![
            ("m1".into(), vec![0.0, 0.0, 1.0]),
            ("nobody".into(), vec![1.0, 1.0, 1.0]),
        ],
    )
    .await
    .unwrap();
    let c = s.centroids("acme", &scope("k")).await.unwrap();
    assert_eq!(
        (c[0].model.as_str(), c[0].vector.clone(), c[0].members),
        ("emb-2", vec![0.0, 0.0, 1.0], 1),
        "{name}"
    );
    assert!(s.members_after("acme", a.cluster, 0).await.unwrap().version > version);
    let memories_found = |hits: Vec<abridge_engine::types::Hit>| -> Vec<String> {
        hits.into_iter()
            .filter(|h| h.kind == abridge_engine::types::HitKind::Memory)
            .map(|h| h.id)
            .collect()
    };
    let all = abridge_engine::types::MemoryFilter::default();
    let found = s.search("acme", &[0.0, 0.0, 1.0], "emb-2", &all, 5).await;
    assert_eq!(memories_found(found.unwrap()), vec!["m1"], "{name}");
    let found = s.search("acme", &[1.0, 0.0, 0.0], "emb", &all, 5).await;
    assert!(memories_found(found.unwrap()).is_empty(), "{name}");
    s.add_usage("acme", "2026-11-03", 1, 10, 5).await.unwrap();
    s.add_usage("acme", "2026-11-03", 1, 10, 5).await.unwrap();
    s.add_usage("acme", "2026-11-21", 3, 7, 1).await.unwrap();
    s.add_usage("acme", "2026-10-31", 9, 9, 9).await.unwrap();
    s.add_usage("other", "2026-11-03", 4, 4, 4).await.unwrap();
    assert_eq!(
        s.usage("acme", "2026-11").await.unwrap(),
        (5, 27, 11),
        "{name}"
    );
    let days: Vec<(String, u64, u64, u64)> = s
        .usage_days("acme", "2026-11")
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.day, d.calls, d.prompt_tokens, d.output_tokens))
        .collect();
    assert_eq!(
        days,
        vec![
            ("2026-11-03".to_string(), 2, 20, 10),
            ("2026-11-21".to_string(), 3, 7, 1)
        ],
        "{name}"
    );
    s.forget_tenant("acme").await.unwrap();
    assert!(
        s.get_memory("acme", "m1").await.unwrap().is_none(),
        "{name}"
    );
    assert_eq!(
        s.usage("acme", "2026-11").await.unwrap(),
        (0, 0, 0),
        "{name}"
    );
    assert!(
        s.usage_days("acme", "2026-11").await.unwrap().is_empty(),
        "{name}"
    );
    assert_eq!(s.usage("other", "2026-11").await.unwrap(), (4, 4, 4));

    // Retention: finished jobs past the age, or past their tenant's count, go with their
    // events; queued jobs and other tenants' newest stay.
    let mut ids = Vec::new();
    for (k, (tenant, session)) in [
        ("ret", "a"),
        ("ret", "b"),
        ("ret", "c"),
        ("oth", "a"),
        ("ret", "d"),
    ]
    .iter()
    .enumerate()
    {
        let (j, _) = s
            .for_tenant(&Tenant::new(tenant).unwrap())
            .job_enqueue(session, 1, "{}", 10_000 + k as u64)
            .await
            .unwrap();
        ids.push(j.id);
    }
    let ret = s.for_tenant(&Tenant::new("ret").unwrap());
    assert_eq!(ret.jobs_queued().await.unwrap(), 4, "{name}");
    s.job_finish(ids[0], JobState::Succeeded, None, 20_000)
        .await
        .unwrap();
    s.job_finish(ids[1], JobState::Failed, Some("x"), 90_000)
        .await
        .unwrap();
    s.job_finish(ids[3], JobState::Cancelled, None, 90_000)
        .await
        .unwrap();
    assert_eq!(ret.jobs_queued().await.unwrap(), 2, "{name}");
    let done = EventRow {
        tenant: "ret".into(),
        id: 0,
        kind: "job.finished".into(),
        at_ms: 1,
        session_key: None,
        job: Some(ids[0]),
        data: "{}".into(),
    };
    let other = EventRow {
        job: Some(ids[1]),
        ..done.clone()
    };
    s.append_events("ret", 0, &[done, other], 100)
        .await
        .unwrap();
    assert!(s.jobs_prune(50_000, 1_000).await.unwrap() >= 1, "{name}");
    let left = |id: u64| {
        let s = s.clone();
        async move { s.job_get(id).await.unwrap().is_some() }
    };
    assert!(!left(ids[0]).await, "{name}: finished before the cut");
    assert!(left(ids[1]).await && left(ids[2]).await && left(ids[3]).await);
    let events: Vec<Option<u64>> = s
        .events_after("ret", 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.job)
        .collect();
    assert_eq!(
        events,
        vec![Some(ids[1])],
        "{name}: the gone job's events went"
    );
    // Past the count: each tenant keeps its newest finished job.
    s.job_finish(ids[4], JobState::Succeeded, None, 95_000)
        .await
        .unwrap();
    s.jobs_prune(0, 1).await.unwrap();
    assert!(
        !left(ids[1]).await,
        "{name}: the older of ret's two finished jobs"
    );
    assert!(left(ids[4]).await && left(ids[3]).await, "{name}");
    assert!(left(ids[2]).await, "{name}: a queued job is never pruned");
    assert_eq!(ret.jobs_queued().await.unwrap(), 1, "{name}");
    assert!(s.events_after("ret", 0, 10).await.unwrap().is_empty());

    let strs = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // A tenant's session list: its own sessions only, most recently changed first, a page
    // from an offset with the total; a search's read brings each one's opened names.
    let lists = [
        s.for_tenant(&Tenant::new("lista").unwrap()),
        s.for_tenant(&Tenant::new("listb").unwrap()),
    ];
    for (t, n) in lists.iter().zip([5u64, 2]) {
        for i in 0..n {
            t.append_episodes(&format!("s{i}"), vec![ep(1, "k1")])
                .await
                .unwrap();
        }
    }
    // s1 changes last: first in the list.
    lists[0]
        .append_episodes("s1", vec![ep(2, "k2")])
        .await
        .unwrap();
    lists[0]
        .set_session_label("s3", Some(r#"{"title":"Überblick"}"#))
        .await
        .unwrap();
    let total = lists[0].sessions_count().await.unwrap();
    let page = lists[0].sessions_page(0, 3).await.unwrap();
    assert_eq!((page, total), (strs(&["s1", "s4", "s3"]), 5), "{name}");
    let page = lists[0].sessions_page(3, 10).await.unwrap();
    assert_eq!((page, total), (strs(&["s2", "s0"]), 5), "{name}");
    let (page, total) = (
        lists[1].sessions_page(0, 10).await.unwrap(),
        lists[1].sessions_count().await.unwrap(),
    );
    assert_eq!((page, total), (strs(&["s1", "s0"]), 2), "{name}");
    let labelled = lists[0].sessions_labelled("").await.unwrap();
    assert_eq!(labelled.len(), 5, "{name}");
    assert_eq!(labelled[0].0, "s1", "{name}");
    assert_eq!(
        labelled
            .iter()
            .find(|(s, _)| s == "s3")
            .unwrap()
            .1
            .as_deref(),
        Some(r#"{"title":"Überblick"}"#),
        "{name}"
    );
    assert!(
        labelled.iter().all(|(s, l)| s == "s3" || l.is_none()),
        "{name}"
    );
    // A search: every session whose id or name holds the query (any case) is a candidate;
    // the stores read their trigram index and return those only.
    let search = |t: usize, q: &'static str| {
        let l = &lists[t];
        async move {
            let v = l.sessions_labelled(q).await.unwrap();
            v.into_iter().map(|(s, _)| s).collect::<Vec<_>>()
        }
    };
    let hit = search(0, "üBERb").await;
    assert_eq!(hit, ["s3"], "{name}");
    assert!(search(0, "nowhere-at-all").await.is_empty(), "{name}");
    lists[0]
        .append_episodes("deploy-notes", vec![ep(1, "k1")])
        .await
        .unwrap();
    lists[1]
        .append_episodes("deploy-plans", vec![ep(1, "k1")])
        .await
        .unwrap();
    let hit = search(0, "LOY-n").await;
    assert_eq!(hit, ["deploy-notes"], "{name}: its own tenant's only");
    assert_eq!(search(1, "deploy").await, ["deploy-plans"], "{name}");
    // Renamed: found by the new name, not by the old.
    lists[0]
        .set_session_label(
            "s3",
            Some(r#"{"title":"Zusammenfassung","project":"a \"quoted\" one"}"#),
        )
        .await
        .unwrap();
    assert!(
        search(0, "zusammen").await.contains(&"s3".to_string()),
        "{name}"
    );
    assert!(
        search(0, "\"quoted\"").await.contains(&"s3".to_string()),
        "{name}"
    );
    assert!(search(0, "überb").await.is_empty(), "{name}");
    // Gone with its session.
    lists[0].reset_session("deploy-notes").await.unwrap();
    assert!(
        !search(0, "loy-n")
            .await
            .contains(&"deploy-notes".to_string()),
        "{name}"
    );
    // The local tenant's sessions (keys without a separator) are a list of their own.
    let local = s.for_tenant(&Tenant::local());
    s.append_episodes("local-list", vec![ep(1, "k1")])
        .await
        .unwrap();
    let page = local.sessions_page(0, 100).await.unwrap();
    assert_eq!(
        page.first().map(String::as_str),
        Some("local-list"),
        "{name}"
    );
    assert!(page.iter().all(|p| !p.contains('\u{1f}')), "{name}");

    // A cluster's members by rank: importance, then oldest, then id; paged.
    let mut cluster = None;
    for (id, importance, created_ms) in [
        ("r1", 0.2, 1),
        ("r2", 0.9, 2),
        ("r4", 0.5, 1),
        ("r3", 0.9, 3),
        ("r0", 0.9, 3),
    ] {
        let m = NewMemory {
            importance,
            created_ms,
            ..memory(id, id, [1.0, 0.0, 0.0], cluster)
        };
        cluster = Some(s.put_memory("initech", m).await.unwrap().cluster);
    }
    let cluster = cluster.unwrap();
    let page = |offset, limit| {
        let s = s.clone();
        async move {
            let v = s
                .top_members("initech", cluster, offset, limit)
                .await
                .unwrap();
            v.into_iter().map(|m| m.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(page(0, 3).await, ["r2", "r0", "r3"], "{name}");
    assert_eq!(page(3, 3).await, ["r4", "r1"], "{name}");
    assert!(
        s.top_members("globex", cluster, 0, 9)
            .await
            .unwrap()
            .is_empty(),
        "{name}: another tenant's cluster"
    );
    s.forget_tenant("initech").await.unwrap();
    pops(name, &s).await;
}

/// Removing a session's newest episode: the rows covering it go, the rows they folded come
/// back, its pin and the session's summary events go, its source key is free again.
/// The ids of a session's active summary rows, oldest first.
async fn active_ids(s: &dyn AppStore, session: &str) -> Vec<u64> {
    let rows = s.summaries(session).await.unwrap();
    rows.iter().map(|r| r.id).collect()
}

async fn pops(name: &str, s: &Arc<dyn AppStore>) {
    assert!(s.pop_episode("p").await.unwrap().is_none(), "{name}: empty");
    let eps: Vec<NewEpisode> = (1..=6).map(|i| ep(i, &format!("p{i}"))).collect();
    s.append_episodes("p", eps).await.unwrap();
    let a = s.write_summary("p", write(None, 1, 2, "a")).await.unwrap();
    let b = s.write_summary("p", write(None, 3, 4, "b")).await.unwrap();
    let c = s
        .compact_summaries("p", compaction(vec![a.id, b.id], 6_000))
        .await
        .unwrap();
    let d = s.write_summary("p", write(None, 5, 6, "d")).await.unwrap();
    s.set_pin("p", 6, true).await.unwrap();
    s.set_pin("p", 2, true).await.unwrap();
    let ev = |kind: &str| EventRow {
        tenant: "acme".into(),
        id: 0,
        kind: kind.into(),
        at_ms: 1,
        session_key: Some("p".into()),
        job: None,
        data: "{}".into(),
    };
    s.append_events(
        "acme",
        0,
        &[ev("summary.written"), ev("job.succeeded")],
        100,
    )
    .await
    .unwrap();
    let popped = s.pop_episode("p").await.unwrap().unwrap();
    assert_eq!(
        (popped.episode.id, popped.episode.content.as_str()),
        (6, "message 6 about /srv/app/6.toml"),
        "{name}"
    );
    assert_eq!(
        (popped.dropped, popped.reopened),
        (vec![d.id], vec![]),
        "{name}"
    );
    let st = s.stats("p").await.unwrap();
    assert_eq!(
        (st.episodes, st.total_tokens, st.last_episode),
        (5, 50, 5),
        "{name}"
    );
    let active = active_ids(&**s, "p").await;
    assert_eq!(active, vec![c.id], "{name}");
    assert_eq!(
        s.pins("p").await.unwrap(),
        vec![2],
        "{name}: the popped pin went"
    );
    let kinds: Vec<String> = s
        .events_after("acme", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.session_key.as_deref() == Some("p"))
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, vec!["job.succeeded"], "{name}: summary text went");
    // Its source key is free: the same message comes back with the same id.
    assert_eq!(
        s.append_episodes("p", vec![ep(6, "p6")]).await.unwrap(),
        1,
        "{name}"
    );
    assert_eq!(
        s.pop_episode("p").await.unwrap().unwrap().episode.id,
        6,
        "{name}"
    );
    assert_eq!(
        s.pop_episode("p").await.unwrap().unwrap().episode.id,
        5,
        "{name}"
    );
    // Episode 4 ends row b, folded into c (1-4): both go, a comes back, the chain holds.
    let popped = s.pop_episode("p").await.unwrap().unwrap();
    assert_eq!(
        (popped.dropped, popped.reopened),
        (vec![b.id, c.id], vec![a.id]),
        "{name}"
    );
    let active = s.summaries("p").await.unwrap();
    assert_eq!(
        active
            .iter()
            .map(|r| (r.id, r.first_episode, r.last_episode, r.compacted_into))
            .collect::<Vec<_>>(),
        vec![(a.id, 1, 2, None)],
        "{name}"
    );
    assert_eq!(s.summary_history("p").await.unwrap().len(), 1, "{name}");
    // The chain rule: the next row starts right after the reopened one.
    assert!(conflict(s.write_summary("p", write(None, 4, 3, "x")).await).contains("outside"));
    s.write_summary("p", write(None, 3, 3, "c again"))
        .await
        .unwrap();
    s.reset_session("p").await.unwrap();
    items(name, s).await;
    succession(name, s).await;
}

/// Facts that change: a memory with a fact key supersedes the scope's current memory of it
/// (or the one named), in the same write; the earlier row is kept and marked; a delete of the
/// successor makes it current again; the key is kept as a keyed hash, never in the clear.
async fn succession(name: &str, s: &Arc<dyn AppStore>) {
    let t = "initrode";
    let fact = |id: &str, text: &str, key: &str, at: u64| NewMemory {
        created_ms: at,
        fact_key: key.into(),
        ..memory(id, text, [0.0, 1.0, 0.0], None)
    };
    let a = s
        .put_memory(t, fact("porto", "I live in Porto", "fact:lives in", 100))
        .await
        .unwrap();
    assert_eq!(a.superseded, None, "{name}");
    // Another fact, and the same fact in another scope, are left alone.
    s.put_memory(t, fact("job", "I work at Acme", "fact:works at", 110))
        .await
        .unwrap();
    let mut elsewhere = fact("bob", "Bob lives in Rome", "fact:lives in", 120);
    elsewhere.scope = scope("other");
    s.put_memory(t, elsewhere).await.unwrap();
    let current = s
        .current_memory(t, &scope("k"), "fact:lives in")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.id, "porto", "{name}");
    let b = s
        .put_memory(
            t,
            NewMemory {
                cluster: Some(a.cluster),
                ..fact("lyon", "I moved to Lyon", "fact:lives in", 200)
            },
        )
        .await
        .unwrap();
    assert_eq!(b.superseded.as_deref(), Some("porto"), "{name}");
    let porto = s.get_memory(t, "porto").await.unwrap().unwrap();
    assert_eq!(
        (porto.superseded_by.as_deref(), porto.superseded_ms),
        (Some("lyon"), 200),
        "{name}"
    );
    assert_eq!(porto.text, "I live in Porto", "{name}: kept as it was");
    let lyon = s.get_memory(t, "lyon").await.unwrap().unwrap();
    assert_eq!(lyon.supersedes.as_deref(), Some("porto"), "{name}");
    assert_eq!(lyon.superseded_by, None, "{name}");
    let current = s
        .current_memory(t, &scope("k"), "fact:lives in")
        .await
        .unwrap();
    assert_eq!(current.map(|m| m.id).as_deref(), Some("lyon"), "{name}");
    assert!(
        s.current_memory(t, &scope("other"), "fact:lives in")
            .await
            .unwrap()
            .is_some_and(|m| m.id == "bob"),
        "{name}: another scope's fact is its own"
    );
    let job = s.get_memory(t, "job").await.unwrap().unwrap();
    assert_eq!(job.superseded_by, None, "{name}");
    // A search marks the superseded hit.
    let f = MemoryFilter {
        exact: true,
        ..MemoryFilter::default()
    };
    let hits = s.search(t, &[0.0, 1.0, 0.0], "emb", &f, 10).await.unwrap();
    let hit = |id: &str| hits.iter().find(|h| h.id == id).unwrap();
    assert_eq!(
        hit("porto").superseded_by.as_deref(),
        Some("lyon"),
        "{name}"
    );
    assert_eq!(hit("porto").superseded_ms, 200, "{name}");
    assert_eq!(hit("lyon").superseded_by, None, "{name}");
    // Named: the one named is superseded, whatever its fact key.
    let c = s
        .put_memory(
            t,
            NewMemory {
                replaces: Some("job".into()),
                ..fact("job2", "Acme let me go", "", 300)
            },
        )
        .await
        .unwrap();
    assert_eq!(c.superseded.as_deref(), Some("job"), "{name}");
    // Writing the same id again supersedes nothing more.
    let again = s
        .put_memory(t, fact("lyon", "I moved to Lyon", "fact:lives in", 200))
        .await
        .unwrap();
    assert!(!again.created && again.superseded.is_none(), "{name}");
    // The successor deleted: the earlier one is current again, and nothing names the gone one.
    s.delete_memory(t, "lyon").await.unwrap().unwrap();
    let porto = s.get_memory(t, "porto").await.unwrap().unwrap();
    assert_eq!(
        (porto.superseded_by, porto.superseded_ms),
        (None, 0),
        "{name}"
    );
    let current = s
        .current_memory(t, &scope("k"), "fact:lives in")
        .await
        .unwrap();
    assert_eq!(current.map(|m| m.id).as_deref(), Some("porto"), "{name}");
    s.delete_memory(t, "job").await.unwrap().unwrap();
    let job2 = s.get_memory(t, "job2").await.unwrap().unwrap();
    assert_eq!(job2.supersedes, None, "{name}");
    for id in ["porto", "bob", "job2"] {
        s.delete_memory(t, id).await.unwrap();
    }
}

/// The item a client stores with a message comes back as given (by id, for those stored with
/// one), goes with the message it belongs to, and with its session.
async fn items(name: &str, s: &Arc<dyn AppStore>) {
    let item = r#"{"type":"function_call_output","call_id":"call_1","output":"sunny ☀"}"#;
    let mut eps: Vec<NewEpisode> = (1..=3).map(|i| ep(i, &format!("it{i}"))).collect();
    eps[0].item = Some(item.into());
    eps[2].item = Some(r#"{"role":"user","content":[{"type":"input_text","text":"hi"}]}"#.into());
    s.append_episodes("it", eps).await.unwrap();
    let got = s.items("it", &[1, 2, 3, 9]).await.unwrap();
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        vec![1, 3],
        "{name}"
    );
    assert_eq!(got[&1], item, "{name}");
    assert!(
        s.items("other", &[1]).await.unwrap().is_empty(),
        "{name}: another session's"
    );
    let popped = s.pop_episode("it").await.unwrap().unwrap();
    assert_eq!(popped.episode.id, 3, "{name}");
    assert!(popped.item.unwrap().contains("input_text"), "{name}");
    assert!(
        !s.items("it", &[3]).await.unwrap().contains_key(&3),
        "{name}: gone with its message"
    );
    s.reset_session("it").await.unwrap();
    assert!(
        s.items("it", &[1]).await.unwrap().is_empty(),
        "{name}: gone with the session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conformance_suite_passes_on_sqlite_memory_and_postgres() {
    let dir = tempfile::tempdir().unwrap();
    conformance(
        "sqlite in memory",
        Arc::new(SqliteStore::in_memory().unwrap()),
    )
    .await;
    conformance(
        "sqlite",
        Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap()),
    )
    .await;
    // With a master key every text column is sealed: the rules are the same.
    let key = abridge_store::crypto::Secret::random().unwrap();
    conformance(
        "sqlite, sealed",
        Arc::new(
            SqliteStore::open(&dir.path().join("sealed.db"))
                .unwrap()
                .with_master_key(key.clone()),
        ),
    )
    .await;
    if let Some((pg, _)) = pg("conformance").await {
        conformance("postgres", Arc::new(pg)).await;
    }
    // Vectors sealed too: search opens what it ranks; the rules are the same.
    conformance(
        "sqlite, sealed vectors",
        Arc::new(
            SqliteStore::open(&dir.path().join("sealed-vectors.db"))
                .unwrap()
                .with_master_key(key.clone())
                .with_sealed_vectors(),
        ),
    )
    .await;
    if let Some((pg, _)) = pg("conformance_sealed").await {
        conformance(
            "postgres, sealed",
            Arc::new(pg.with_master_key(key.clone())),
        )
        .await;
    }
    if let Some((pg, _)) = pg("conformance_sealed_vectors").await {
        conformance(
            "postgres, sealed vectors",
            Arc::new(pg.with_master_key(key).with_sealed_vectors()),
        )
        .await;
    }
}

/// A PostgreSQL store on a new database (`None`, after SKIPPED, without PostgreSQL).
async fn pg(label: &str) -> Option<(PgStore, String)> {
    let url = abridge_test_pg::shared()?.database(label);
    Some((PgStore::connect(&url).await.expect("connect"), url))
}

/// A vector of `dim` from a clustered distribution (40 centres), deterministic in `i`.
fn clustered(i: u64, dim: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let mut c = 0x1234_5678u64 ^ (i % 40);
    let mut centre = || {
        c ^= c << 13;
        c ^= c >> 7;
        c ^= c << 17;
        ((c >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    (0..dim).map(|_| centre() + 0.5 * next()).collect()
}

/// Enough memories of tenant `big` for its recall to go through an index (the count).
async fn big_memories(s: &dyn abridge_store::RecallStore) -> u64 {
    let n = (abridge_store::ann::ANN_MIN + 1_000) as u64;
    for i in 0..n {
        s.put_memory("big", big_memory(i)).await.unwrap();
    }
    n
}

/// The memories among `hits`, by id.
fn ids(hits: Vec<abridge_engine::types::Hit>) -> Vec<String> {
    hits.into_iter()
        .filter(|h| h.kind == abridge_engine::types::HitKind::Memory)
        .map(|h| h.id)
        .collect()
}

fn big_memory(i: u64) -> abridge_engine::types::NewMemory {
    let mut m = memory(&format!("b{i}"), &format!("fact {i}"), [0.0; 3], None);
    m.vector = clustered(i, 32);
    m.scope.user = format!("u{}", i % 40);
    m.scope.kind = if i.is_multiple_of(10) { "pref" } else { "fact" }.into();
    m
}

/// Recall through an index (SQLite's HNSW, PostgreSQL's pgvector)
/// agrees with the exact scan (`exact: true`): recall@10 ≥ 0.95 with and without filters, a
/// filter never cuts the results, and forgotten memories are never returned while new ones
/// are (`other` is a second handle on the same data: another process's writes).
async fn indexed_recall(name: &str, s: Arc<dyn AppStore>, other: Option<Arc<dyn AppStore>>) {
    let n = big_memories(&*s).await;
    let filters = [
        MemoryFilter::default(),
        // 90 % of the tenant: the graph walks under the predicate.
        MemoryFilter {
            kind: Some("fact".into()),
            ..MemoryFilter::default()
        },
        // 75 memories: the exact scan of what matches.
        MemoryFilter {
            user: Some("u7".into()),
            ..MemoryFilter::default()
        },
    ];
    for f in &filters {
        let exact_f = MemoryFilter {
            exact: true,
            ..f.clone()
        };
        let (mut agree, mut total) = (0, 0);
        for q in 0..30 {
            let qv = clustered(1_000_000 + q, 32);
            let a = ids(s.search("big", &qv, "emb", f, 10).await.unwrap());
            let b = ids(s.search("big", &qv, "emb", &exact_f, 10).await.unwrap());
            assert_eq!(
                a.len(),
                b.len(),
                "{name}: a filter never cuts results ({f:?})"
            );
            total += b.len();
            agree += b.iter().filter(|id| a.contains(id)).count();
        }
        assert!(
            agree * 100 >= total * 95,
            "{name}: recall@10 {agree}/{total} under {f:?}"
        );
    }
    // Forgotten memories are gone from the next answer; a new one is in it.
    let qv = clustered(2_000_000, 32);
    let first = ids(s
        .search("big", &qv, "emb", &MemoryFilter::default(), 5)
        .await
        .unwrap());
    for id in &first[..2] {
        s.delete_memory("big", id).await.unwrap().unwrap();
    }
    let writer = other.clone().unwrap_or_else(|| s.clone());
    writer
        .delete_memory("big", &first[2])
        .await
        .unwrap()
        .unwrap();
    let mut twin = big_memory(n);
    twin.vector = qv.clone();
    writer.put_memory("big", twin).await.unwrap();
    let after = ids(s
        .search("big", &qv, "emb", &MemoryFilter::default(), 5)
        .await
        .unwrap());
    assert_eq!(after[0], format!("b{n}"), "{name}: the new memory is found");
    for id in &first[..3] {
        assert!(!after.contains(id), "{name}: {id} was forgotten: {after:?}");
    }
    s.forget_tenant("big").await.unwrap();
    assert!(
        s.search("big", &qv, "emb", &MemoryFilter::default(), 5)
            .await
            .unwrap()
            .is_empty(),
        "{name}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_through_an_index_agrees_with_the_exact_scan_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    indexed_recall(
        "sqlite in memory",
        Arc::new(SqliteStore::in_memory().unwrap()),
        None,
    )
    .await;
    let path = dir.path().join("ann.db");
    // Builds within the search here (a build on its own thread: the next test).
    let inline = |p: &std::path::Path| SqliteStore::open(p).unwrap().with_ann_inline(usize::MAX);
    indexed_recall(
        "sqlite",
        Arc::new(inline(&path)),
        Some(Arc::new(inline(&path))),
    )
    .await;
    let key = abridge_store::crypto::Secret::random().unwrap();
    let sealed = dir.path().join("ann-sealed.db");
    let open = || {
        inline(&sealed)
            .with_master_key(key.clone())
            .with_sealed_vectors()
    };
    indexed_recall(
        "sqlite, sealed vectors",
        Arc::new(open()),
        Some(Arc::new(open())),
    )
    .await;
    if let Some((pg, _)) = pg("ann").await {
        indexed_recall("postgres", Arc::new(pg), None).await;
    }
}

/// A tenant whose index is larger than a search builds itself: the build runs on a thread of
/// its own, with its own read connection, while recall answers by the exact scan; then the
/// index answers (sealed vectors opened by the build as well), and what is written after it
/// is folded in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_index_is_built_on_its_own_thread_while_recall_scans_exactly() {
    use abridge_store::RecallStore;
    let dir = tempfile::tempdir().unwrap();
    let key = abridge_store::crypto::Secret::random().unwrap();
    for sealed in [false, true] {
        let path = dir.path().join(format!("background-{sealed}.db"));
        let mut s = SqliteStore::open(&path).unwrap().with_ann_inline(100);
        if sealed {
            s = s.with_master_key(key.clone()).with_sealed_vectors();
        }
        let s = Arc::new(s);
        let n = big_memories(&*s).await;
        let exact = MemoryFilter {
            exact: true,
            ..MemoryFilter::default()
        };
        let q = clustered(2_000_000, 32);
        let want = ids(s.search("big", &q, "emb", &exact, 10).await.unwrap());
        // The first search starts the build and answers by the exact scan.
        assert!(!s.ann_ready("big", "emb"), "sealed {sealed}");
        let first = ids(s
            .search("big", &q, "emb", &MemoryFilter::default(), 10)
            .await
            .unwrap());
        assert_eq!(first, want, "sealed {sealed}: the exact answer meanwhile");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !s.ann_ready("big", "emb") {
            assert!(
                std::time::Instant::now() < deadline,
                "sealed {sealed}: the build never finished"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let (mut agree, mut total) = (0, 0);
        for i in 0..30 {
            let q = clustered(3_000_000 + i, 32);
            let a = ids(s
                .search("big", &q, "emb", &MemoryFilter::default(), 10)
                .await
                .unwrap());
            let b = ids(s.search("big", &q, "emb", &exact, 10).await.unwrap());
            total += b.len();
            agree += b.iter().filter(|id| a.contains(id)).count();
        }
        assert!(
            agree as f64 >= 0.95 * total as f64,
            "sealed {sealed}: recall@10 {agree}/{total}"
        );
        // Written after the build: folded in by the next search (one row, within it).
        let mut late = big_memory(n + 7);
        late.id = "late".into();
        late.vector = clustered(4_000_000, 32);
        s.put_memory("big", late.clone()).await.unwrap();
        let hits = ids(s
            .search("big", &late.vector, "emb", &MemoryFilter::default(), 3)
            .await
            .unwrap());
        assert_eq!(
            hits.first().map(String::as_str),
            Some("late"),
            "sealed {sealed}"
        );
        assert!(s.ann_ready("big", "emb"), "sealed {sealed}");
    }
}

/// What `saved` finds once the graph's save (on a thread of its own) is done, within a minute.
async fn saved_soon<T>(saved: &impl Fn() -> Option<T>, why: &str) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(x) = saved() {
            return x;
        }
        assert!(std::time::Instant::now() < deadline, "{why}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// SQLite's recall graph outlives the process: once built it is saved (sealed under a master
/// key, as the vectors are), and a store opened later on the file loads it at its first
/// search (or when warmed, as a service starts) instead of building it again; a deletion takes the saved graph away (it holds the
/// deleted vector) until it is saved anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recall_graph_is_saved_and_a_new_store_loads_it_instead_of_building() {
    use abridge_engine::types::MemoryFilter;
    use abridge_store::RecallStore;
    let dir = tempfile::tempdir().unwrap();
    for sealed in [false, true] {
        let path = dir.path().join(format!("graph-{sealed}.db"));
        let key = abridge_store::crypto::Secret::random().unwrap();
        let open = |inline: usize| {
            let s = SqliteStore::open(&path).unwrap().with_ann_inline(inline);
            if sealed {
                s.with_master_key(key.clone()).with_sealed_vectors()
            } else {
                s
            }
        };
        let saved = || -> Option<(i64, i64)> {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.query_row(
                "SELECT seq, sealed FROM ann_graphs WHERE tenant = 'big' AND model = 'emb'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok()
        };
        // More rows than a store builds within a search by default (a restart would build
        // on a thread and scan meanwhile); this one builds within its first search.
        let n = (abridge_store::ann::BUILD_INLINE + 500) as u64;
        let first = open(usize::MAX);
        for i in 0..n {
            first.put_memory("big", big_memory(i)).await.unwrap();
        }
        let q = clustered(3_000_000, 32);
        let all = MemoryFilter::default();
        let before = first.search("big", &q, "emb", &all, 10).await.unwrap();
        assert!(first.ann_ready("big", "emb"));
        let (seq, seal) = saved_soon(&saved, "the graph was never saved").await;
        assert_eq!(seq, n as i64);
        assert_eq!(seal != 0, sealed, "sealed exactly when vectors are");
        drop(first);
        // A new store (the default build-within-a-search limit, below the tenant's size):
        // ready at once after its first search, with the same answer.
        let second = open(abridge_store::ann::BUILD_INLINE);
        let after = second.search("big", &q, "emb", &all, 10).await.unwrap();
        assert!(second.ann_ready("big", "emb"), "loaded, not building");
        let ids =
            |h: &[abridge_engine::types::Hit]| h.iter().map(|x| x.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&after), ids(&before));
        // A store warmed as a service starts has the graph before any search asks for it.
        let third = open(abridge_store::ann::BUILD_INLINE);
        assert!(!third.ann_ready("big", "emb"));
        assert_eq!(third.warm().await.unwrap(), 1);
        assert!(third.ann_ready("big", "emb"), "warmed");
        assert_eq!(
            third.warm().await.unwrap(),
            0,
            "a loaded graph is not loaded again"
        );
        let warmed = third.search("big", &q, "emb", &all, 10).await.unwrap();
        assert_eq!(ids(&warmed), ids(&before));
        drop(third);
        // A deletion: the saved graph is gone with it, and saved again without the row.
        second
            .delete_memory("big", &after[0].id)
            .await
            .unwrap()
            .unwrap();
        assert!(saved().is_none(), "a saved graph holding a deleted vector");
        let again = second.search("big", &q, "emb", &all, 10).await.unwrap();
        assert!(!ids(&again).contains(&after[0].id));
        saved_soon(&saved, "the graph was never saved again").await;
        // Forgetting the tenant leaves no graph.
        second.forget_tenant("big").await.unwrap();
        assert!(saved().is_none());
    }
}
