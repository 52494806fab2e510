//! The full-text index of every message, on every store: the same matches and statistics from
//! SQLite (in a file, in memory, sealed) and PostgreSQL (plain and sealed) for a fixed corpus,
//! written in the same transaction as the episodes and taken out with them; a tenant sees only
//! its own; sealed tenants' words are in neither the database file nor its WAL. PostgreSQL is
//! started by the harness (reported SKIPPED without it; `ABRIDGE_REQUIRE_PG=1` fails then).

use std::sync::Arc;

mod common;

use abridge_engine::types::{NewEpisode, TermMatches};
use abridge_store::tenant::Tenant;
use abridge_store::{AppStore, PgStore, SqliteStore};

/// A message whose index terms are `terms` (the guest's `text.index-terms` would give them).
fn said(i: usize, terms: &str) -> NewEpisode {
    NewEpisode {
        content: format!("message {i}: {terms}"),
        terms: terms.into(),
        ..common::ep(i, &format!("k{i}"))
    }
}

/// The fixed corpus: two sessions, repeated and rare terms, one message without terms.
fn corpus() -> Vec<(&'static str, Vec<NewEpisode>)> {
    vec![
        (
            "alpha",
            vec![
                said(1, "deploy kubernetes cluster"),
                said(2, "deploy key rotat deploy"),
                said(3, ""),
                said(4, "garden tomato"),
                said(5, "kubernetes upgrad fail"),
            ],
        ),
        (
            "beta",
            vec![
                said(1, "deploy friday"),
                said(2, "tomato soup recip"),
                said(3, "rotat key vault key"),
            ],
        ),
    ]
}

