//! Sealed means sealed: with a master key, every column that holds a tenant's text (episode
//! content, speakers and items, summary prose and ledgers, cached partial answers, event data,
//! focus text, memories and cluster summaries) is stored encrypted, in SQLite and in
//! PostgreSQL. A canary written through the stores is found in none of the database's bytes
//! (SQLite: the file and its WAL; PostgreSQL: every row of every table as text), reads back
//! exactly with the key, is refused without it, does not open under another key, and a
//! sealed value moved to another row does not open either. PostgreSQL is reported SKIPPED
//! when absent (required in CI).

use std::sync::Arc;

use abridge_engine::types::{CachedAnswer, IdentifierKind, LedgerEntry, NewEpisode, Role};
use abridge_store::crypto::Secret;
use abridge_store::tenant::Tenant;
use abridge_store::{AppStore, EventRow, PgStore, SqliteStore};

mod common;
use common::{memory, scope, write};

const CANARY: &str = "CANARY-7f3a";

fn episode(i: u64) -> NewEpisode {
    NewEpisode {
        item: Some(format!(
            r#"{{"type":"message","text":"{CANARY} item {i}"}}"#
        )),
        role: Role::User,
        content: format!("{CANARY} episode {i}: my password is hunter{i}"),
        source_key: format!("k{i}"),
        tokens: 10,
        speaker: Some(format!("{CANARY} speaker")),
        ..Default::default()
    }
}

/// Write one of everything that holds text, for the local tenant and for `acme`.
async fn write_all(db: Arc<dyn AppStore>) {
    for tenant in [Tenant::local(), Tenant::new("acme").unwrap()] {
        let store = db.for_tenant(&tenant);
        let tables = store.clone();
        store
            .append_episodes("s", vec![episode(1), episode(2)])
            .await
            .unwrap();
        let mut w = write(None, 1, 2, &format!("{CANARY} summary"));
        w.ledger = vec![LedgerEntry {
            text: format!("/srv/{CANARY}.toml"),
            kind: IdentifierKind::Path,
            episode: 2,
            count: 1,
        }];
        store.write_summary("s", w).await.unwrap();
        store
            .put_partial(
                "p",
                &CachedAnswer {
                    text: format!("{CANARY} partial"),
                    prompt_tokens: 1,
                    output_tokens: 1,
                },
            )
            .await
            .unwrap();
        tables
            .set_session_focus("s", Some(&format!("{CANARY} focus")))
            .await
            .unwrap();
        tables
            .set_session_label("s", Some(&format!("{{\"title\":\"{CANARY} title\"}}")))
            .await
            .unwrap();
        let ev = EventRow::new(
            &tenant,
            "summary.written",
            1,
            Some("s"),
            None,
            format!("{{\"content\":\"{CANARY} event\"}}"),
        );
        db.append_events(tenant.name(), 0, &[ev], 100)
            .await
            .unwrap();
        // A memory whose fact key holds the canary: kept as a keyed hash only.
        let m = abridge_engine::types::NewMemory {
            fact_key: format!("fact:{CANARY}"),
            ..memory("f1", &format!("{CANARY} memory"), [1.0, 0.0, 0.0], None)
        };
        db.put_memory(tenant.name(), m).await.unwrap();
    }
}

/// Everything reads back exactly.
async fn read_all(db: Arc<dyn AppStore>) -> Result<(), String> {
    for tenant in [Tenant::local(), Tenant::new("acme").unwrap()] {
        let store = db.for_tenant(&tenant);
        let tables = store.clone();
        let e = |e: abridge_engine::types::Error| format!("{e:?}");
        let eps = store.episodes_after("s", 0, 10).await.map_err(e)?;
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[1].content, episode(2).content);
        assert_eq!(eps[0].speaker, episode(1).speaker);
        let items = tables.items("s", &[1, 2]).await.map_err(e)?;
        assert_eq!(items.get(&2), episode(2).item.as_ref());
        let rows = store.summaries("s").await.map_err(e)?;
        assert_eq!(rows[0].content, format!("{CANARY} summary"));
        assert_eq!(rows[0].ledger[0].text, format!("/srv/{CANARY}.toml"));
        let p = store.partial("p").await.map_err(e)?.unwrap();
        assert_eq!(p.text, format!("{CANARY} partial"));
        let f = tables.session_focus("s").await.map_err(e)?;
        assert_eq!(f.unwrap(), format!("{CANARY} focus"));
        let l = tables.session_label("s").await.map_err(e)?;
        assert!(l.unwrap().contains(&format!("{CANARY} title")));
        let evs = db.events_after(tenant.name(), 0, 10).await.map_err(e)?;
        assert!(evs[0].data.contains(&format!("{CANARY} event")));
        let current = db
            .current_memory(tenant.name(), &scope("k"), &format!("fact:{CANARY}"))
            .await
            .map_err(e)?;
        assert_eq!(current.map(|m| m.text), Some(format!("{CANARY} memory")));
    }
    Ok(())
}

