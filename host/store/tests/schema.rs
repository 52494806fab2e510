//! The two SQL schemas cannot drift: SQLite's (`src/migrations/*.sql`, applied in order) and
//! PostgreSQL's (`src/pg/*.sql`) are read back from real databases after every migration has
//! run, and must have the same tables, the same columns in each, and the same indexes by
//! name. A column or index added to one dialect only fails this test; the few differences
//! that are on purpose are listed, with the reason, in [`ONLY_IN`].
//!
//! PostgreSQL is started by the harness; without it the comparison reports SKIPPED (CI sets
//! `ABRIDGE_REQUIRE_PG=1`, which makes that a failure).

use std::collections::{BTreeMap, BTreeSet};

use abridge_store::{PgStore, SqliteStore};

/// Tables, each with its columns, and index names.
#[derive(Debug, Default, PartialEq)]
struct Schema {
    tables: BTreeMap<String, BTreeSet<String>>,
    indexes: BTreeSet<String>,
}

/// What one dialect has and the other lacks, on purpose: (dialect, kind, name, why).
const ONLY_IN: &[(&str, &str, &str, &str)] = &[
    (
        "sqlite",
        "table",
        "episode_fts",
        "SQLite's full-text index of the hashed terms (FTS5 and its own tables, and the vocabulary view that counts a term's episodes); PostgreSQL's is the GIN index episode_terms_fts",
    ),
    (
        "sqlite",
        "table",
        "episode_fts_config",
        "SQLite's full-text index of the hashed terms (FTS5 and its own tables, and the vocabulary view that counts a term's episodes); PostgreSQL's is the GIN index episode_terms_fts",
    ),
    (
        "sqlite",
        "table",
        "episode_fts_data",
        "SQLite's full-text index of the hashed terms (FTS5 and its own tables, and the vocabulary view that counts a term's episodes); PostgreSQL's is the GIN index episode_terms_fts",
    ),
    (
        "sqlite",
        "table",
        "episode_fts_idx",
        "SQLite's full-text index of the hashed terms (FTS5 and its own tables, and the vocabulary view that counts a term's episodes); PostgreSQL's is the GIN index episode_terms_fts",
    ),
    (
        "sqlite",
        "table",
        "episode_vocab",
        "SQLite's full-text index of the hashed terms (FTS5 and its own tables, and the vocabulary view that counts a term's episodes); PostgreSQL's is the GIN index episode_terms_fts",
    ),
    (
        "postgres",
        "index",
        "episode_terms_fts",
        "PostgreSQL's full-text index: GIN over the simple tsvector of the hashed terms; SQLite's is the FTS5 table episode_fts",
    ),
    (
        "sqlite",
        "table",
        "ann_graphs",
        "SQLite's recall index is an HNSW graph in the process, saved here so a restart loads it; PostgreSQL's is pgvector's index, inside the database",
    ),
    (
        "postgres",
        "index",
        "sessions_tenant_id",
        "a session named by the start of its id: PostgreSQL compares text by its collation, so a prefix needs an index by pattern (LIKE); SQLite reads a byte-ordered range of the primary key",
    ),
    (
        "sqlite",
        "table",
        "memory_marks",
        "deletions counted for the in-process HNSW recall index of SQLite (PostgreSQL's index is pgvector, kept by the server)",
    ),
    (
        "postgres",
        "table",
        "abridge_schema",
        "PostgreSQL's migration counter (written under an advisory lock); SQLite keeps it in PRAGMA user_version",
    ),
    (
        "postgres",
        "table",
        "model_slots",
        "leased model slots shared by several instances; one SQLite process bounds its calls in memory",
    ),
    (
        "postgres",
        "index",
        "model_slots_tenant",
        "the index of model_slots (see that table)",
    ),
    (
        "sqlite",
        "index",
        "clusters_changed",
        "PostgreSQL names it clusters_changed_idx: there clusters_changed is the sequence it orders by, and sequences and indexes share one namespace",
    ),
    (
        "postgres",
        "index",
        "clusters_changed_idx",
        "SQLite's clusters_changed (see there)",
    ),
];

fn expected_only(dialect: &str, kind: &str) -> BTreeSet<String> {
    ONLY_IN
        .iter()
        .filter(|(d, k, _, _)| *d == dialect && *k == kind)
        .map(|(_, _, n, _)| n.to_string())
        .collect()
}