fn q(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// A search's answer as two stores can compare it: totals, counts and the matches in order.
type Shape = (u64, u64, Vec<u64>, Vec<(String, u64, u32, Vec<u32>)>);

/// What a search answered, in a form two stores can be compared by.
fn shape(m: &TermMatches) -> Shape {
    (
        m.docs,
        m.length,
        m.df.clone(),
        m.matches
            .iter()
            .map(|x| (x.session.clone(), x.episode, x.length, x.counts.clone()))
            .collect(),
    )
}

/// The corpus written through a tenant's view, then searched; the answers, in order.
async fn searched(name: &str, db: Arc<dyn AppStore>) -> Vec<Shape> {
    let acme = db.clone().for_tenant(&Tenant::new("acme").unwrap());
    let other = db.clone().for_tenant(&Tenant::new("other").unwrap());
    for (s, eps) in corpus() {
        acme.append_episodes(s, eps.clone()).await.unwrap();
        // The same words in another tenant: never counted, never found.
        other.append_episodes(s, eps).await.unwrap();
    }
    let mut out = Vec::new();
    let everywhere = acme
        .search_episodes(None, None, &q(&["deploy", "key"]), 10)
        .await
        .unwrap();
    // 7 messages with terms (one has none), 21 terms; "deploy" in 3, "key" in 2.
    assert_eq!(
        (everywhere.docs, everywhere.length, everywhere.df.clone()),
        (7, 21, vec![3, 2]),
        "{name}"
    );
    let found: Vec<(&str, u64)> = everywhere
        .matches
        .iter()
        .map(|x| (x.session.as_str(), x.episode))
        .collect();
    // The rarest term's postings first (key: newest first), then deploy's new ones.
    assert_eq!(
        found,
        [("beta", 3), ("alpha", 2), ("beta", 1), ("alpha", 1)],
        "{name}"
    );
    let two = everywhere
        .matches
        .iter()
        .find(|x| x.session == "alpha" && x.episode == 2)
        .unwrap();
    assert_eq!((two.length, two.counts.clone()), (4, vec![2, 1]), "{name}");
    out.push(shape(&everywhere));
    // One session's only, by its token.
    let one = acme
        .search_episodes(
            None,
            Some("alpha"),
            &q(&["kubernetes", "tomato", "nowhere"]),
            10,
        )
        .await
        .unwrap();
    assert_eq!(one.df, vec![2, 2, 0], "{name}: counts are the tenant's");
    assert!(one.matches.iter().all(|x| x.session == "alpha"), "{name}");
    assert_eq!(one.matches.len(), 3, "{name}");
    out.push(shape(&one));
    // The limit holds.
    let few = acme
        .search_episodes(None, None, &q(&["deploy", "key", "tomato"]), 2)
        .await
        .unwrap();
    assert_eq!(few.matches.len(), 2, "{name}");
    out.push(shape(&few));
    // A popped message leaves the index and the totals in the same transaction.
    db.for_tenant(&Tenant::new("acme").unwrap())
        .pop_episode("alpha")
        .await
        .unwrap();
    let after_pop = acme
        .search_episodes(None, None, &q(&["kubernetes"]), 10)
        .await
        .unwrap();
    assert_eq!(
        (after_pop.docs, after_pop.length, after_pop.df.clone()),
        (6, 18, vec![1]),
        "{name}"
    );
    assert_eq!(after_pop.matches.len(), 1, "{name}");
    // The catch-up's insert skips a message indexed already and one no longer stored.
    let added = acme
        .index_episodes(
            "alpha",
            &[
                (1, "deploy again".into()),
                (5, "kubernetes upgrad fail".into()),
            ],
            true,
        )
        .await
        .unwrap();
    assert_eq!(added, 0, "{name}");
    out.push(shape(&after_pop));
    // A reset session leaves it whole; the other tenant's copy stays.
    acme.reset_session("beta").await.unwrap();
    let after_reset = acme
        .search_episodes(None, None, &q(&["tomato", "key"]), 10)
        .await
        .unwrap();
    assert_eq!(
        (after_reset.docs, after_reset.length, after_reset.df.clone()),
        (3, 9, vec![1, 1]),
        "{name}"
    );
    out.push(shape(&after_reset));
    let theirs = other
        .search_episodes(None, None, &q(&["tomato"]), 10)
        .await
        .unwrap();
    assert_eq!((theirs.docs, theirs.df.clone()), (7, vec![2]), "{name}");
    // Nothing waits to be indexed in a store that indexed as it went.
    assert_eq!(db.unindexed().await.unwrap(), (0, 0), "{name}");
    assert_eq!(db.next_unindexed().await.unwrap(), None, "{name}");
    out
}

async fn pg(label: &str) -> Option<PgStore> {
    let url = abridge_test_pg::shared()?.database(label);
    Some(PgStore::connect(&url).await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_indexes_and_finds_the_same_messages() {
    let dir = tempfile::tempdir().unwrap();
    let key = abridge_store::crypto::Secret::random().unwrap();
    let reference = searched(
        "sqlite in memory",
        Arc::new(SqliteStore::in_memory().unwrap()),
    )
    .await;
    let mut others: Vec<(&str, Arc<dyn AppStore>)> = vec![
        (
            "sqlite",
            Arc::new(SqliteStore::open(&dir.path().join("a.db")).unwrap()),
        ),
        (
            "sqlite, sealed",
            Arc::new(
                SqliteStore::open(&dir.path().join("s.db"))
                    .unwrap()
                    .with_master_key(key.clone()),
            ),
        ),
    ];
    if let Some(p) = pg("full_text").await {
        others.push(("postgres", Arc::new(p)));
    }
    if let Some(p) = pg("full_text_sealed").await {
        others.push(("postgres, sealed", Arc::new(p.with_master_key(key.clone()))));
    }
    for (name, s) in others {
        assert_eq!(searched(name, s).await, reference, "{name} answers alike");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_tenants_words_are_in_neither_the_database_nor_its_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sealed.db");
    let key = abridge_store::crypto::Secret::random().unwrap();
    let db: Arc<dyn AppStore> = Arc::new(SqliteStore::open(&path).unwrap().with_master_key(key));
    let acme = db.clone().for_tenant(&Tenant::new("acme").unwrap());
    let canary = "zanzibarcanary";
    acme.append_episodes(
        "s",
        vec![said(1, &format!("{canary} deploy")), said(2, canary)],
    )
    .await
    .unwrap();
    let m = acme
        .search_episodes(None, None, &q(&[canary]), 10)
        .await
        .unwrap();
    assert_eq!(m.matches.len(), 2, "the index finds it by its keyed hash");
    for f in [path.clone(), dir.path().join("sealed.db-wal")] {
        if let Ok(bytes) = std::fs::read(&f) {
            assert!(
                !bytes.windows(canary.len()).any(|w| w == canary.as_bytes()),
                "{} holds the word in clear",
                f.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_session_leaves_no_term_of_it_in_the_index_on_disk() {
    // Without a master key the terms' key is derived from the tenant's name alone, so a
    // word's token is computable: a deleted message's tokens must be gone from the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.db");
    let db: Arc<dyn AppStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let canary = "quetzalcanary";
    let token =
        abridge_store::terms::token(&abridge_store::terms::terms_key("local", None), canary);
    let many: Vec<NewEpisode> = (1..=50)
        .map(|i| said(i, &format!("{canary} filler{i} words{i}")))
        .collect();
    db.append_episodes("gone", many).await.unwrap();
    db.append_episodes("kept", vec![said(1, "other words")])
        .await
        .unwrap();
    let held = |p: &std::path::Path| {
        std::fs::read(p).is_ok_and(|b| b.windows(token.len()).any(|w| w == token.as_bytes()))
    };
    assert!(
        held(&path) || held(&dir.path().join("plain.db-wal")),
        "the token is on disk while the messages are"
    );
    db.reset_session("gone").await.unwrap();
    for f in [path.clone(), dir.path().join("plain.db-wal")] {
        assert!(
            !held(&f),
            "{} still holds a deleted message's term",
            f.display()
        );
    }
    let m = db
        .search_episodes(None, None, &q(&["other"]), 10)
        .await
        .unwrap();
    assert_eq!((m.docs, m.matches.len()), (1, 1));
}