fn find(hay: &[u8]) -> bool {
    hay.windows(CANARY.len()).any(|w| w == CANARY.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_seals_every_text_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sealed.db");
    let key = Secret::random().unwrap();
    let db: Arc<dyn AppStore> = Arc::new(
        SqliteStore::open(&path)
            .unwrap()
            .with_master_key(key.clone()),
    );
    write_all(db.clone()).await;
    read_all(db.clone()).await.unwrap();
    drop(db);
    // No byte of the file or its WAL holds the canary.
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        assert!(
            !find(&std::fs::read(&f).unwrap()),
            "{} holds the canary in clear",
            f.display()
        );
    }
    // Without the key the text is refused, with the fix; another key opens nothing.
    let plain: Arc<dyn AppStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let e = read_all(plain).await.unwrap_err();
    assert!(e.contains("ABRIDGE_MASTER_KEY_FILE"), "{e}");
    let other: Arc<dyn AppStore> = Arc::new(
        SqliteStore::open(&path)
            .unwrap()
            .with_master_key(Secret::random().unwrap()),
    );
    let e = read_all(other).await.unwrap_err();
    assert!(e.contains("not the key"), "{e}");
    // A sealed value moved to another row does not open.
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute(
            "UPDATE episodes SET content = (SELECT content FROM episodes WHERE session = 's' AND id = 2) WHERE session = 's' AND id = 1",
            [],
        )
        .unwrap();
    }
    let db: Arc<dyn AppStore> = Arc::new(
        SqliteStore::open(&path)
            .unwrap()
            .with_master_key(key.clone()),
    );
    let e = db.episodes_after("s", 0, 10).await.unwrap_err();
    assert!(format!("{e:?}").contains("does not decrypt"), "{e:?}");
    // A rotated master key still opens what the old one sealed.
    let acme = db.clone().for_tenant(&Tenant::new("acme").unwrap());
    let new = Secret::random().unwrap();
    let sqlite = SqliteStore::open(&path).unwrap().with_master_key(key);
    assert_eq!(sqlite.rotate_master_key(&new).unwrap(), 2);
    drop(acme);
    let rotated: Arc<dyn AppStore> =
        Arc::new(SqliteStore::open(&path).unwrap().with_master_key(new));
    let acme = rotated.for_tenant(&Tenant::new("acme").unwrap());
    assert_eq!(
        acme.episodes_after("s", 0, 10).await.unwrap()[0].content,
        episode(1).content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_seals_every_text_column() {
    let Some(pg) = abridge_test_pg::shared() else {
        return;
    };
    let url = pg.database("sealing");
    let key = Secret::random().unwrap();
    let db: Arc<dyn AppStore> = Arc::new(
        PgStore::connect(&url)
            .await
            .unwrap()
            .with_master_key(key.clone()),
    );
    write_all(db.clone()).await;
    read_all(db.clone()).await.unwrap();
    // No row of any table, read as text, holds the canary.
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tables: Vec<String> = c
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.len() > 10);
    for t in &tables {
        for r in c
            .query(&format!("SELECT t::text FROM \"{t}\" t"), &[])
            .await
            .unwrap()
        {
            let row: String = r.get(0);
            // BYTEA reads as hex: look for the canary's hex too.
            let hex: String = CANARY.bytes().map(|b| format!("{b:02x}")).collect();
            assert!(
                !row.contains(CANARY) && !row.contains(&hex),
                "table {t} holds the canary in clear: {row}"
            );
        }
    }
    let plain: Arc<dyn AppStore> = Arc::new(PgStore::connect(&url).await.unwrap());
    let e = read_all(plain).await.unwrap_err();
    assert!(e.contains("ABRIDGE_MASTER_KEY_FILE"), "{e}");
    c.execute(
        "UPDATE summaries SET content = (SELECT content FROM summaries WHERE session = 's') WHERE session <> 's'",
        &[],
    )
    .await
    .unwrap();
    let acme = db.clone().for_tenant(&Tenant::new("acme").unwrap());
    let e = acme.summaries("s").await.unwrap_err();
    assert!(format!("{e:?}").contains("does not decrypt"), "{e:?}");
    // Forgetting a tenant deletes its data keys and vacuums the tables that held its text.
    let pgs = PgStore::connect(&url).await.unwrap().with_master_key(key);
    abridge_store::RecallStore::forget_tenant(&pgs, "acme")
        .await
        .unwrap();
    let fresh: Arc<dyn AppStore> = Arc::new(pgs);
    let acme = fresh.for_tenant(&Tenant::new("acme").unwrap());
    let e = acme.episodes_after("s", 0, 10).await.unwrap_err();
    assert!(format!("{e:?}").contains("is gone"), "{e:?}");
}