fn sqlite_schema() -> Schema {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schema.db");
    drop(SqliteStore::open(&path).unwrap());
    let c = rusqlite::Connection::open(&path).unwrap();
    let names = |sql: &str| -> Vec<String> {
        let mut st = c.prepare(sql).unwrap();
        st.query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let mut s = Schema::default();
    for t in
        names("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    {
        let cols = names(&format!("SELECT name FROM pragma_table_info('{t}')"));
        s.tables.insert(t, cols.into_iter().collect());
    }
    s.indexes = names(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex_%'",
    )
    .into_iter()
    .collect();
    s
}

async fn postgres_schema() -> Option<Schema> {
    let url = abridge_test_pg::shared()?.database("schema");
    drop(PgStore::connect(&url).await.expect("connect"));
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let mut s = Schema::default();
    for r in c
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns WHERE table_schema = current_schema()",
            &[],
        )
        .await
        .unwrap()
    {
        let column: String = r.get(1);
        // pgvector's copy of `vector` (added when the extension is there, see pg/ann.rs).
        if column == "embedding" {
            continue;
        }
        s.tables.entry(r.get(0)).or_default().insert(column);
    }
    // The indexes behind primary keys and UNIQUE constraints are named by PostgreSQL itself
    // (`<table>_pkey`, `<table>_<column>_key`); SQLite's are implicit.
    for r in c
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = current_schema() AND indexname NOT IN (SELECT conname FROM pg_constraint)",
            &[],
        )
        .await
        .unwrap()
    {
        s.indexes.insert(r.get(0));
    }
    Some(s)
}

/// The names in `a` that `b` lacks.
fn missing<'a>(a: impl Iterator<Item = &'a String>, b: &BTreeSet<&'a String>) -> BTreeSet<String> {
    a.filter(|x| !b.contains(x)).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_postgres_have_the_same_tables_columns_and_indexes() {
    let lite = sqlite_schema();
    assert!(lite.tables.contains_key("episodes"), "{lite:?}");
    let Some(pg) = postgres_schema().await else {
        return;
    };
    let lt: BTreeSet<&String> = lite.tables.keys().collect();
    let pt: BTreeSet<&String> = pg.tables.keys().collect();
    assert_eq!(
        missing(lite.tables.keys(), &pt),
        expected_only("sqlite", "table"),
        "tables only in SQLite's migrations: add them to src/pg/ (or list them in ONLY_IN with the reason)"
    );
    assert_eq!(
        missing(pg.tables.keys(), &lt),
        expected_only("postgres", "table"),
        "tables only in PostgreSQL's schema: add them to src/migrations/ (or list them in ONLY_IN with the reason)"
    );
    let mut drift = Vec::new();
    for (t, cols) in &lite.tables {
        let Some(other) = pg.tables.get(t) else {
            continue;
        };
        if cols != other {
            drift.push(format!(
                "{t}: only in SQLite {:?}, only in PostgreSQL {:?}",
                cols.difference(other).collect::<Vec<_>>(),
                other.difference(cols).collect::<Vec<_>>()
            ));
        }
    }
    assert!(drift.is_empty(), "columns differ:\n{}", drift.join("\n"));
    let li: BTreeSet<&String> = lite.indexes.iter().collect();
    let pi: BTreeSet<&String> = pg.indexes.iter().collect();
    assert_eq!(
        missing(lite.indexes.iter(), &pi),
        expected_only("sqlite", "index"),
        "indexes only in SQLite"
    );
    // pgvector's per-model HNSW indexes are made at run time, not by the schema.
    let pg_only: BTreeSet<String> = missing(pg.indexes.iter(), &li)
        .into_iter()
        .filter(|i| !i.starts_with("memories_ann_"))
        .collect();
    assert_eq!(
        pg_only,
        expected_only("postgres", "index"),
        "indexes only in PostgreSQL"
    );
}

