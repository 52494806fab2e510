//! Tenant isolation as a property: a seeded random run of writes, resets and deletes by two
//! tenants, with every read of each checked against what that tenant alone wrote after every
//! step — sessions, messages, the full-text index, memories and recall — on SQLite (in
//! memory, in a file, sealed) and PostgreSQL (plain and sealed). One tenant's reset or delete
//! never touches the other's rows, and no read, search, recall or count of one ever sees them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use abridge_engine::types::{MemoryFilter, NewEpisode, Role};
use abridge_store::tenant::Tenant;
use abridge_store::{AppStore, PgStore, SqliteStore};

mod common;

/// A small deterministic generator (xorshift), so a failing run is the same run again.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one tenant wrote: each session's messages, and its memories.
#[derive(Default)]
struct Model {
    sessions: BTreeMap<String, Vec<String>>,
    memories: BTreeSet<String>,
}

const TENANTS: [&str; 2] = ["acme", "globex"];

fn said(content: &str, key: &str) -> NewEpisode {
    NewEpisode {
        role: Role::User,
        content: content.into(),
        source_key: key.into(),
        tokens: 3,
        // The index terms the guest would give: the words.
        terms: content.into(),
        ..Default::default()
    }
}

/// Every read of tenant `t` agrees with what `t` wrote, and shows nothing of the other's.
async fn check(name: &str, step: usize, db: &Arc<dyn AppStore>, t: usize, models: &[Model; 2]) {
    let at = format!("{name}, step {step}, tenant {}", TENANTS[t]);
    let own = &models[t];
    let other = &models[1 - t];
    let store = db.clone().for_tenant(&Tenant::new(TENANTS[t]).unwrap());
    let rows = store.clone();
    let listed: BTreeSet<String> = rows.sessions().await.unwrap().into_iter().collect();
    let written: BTreeSet<String> = own
        .sessions
        .iter()
        .filter(|(_, m)| !m.is_empty())
        .map(|(s, _)| s.clone())
        .collect();
    assert_eq!(listed, written, "{at}: sessions");
    let mut total = 0u64;
    for (session, messages) in &own.sessions {
        let got: Vec<String> = store
            .episodes_after(session, 0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.content)
            .collect();
        assert_eq!(&got, messages, "{at}: messages of {session}");
        total += messages.len() as u64;
    }
    for session in other.sessions.keys() {
        if !own.sessions.contains_key(session) {
            assert_eq!(
                store.stats(session).await.unwrap().episodes,
                0,
                "{at}: the other tenant's session {session}"
            );
        }
    }
    // The index holds this tenant's messages only: the other's word is in none of them.
    let m = store
        .search_episodes(None, None, &[format!("w{}", 1 - t)], 1000)
        .await
        .unwrap();
    assert_eq!(
        (m.docs, m.matches.len()),
        (total, 0),
        "{at}: full-text index"
    );
    let mine = store
        .search_episodes(None, None, &[format!("w{t}")], 1000)
        .await
        .unwrap();
    assert_eq!(mine.matches.len() as u64, total, "{at}: own matches");
    let (memories, count) = db
        .list_memories(TENANTS[t], &MemoryFilter::default(), 0, 10_000)
        .await
        .unwrap();
    let ids: BTreeSet<String> = memories.into_iter().map(|m| m.id).collect();
    assert_eq!(&ids, &own.memories, "{at}: memories");
    assert_eq!(count, own.memories.len(), "{at}: memory count");
    for v in [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.3, 0.3, 0.9]] {
        let hits = db
            .search(TENANTS[t], &v, "emb", &MemoryFilter::default(), 50)
            .await
            .unwrap();
        for h in hits {
            assert!(own.memories.contains(&h.id), "{at}: recall found {}", h.id);
        }
    }
}

async fn run(name: &str, db: Arc<dyn AppStore>, seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let mut models: [Model; 2] = Default::default();
    let mut n = 0u64;
    for step in 0..steps {
        let t = rng.below(2) as usize;
        let tenant = Tenant::new(TENANTS[t]).unwrap();
        let store = db.clone().for_tenant(&tenant);
        let session = format!("s{}", rng.below(3));
        match rng.below(10) {
            0..=3 => {
                let k = 1 + rng.below(3);
                let mut eps = Vec::new();
                for _ in 0..k {
                    n += 1;
                    eps.push(said(&format!("w{t} message {n}"), &format!("k{n}")));
                }
                let added = store.append_episodes(&session, eps.clone()).await.unwrap();
                assert_eq!(added as u64, k, "{name}, step {step}");
                let m = models[t].sessions.entry(session).or_default();
                m.extend(eps.into_iter().map(|e| e.content));
            }
            4 => {
                store.reset_session(&session).await.unwrap();
                models[t].sessions.remove(&session);
            }
            5..=7 => {
                n += 1;
                let id = format!("m{n}");
                let v = [rng.below(5) as f32, rng.below(5) as f32, 1.0];
                let mem = common::memory(&id, &format!("w{t} fact {n}"), v, None);
                db.put_memory(TENANTS[t], mem).await.unwrap();
                models[t].memories.insert(id);
            }
            8 => {
                // A delete by id: of one's own memory, or of the other tenant's (a no-op).
                let from = rng.below(2) as usize;
                let pick = models[from]
                    .memories
                    .iter()
                    .nth(rng.below(models[from].memories.len().max(1) as u64) as usize)
                    .cloned();
                if let Some(id) = pick {
                    let gone = db.delete_memory(TENANTS[t], &id).await.unwrap();
                    assert_eq!(
                        gone.is_some(),
                        from == t,
                        "{name}, step {step}: delete {id}"
                    );
                    if from == t {
                        models[t].memories.remove(&id);
                    }
                }
            }
            _ => {
                // Rarely, the tenant's whole memory goes.
                if rng.below(4) == 0 {
                    db.forget_tenant(TENANTS[t]).await.unwrap();
                    models[t].memories.clear();
                }
            }
        }
        for who in 0..2 {
            check(name, step, &db, who, &models).await;
        }
    }
}

const STEPS: usize = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_never_see_or_touch_each_others_rows_on_any_store() {
    let key = abridge_store::crypto::Secret::random().unwrap();
    let dir = tempfile::tempdir().unwrap();
    run(
        "sqlite in memory",
        Arc::new(SqliteStore::in_memory().unwrap()),
        0x9e37_79b9,
        STEPS,
    )
    .await;
    run(
        "sqlite file",
        Arc::new(SqliteStore::open(&dir.path().join("a.db")).unwrap()),
        0x2545_f491,
        STEPS,
    )
    .await;
    run(
        "sqlite file, sealed",
        Arc::new(
            SqliteStore::open(&dir.path().join("b.db"))
                .unwrap()
                .with_master_key(key.clone()),
        ),
        0x4f6c_dd1d,
        STEPS,
    )
    .await;
    let Some(pg) = abridge_test_pg::shared() else {
        return;
    };
    let plain = PgStore::connect(&pg.database("tenancy")).await.unwrap();
    run("postgres", Arc::new(plain), 0x1234_5678, STEPS).await;
    let sealed = PgStore::connect(&pg.database("tenancy_sealed"))
        .await
        .unwrap()
        .with_master_key(key);
    run("postgres, sealed", Arc::new(sealed), 0x8765_4321, STEPS).await;
}