/// Vectors sealed too: a memory's vector, its cluster's sum and a summary's vector are stored
/// sealed (their bytes appear nowhere), search still ranks them, and without the key it is
/// refused.
async fn vectors_sealed(db: Arc<dyn abridge_store::RecallStore>) -> Vec<u8> {
    use abridge_engine::types::MemoryFilter;
    let v = [0.125f32, -0.5, 0.75];
    db.put_memory("acme", memory("m1", "first", v, None))
        .await
        .unwrap();
    db.put_memory("acme", memory("m2", "second", [0.75, 0.125, -0.5], Some(1)))
        .await
        .unwrap();
    let hits = db
        .search("acme", &v, "emb", &MemoryFilter::default(), 2)
        .await
        .unwrap();
    assert_eq!(hits[0].id, "m1");
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_seals_vectors_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectors.db");
    let key = Secret::random().unwrap();
    let db = Arc::new(
        SqliteStore::open(&path)
            .unwrap()
            .with_master_key(key.clone())
            .with_sealed_vectors(),
    );
    let bytes = vectors_sealed(db.clone()).await;
    drop(db);
    let c = rusqlite::Connection::open(&path).unwrap();
    for (table, col) in [("memories", "vector"), ("clusters", "sum")] {
        let lens: Vec<i64> = c
            .prepare(&format!("SELECT length({col}) FROM {table}"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            lens.iter().all(|n| n % 4 == 1),
            "{table}.{col} is not sealed: {lens:?}"
        );
    }
    drop(c);
    let mut disk = Vec::new();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        disk.extend(std::fs::read(f.unwrap().path()).unwrap());
    }
    assert!(
        !disk.windows(bytes.len()).any(|w| w == bytes.as_slice()),
        "a vector is on disk in clear"
    );
    // Without the key search is refused; with it (sealing off or on) it works.
    let plain: Arc<dyn abridge_store::RecallStore> = Arc::new(SqliteStore::open(&path).unwrap());
    let e = plain
        .search("acme", &[0.125, -0.5, 0.75], "emb", &Default::default(), 2)
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("ABRIDGE_MASTER_KEY_FILE"),
        "{e:?}"
    );
    let keyed: Arc<dyn abridge_store::RecallStore> =
        Arc::new(SqliteStore::open(&path).unwrap().with_master_key(key));
    let hits = keyed
        .search("acme", &[0.125, -0.5, 0.75], "emb", &Default::default(), 2)
        .await
        .unwrap();
    assert_eq!(hits[0].id, "m1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_seals_vectors_when_asked() {
    let Some(pg) = abridge_test_pg::shared() else {
        return;
    };
    let url = pg.database("sealing_vectors");
    let key = Secret::random().unwrap();
    let db = Arc::new(
        PgStore::connect(&url)
            .await
            .unwrap()
            .with_master_key(key)
            .with_sealed_vectors(),
    );
    vectors_sealed(db).await;
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    for (table, col) in [("memories", "vector"), ("clusters", "sum")] {
        for r in c
            .query(&format!("SELECT octet_length({col}) FROM {table}"), &[])
            .await
            .unwrap()
        {
            let n: i32 = r.get(0);
            assert_eq!(n % 4, 1, "{table}.{col} is not sealed");
        }
    }
}