/// PostgreSQL migrations 9 and 10 name the tenant of the jobs and sessions stored before them,
/// 11 gives a cluster summary what it covers in two numbers from its id list, and 12 indexes
/// sessions for search: a database taken back to version 8 is migrated again, and a worker's
/// poll, a tenant's session list and search, and the summary find what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_name_the_tenant_of_older_jobs_and_sessions() {
    use abridge_store::AppStore;
    use abridge_store::JobStore;
    use abridge_store::tenant::Tenant;
    use std::sync::Arc;
    let Some(pg) = abridge_test_pg::shared() else {
        return;
    };
    let url = pg.database("tenant_columns");
    let s = PgStore::connect(&url).await.expect("connect");
    for (tenant, key, episodes) in [
        ("acme", "a", 1),
        ("local", "local-one", 1),
        ("acme", "b", 1),
    ] {
        let view = s.for_tenant(&Tenant::new(tenant).unwrap());
        let ep = abridge_engine::types::NewEpisode {
            role: abridge_engine::types::Role::User,
            content: "hi".into(),
            source_key: format!("k{episodes}"),
            tokens: 1,
            ..Default::default()
        };
        view.append_episodes(key, vec![ep]).await.unwrap();
        view.job_enqueue(key, 1, "{}", 1_000).await.unwrap();
    }
    use abridge_store::recall::RecallStore;
    let mut cluster = None;
    for id in ["m1", "m2", "m3"] {
        let m = abridge_engine::types::NewMemory {
            id: id.into(),
            scope: abridge_engine::types::Scope {
                user: "u".into(),
                project: "p".into(),
                environment: "e".into(),
                kind: "fact".into(),
                key: "k".into(),
            },
            text: format!("fact {id}"),
            importance: 0.5,
            tokens: 2,
            created_ms: 1,
            model: "emb".into(),
            vector: vec![1.0, 0.0],
            cluster,
            fact_key: String::new(),
            replaces: None,
        };
        cluster = Some(s.put_memory("acme", m).await.unwrap().cluster);
    }
    let cluster = cluster.unwrap();
    let set = s.members_after("acme", cluster, 0).await.unwrap();
    let w = abridge_engine::types::ClusterSummaryWrite {
        cluster,
        expect: None,
        member_hash: "h".into(),
        covered_seq: 1,
        covered: 1,
        version: set.version,
        text: "facts".into(),
        tokens: 1,
        importance: 0.5,
        model: "m".into(),
        vector_model: "emb".into(),
        vector: vec![1.0, 0.0],
        calls: 1,
        prompt_tokens: 1,
        output_tokens: 1,
        now_ms: 1,
    };
    assert!(s.write_cluster_summary("acme", w).await.unwrap());
    drop(s);
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c.batch_execute(
        r#"DROP INDEX sessions_ungrammed; ALTER TABLE sessions DROP COLUMN grams; DROP TABLE session_grams;
         DROP INDEX memories_rank; ALTER TABLE cluster_summaries ADD COLUMN sources TEXT NOT NULL DEFAULT '["m1","m2"]';
         ALTER TABLE cluster_summaries DROP COLUMN covered_seq; ALTER TABLE cluster_summaries DROP COLUMN covered;
         DROP INDEX sessions_tenant_change; DROP INDEX sessions_tenant_id; ALTER TABLE sessions DROP COLUMN tenant;
         DROP INDEX jobs_runnable; ALTER TABLE jobs DROP COLUMN tenant;
         UPDATE abridge_schema SET version = 8"#,
    )
    .await
    .unwrap();
    let s = Arc::new(PgStore::connect(&url).await.expect("migrates again"));
    let mut polled: Vec<String> = s
        .jobs_runnable(1)
        .await
        .unwrap()
        .into_iter()
        .map(|j| format!("{}/{}", j.tenant, j.session))
        .collect();
    polled.sort();
    // Each tenant's oldest: acme's two jobs are one tenant's, the local one another's.
    assert_eq!(polled, ["acme/a", "local/local-one"]);
    let acme = s.for_tenant(&Tenant::new("acme").unwrap());
    let mut listed = acme.sessions_page(0, 10).await.unwrap();
    listed.sort();
    assert_eq!(listed, ["a", "b"]);
    assert_eq!(acme.sessions_prefixed("b", 5).await.unwrap().1, 1);
    let local = s.for_tenant(&Tenant::local());
    assert_eq!(local.sessions_page(0, 10).await.unwrap(), ["local-one"]);
    // Migration 12: sessions stored before it enter the search index at the first search.
    let found = local.sessions_labelled("CAL-o").await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, "local-one");
    // The summary covered the first two of the three: the third is still to fold in.
    let sum = s.cluster_summary("acme", cluster).await.unwrap().unwrap();
    assert_eq!((sum.covered_seq, sum.covered), (set.members[1].seq, 2));
    let newer = s
        .members_after("acme", cluster, sum.covered_seq)
        .await
        .unwrap();
    assert_eq!(newer.members.len(), 1);
    assert_eq!(newer.members[0].id, "m3");
}
