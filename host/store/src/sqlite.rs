//! The SQLite store: one file, WAL journal, versioned schema migrations.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::types::Error;

/// Schema migrations, the numbered files of `migrations/` in order (listed by `build.rs`),
/// shared with the JavaScript host (its build copies these files); `PRAGMA user_version`
/// records how many have run.
const MIGRATIONS: &[&str] = include!(concat!(env!("OUT_DIR"), "/sqlite_migrations.rs"));

/// The SQLite store: a file (or memory), every store trait written once over its
/// transactions ([`crate::once`]).
pub type SqliteStore = crate::once::Sql<SqliteDb>;

impl SqliteStore {
    /// Open (creating if needed) the database file at `path` and bring its schema up to date.
    pub fn open(path: &Path) -> Result<Self, Error> {
        SqliteDb::open(path).map(crate::once::Sql::new)
    }

    /// An in-memory database (for tests and benchmarks).
    pub fn in_memory() -> Result<Self, Error> {
        SqliteDb::in_memory().map(crate::once::Sql::new)
    }

    /// Fold at most `rows` into a recall index within a search (see
    /// [`SqliteDb::with_ann_inline`]).
    pub fn with_ann_inline(mut self, rows: usize) -> Self {
        self.db_mut().ann_inline = rows;
        self
    }
}

/// A SQLite database: its connection, keys and recall indexes (what [`SqliteStore`] runs on).
pub struct SqliteDb {
    /// The one connection. Its lock blocks (SQLite's statements do), and a transaction holds
    /// it across its body's statements, which never wait on anything else (so the guard may
    /// cross their `.await`s: `send_guard`). An async lock would queue waiters that only
    /// their own task can take their turn for, and a task blocked beside its own waiter
    /// would never give it that turn.
    pub(crate) conn: parking_lot::Mutex<Connection>,
    /// The file's path, named in every error.
    pub(super) name: String,
    /// The master key and whether vectors are sealed too (see [`crate::Sql::with_master_key`]).
    pub(crate) sealing: super::keyring::Sealing,
    /// Recall's vector indexes, per tenant and model, built on first need (see `ann.rs`).
    pub(super) ann: crate::ann::AnnIndexes,
    /// Most rows a search folds into an index itself (see [`crate::ann::BUILD_INLINE`]).
    pub(super) ann_inline: usize,
}

/// The tables only SQLite keeps (see [`crate::rules::refuse_foreign`]): the memory marks, the
/// saved recall graphs and FTS5's tables.
const OWN_TABLES: &[&str] = &[
    "memory_marks",
    "ann_graphs",
    "episode_fts",
    "episode_fts_data",
    "episode_fts_idx",
    "episode_fts_config",
    "episode_fts_content",
    "episode_fts_docsize",
    "episode_vocab",
];

/// Add the database's path and what to do to a SQLite error's message.
fn explain(name: &str, msg: &str) -> String {
    let remedy = if msg.contains("readonly") || msg.contains("read-only") {
        "the file (or its folder, which must hold the -wal and -shm files) is not writable: fix its permissions, or point --db/ABRIDGE_DB at a writable file"
    } else if msg.contains("malformed") || msg.contains("not a database") || msg.contains("corrupt")
    {
        "the file is damaged: move it aside and start a new database (or salvage it with `sqlite3 FILE .recover`), then run the import again"
    } else if msg.contains("disk is full") || msg.contains("disk I/O") {
        "the disk is full or failing: free space, or point --db/ABRIDGE_DB at another disk"
    } else if msg.contains("locked") || msg.contains("busy") {
        "another process holds the database for too long: wait for it to finish and try again"
    } else {
        return format!("database {name}: {msg}");
    };
    format!("database {name}: {msg} — {remedy}")
}

/// Prepared statements a connection keeps.
const STATEMENT_CACHE: usize = 256;

/// How long one connection waits for another's lock before giving up.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why opening stopped: a SQLite error (perhaps worth another try) or a refusal.
enum Init {
    Sqlite(rusqlite::Error),
    Refused(Error),
}

impl From<rusqlite::Error> for Init {
    fn from(e: rusqlite::Error) -> Self {
        Init::Sqlite(e)
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// After a delete: copy the WAL into the file and truncate it, so the deleted rows' old page
/// images (which `secure_delete` does not reach) leave the disk too. A reader holding the
/// WAL makes this a no-op; the next delete (or SQLite's own checkpoints) finish it.
pub(crate) fn scrub(conn: &Connection) {
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
        tracing::debug!(error = %e, "checkpoint after a delete did not run");
    }
}

/// Check that the file is ours, switch it to WAL and run the migrations it lacks.
fn prepare(conn: &mut Connection, name: &str) -> Result<(), Init> {
    // Look before touching anything: another program's database is neither migrated nor
    // switched to WAL.
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())?;
    crate::rules::refuse_foreign(&tables, OWN_TABLES)
        .map_err(|(shown, more)| {
            Init::Refused(Error::Storage(format!(
                "{name} is not an abridge database (it holds other tables: {shown}{more}); abridge leaves it untouched — point --db/ABRIDGE_DB at a new file"
            )))
        })?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Deleted means gone: freed content is overwritten with zeros (and `scrub` empties the
    // WAL after a delete).
    conn.pragma_update(None, "secure_delete", "ON")?;
    // The store reads through one connection: a page cache of 32 MB (SQLite's default is 2)
    // keeps what recall and the context read again (summaries' vectors, memory rows) in
    // memory instead of copying it from the file on every call.
    conn.pragma_update(None, "cache_size", -32_000)?;
    // And a long-lived process reads the file through a memory map (up to the 2 GB SQLite
    // allows), not copied by a system call per page: a recall's rows past the first 256 MB of
    // a large file (a saved graph takes 80 MB at 50,000 memories) were read that way. A
    // one-shot command does not ([`memory_map`]): every page of the file it touched would
    // count as its resident memory, which then grows with the file, not the work.
    if MEMORY_MAP.load(std::sync::atomic::Ordering::Relaxed) {
        conn.pragma_update(None, "mmap_size", 2_147_418_112i64)?;
    }
    // Two processes may open a new database at once: each migration step runs in a write
    // transaction taken before the version is read, so the second waits for the first and
    // then finds the work done.
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version = tx.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? as usize;
        if version > MIGRATIONS.len() {
            return Err(Init::Refused(Error::Storage(format!(
                "{name} was written by a newer abridge (schema {version}, this build knows {}); upgrade abridge",
                MIGRATIONS.len()
            ))));
        }
        let Some(sql) = MIGRATIONS.get(version) else {
            return Ok(());
        };
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (version + 1) as i64)?;
        tx.commit()?;
    }
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

static MEMORY_MAP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether SQLite files opened from now on in this process are read through a memory map (on
/// by default: a server reads the same pages again and again). A one-shot command that reads
/// a large file once (an import, a summary of a long transcript) turns it off, so its resident
/// memory stays bounded by its work rather than by the file's size.
pub fn memory_map(on: bool) {
    MEMORY_MAP.store(on, std::sync::atomic::Ordering::Relaxed);
}

impl SqliteDb {
    /// Open (creating if needed) the database file at `path` and bring its schema up to date.
    pub fn open(path: &Path) -> Result<Self, Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Storage(format!("cannot create {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path).map_err(|e| {
            Error::Storage(format!("cannot open the database {}: {e}; check the path (--db/ABRIDGE_DB) and its permissions", path.display()))
        })?;
        Self::init(conn, &path.display().to_string())
    }

    /// Fold at most `rows` into a recall index within a search; a larger build runs on a
    /// thread of its own (default [`crate::ann::BUILD_INLINE`]; tests and benchmarks set it).
    pub fn with_ann_inline(mut self, rows: usize) -> Self {
        self.ann_inline = rows;
        self
    }

    /// Whether `tenant`'s recall index of `model` is built and no build of it is under way.
    pub fn ann_ready(&self, tenant: &str, model: &str) -> bool {
        self.ann.get(tenant, model).is_some() && !self.ann.building(tenant, model)
    }

    /// How far `tenant`'s saved recall graph of `model` reaches (its memories' sequence
    /// number), if one is saved: what the next process loads instead of building.
    pub fn ann_saved(&self, tenant: &str, model: &str) -> Result<Option<u64>, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT seq FROM ann_graphs WHERE tenant = ?1 AND model = ?2",
                [tenant, model],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|s| s.map(|s| s as u64))
            .map_err(db_err)
        })
    }

    /// Rotate the master key: re-wrap every tenant's data keys under `new` and start a new
    /// data key version per tenant (rows are re-sealed under it when next written). Returns
    /// the tenants whose keys were rotated.
    pub fn rotate_master_key(&self, new: &crate::crypto::Secret) -> Result<usize, Error> {
        let keys = self.sealing.keys.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "no current master key is set: set ABRIDGE_MASTER_KEY_FILE to the key the database was written with".into(),
            )
        })?;
        self.with(|c| keys.rotate(c, new))
    }

    /// An in-memory database (for tests and benchmarks).
    pub fn in_memory() -> Result<Self, Error> {
        Self::init(Connection::open_in_memory().map_err(db_err)?, ":memory:")
    }

    fn init(mut conn: Connection, name: &str) -> Result<Self, Error> {
        let fail = |e: rusqlite::Error| Error::Storage(explain(name, &e.to_string()));
        conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        // Every statement of a message's path stays prepared (rusqlite keeps 16 by default,
        // fewer than one append, its index and the freshness verdict use).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // SQLite waits out another connection's lock (the busy timeout) except where waiting
        // could deadlock: two new openers both switching the file to WAL get SQLITE_BUSY at
        // once. Every step below is safe to repeat, so the whole sequence is tried again,
        // with a short pause, until the same deadline.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mut pause = std::time::Duration::from_millis(5 + u64::from(std::process::id() % 11));
        loop {
            match prepare(&mut conn, name) {
                Ok(()) => break,
                Err(Init::Sqlite(e)) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(200));
                }
                Err(Init::Sqlite(e)) => return Err(fail(e)),
                Err(Init::Refused(e)) => return Err(e),
            }
        }
        Ok(SqliteDb {
            conn: parking_lot::Mutex::new(conn),
            name: name.to_string(),
            sealing: crate::keyring::Sealing::default(),
            ann: Default::default(),
            ann_inline: crate::ann::BUILD_INLINE,
        })
    }

    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        crate::count_call();
        // SQLite blocks: on a multi-threaded runtime the worker thread hands its other tasks
        // to the rest of the pool while this call waits for the lock and the disk.
        blocking(|| f(&mut self.conn.lock())).map_err(|e| self.explain_err(e))
    }

    /// A store error as reported: SQLite's own named with the file and the fix.
    pub(crate) fn explain_err(&self, e: Error) -> Error {
        match e {
            Error::Storage(msg) if !msg.starts_with("database ") => {
                Error::Storage(explain(&self.name, &msg))
            }
            other => other,
        }
    }

    /// A SQLite error as the store reports it (the file named, the fix said).
    pub(crate) fn explained(&self, e: rusqlite::Error) -> Error {
        Error::Storage(explain(&self.name, &e.to_string()))
    }
}

/// Run `f`, which blocks on SQLite (its lock, the disk): on a multi-threaded runtime the
/// worker hands its other tasks to the rest of the pool meanwhile.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    let blocking_ok = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if blocking_ok {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;
    use crate::types::{NewEpisode, Role};

    /// What undoes each migration a test takes a database back over, by a word only that
    /// migration's SQL (and later ones) holds; a new migration that tests go back over adds
    /// its line.
    const UNDO: &[(&str, &str)] = &[
        (
            "tokens_through",
            "ALTER TABLE episodes DROP COLUMN tokens_through",
        ),
        ("memory_marks", "DROP TABLE memory_marks"),
        (
            "bytes_through",
            "ALTER TABLE episodes DROP COLUMN bytes_through",
        ),
        (
            "jobs_runnable",
            "DROP INDEX jobs_runnable; ALTER TABLE jobs DROP COLUMN tenant",
        ),
        (
            "sessions_tenant_change",
            "DROP INDEX sessions_tenant_change; ALTER TABLE sessions DROP COLUMN tenant",
        ),
        (
            "memories_rank",
            "DROP INDEX memories_rank; ALTER TABLE cluster_summaries ADD COLUMN sources TEXT NOT NULL DEFAULT '[]'; ALTER TABLE cluster_summaries DROP COLUMN covered_seq; ALTER TABLE cluster_summaries DROP COLUMN covered",
        ),
        (
            "sessions_ungrammed",
            "DROP INDEX sessions_ungrammed; ALTER TABLE sessions DROP COLUMN grams; DROP TABLE session_grams",
        ),
        ("ann_graphs", "DROP TABLE ann_graphs"),
        // A layout change: the tables read and write the same either way.
        ("memories_rowid", "SELECT 1"),
        (
            "sessions_unindexed",
            "DROP INDEX sessions_unindexed; ALTER TABLE sessions DROP COLUMN indexed; DROP TABLE search_totals; DROP TRIGGER episode_terms_indexed; DROP TRIGGER episode_terms_removed; DROP TABLE episode_vocab; DROP TABLE episode_fts; DROP TABLE episode_terms",
        ),
        ("COLUMN item", "ALTER TABLE episodes DROP COLUMN item"),
        (
            "memories_successor",
            "DROP INDEX memories_predecessor; DROP INDEX memories_successor; DROP INDEX memories_fact; ALTER TABLE memories DROP COLUMN superseded_ms; ALTER TABLE memories DROP COLUMN superseded_by; ALTER TABLE memories DROP COLUMN supersedes; ALTER TABLE memories DROP COLUMN fact_key",
        ),
    ];

    /// The store bound to tenant `name`.
    fn view(s: &SqliteStore, name: &str) -> std::sync::Arc<dyn crate::AppStore> {
        crate::AppStore::for_tenant(s, &crate::tenant::Tenant::new(name).unwrap())
    }

    /// Sessions of three tenants, the local one among them.
    const TENANTS_AND_IDS: [(&str, &str); 4] = [
        ("acme", "a"),
        ("acme", "b"),
        ("local", "local-one"),
        ("beta", "c"),
    ];

    /// One short user message.
    fn hi() -> Vec<NewEpisode> {
        vec![message(0, "hi", 1, None)]
    }

    /// A user's message `content` keyed `k{i}`, of `tokens` tokens, at `timestamp_ms`.
    fn message(i: usize, content: &str, tokens: u32, timestamp_ms: Option<i64>) -> NewEpisode {
        NewEpisode {
            role: Role::User,
            content: content.into(),
            timestamp_ms,
            source_key: if i == 0 { "k".into() } else { format!("k{i}") },
            tokens,
            ..Default::default()
        }
    }

    /// A summary of `cluster` covering its members through `(seq, count)`, written against
    /// the cluster's `version`.
    fn summary_write(
        cluster: u64,
        (covered_seq, covered): (u64, u32),
        version: u64,
        text: &str,
    ) -> crate::types::ClusterSummaryWrite {
        crate::types::ClusterSummaryWrite {
            cluster,
            expect: None,
            member_hash: "h".into(),
            covered_seq,
            covered,
            version,
            text: text.into(),
            tokens: 2,
            importance: 0.5,
            model: "m".into(),
            vector_model: "emb".into(),
            vector: vec![1.0, 0.0],
            calls: 1,
            prompt_tokens: 1,
            output_tokens: 1,
            now_ms: 1,
        }
    }

    /// A fact of one scope, with `vector` (model `emb`), joining `cluster` when given.
    fn fact(id: &str, text: &str, vector: &[f32], cluster: Option<u64>) -> crate::types::NewMemory {
        crate::types::NewMemory {
            id: id.into(),
            scope: crate::types::Scope {
                user: "u".into(),
                project: "p".into(),
                environment: "e".into(),
                kind: "fact".into(),
                key: "k".into(),
            },
            text: text.into(),
            importance: 0.5,
            tokens: 2,
            created_ms: 1,
            model: "emb".into(),
            vector: vector.to_vec(),
            cluster,
            fact_key: String::new(),
            replaces: None,
        }
    }

    /// Where a test keeps a plain database and a sealed one (with its key), in `dir`.
    fn plain_and_sealed(
        dir: &Path,
        name: &str,
    ) -> [(std::path::PathBuf, Option<crate::crypto::Secret>); 2] {
        let key = crate::crypto::Secret::random().unwrap();
        [
            (dir.join(format!("{name}-plain.db")), None),
            (dir.join(format!("{name}-sealed.db")), Some(key)),
        ]
    }

    /// The database at `path`, its text sealed under `key` when given (and its vectors too
    /// with `vectors`).
    fn opened(path: &Path, key: Option<&crate::crypto::Secret>, vectors: bool) -> SqliteStore {
        let s = SqliteStore::open(path).unwrap();
        match key {
            Some(k) if vectors => s.with_master_key(k.clone()).with_sealed_vectors(),
            Some(k) => s.with_master_key(k.clone()),
            None => s,
        }
    }

    /// Take the database at `path` back to before the migration whose SQL holds `marker`: its
    /// version number, and that migration and every later one undone.
    fn back_before(path: &Path, marker: &str) {
        let index = |word: &str| MIGRATIONS.iter().position(|m| m.contains(word)).unwrap();
        let at = index(marker);
        assert_eq!(
            UNDO.last().map(|(w, _)| index(w)),
            Some(MIGRATIONS.len() - 1),
            "the newest migration needs its line in UNDO"
        );
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "user_version", at as i64).unwrap();
        for (word, sql) in UNDO.iter().rev() {
            if index(word) >= at {
                conn.execute_batch(sql).unwrap();
            }
        }
    }

    #[test]
    fn database_errors_name_the_file_and_the_fix() {
        let cases = [
            ("attempt to write a readonly database", "not writable"),
            ("database disk image is malformed", "move it aside"),
            ("file is not a database", "move it aside"),
            ("database or disk is full", "free space"),
            ("database is locked", "wait for it"),
        ];
        for (msg, fix) in cases {
            let e = explain("/data/abridge.db", msg);
            assert!(e.starts_with("database /data/abridge.db: "), "{e}");
            assert!(e.contains(fix), "{msg}: {e}");
        }
        assert_eq!(
            explain("/d.db", "something else"),
            "database /d.db: something else"
        );
    }

    #[test]
    fn a_read_only_database_file_is_explained() {
        // Opened read-only (as a file whose permissions forbid writing would be), a write
        // fails with the file named and the fix.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro.db");
        drop(SqliteStore::open(&path).unwrap());
        let conn =
            Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let store = SqliteDb {
            conn: parking_lot::Mutex::new(conn),
            name: path.display().to_string(),
            sealing: crate::keyring::Sealing::default(),
            ann: Default::default(),
            ann_inline: crate::ann::BUILD_INLINE,
        };
        let e = store
            .with(|c| {
                c.execute("INSERT INTO sessions (id) VALUES ('x')", [])
                    .map(drop)
                    .map_err(db_err)
            })
            .unwrap_err();
        let Error::Storage(m) = e else {
            panic!("{e:?}")
        };
        assert!(
            m.contains(&path.display().to_string()) && m.contains("not writable"),
            "{m}"
        );
    }

    #[test]
    fn many_openers_of_a_new_file_at_once_all_succeed() {
        // Openers racing to switch a new file to WAL can be refused by SQLite without its
        // busy wait (it would deadlock); opening tries again instead of failing.
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("new.db");
            let barrier = std::sync::Barrier::new(12);
            std::thread::scope(|s| {
                let opened: Vec<_> = (0..12)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            SqliteStore::open(&path).map(drop)
                        })
                    })
                    .collect();
                for o in opened {
                    o.join()
                        .unwrap()
                        .unwrap_or_else(|e| panic!("round {round}: {e}"));
                }
            });
            let conn = Connection::open(&path).unwrap();
            let version: i64 = conn
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .unwrap();
            assert_eq!(version as usize, MIGRATIONS.len());
        }
    }

    /// Migration 28 names the tenant of every job stored before it, so a worker's poll finds
    /// their queued jobs by tenant.
    #[tokio::test]
    async fn jobs_stored_before_migration_28_are_found_by_tenant() {
        use crate::tables::JobStore;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let s = SqliteStore::open(&path).unwrap();
        for (i, (tenant, session)) in TENANTS_AND_IDS.iter().enumerate() {
            view(&s, tenant)
                .job_enqueue(session, 1, "{}", 1_000 + i as u64)
                .await
                .unwrap();
        }
        drop(s);
        back_before(&path, "jobs_runnable");
        let s = SqliteStore::open(&path).unwrap();
        let sessions: Vec<String> = s
            .jobs_runnable(1)
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.key())
            .collect();
        assert_eq!(sessions, ["acme\u{1f}a", "local-one", "beta\u{1f}c"]);
    }

    /// Migration 29 names the tenant of every session stored before it, so a tenant's list
    /// reads its own.
    #[tokio::test]
    async fn sessions_stored_before_migration_29_are_listed_by_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let s = SqliteStore::open(&path).unwrap();
        for (tenant, session) in [
            ("acme", "a"),
            ("local", "local-one"),
            ("acme", "b"),
            ("beta", "c"),
        ] {
            view(&s, tenant)
                .append_episodes(session, hi())
                .await
                .unwrap();
        }
        drop(s);
        back_before(&path, "sessions_tenant_change");
        let s = SqliteStore::open(&path).unwrap();
        let page = |t: &'static str| {
            let v = view(&s, t);
            async move {
                (
                    v.sessions_page(0, 10).await.unwrap(),
                    v.sessions_count().await.unwrap(),
                )
            }
        };
        assert_eq!(
            page("acme").await,
            (vec!["b".to_string(), "a".to_string()], 2)
        );
        assert_eq!(page("local").await, (vec!["local-one".to_string()], 1));
    }

    /// Migration 31: sessions stored before it (and their names) enter the search index at
    /// the first search.
    #[tokio::test]
    async fn sessions_stored_before_migration_31_are_found_by_search() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let s = SqliteStore::open(&path).unwrap();
        for (tenant, session) in [
            ("acme", "weekly-review"),
            ("acme", "other"),
            ("beta", "weekly-plan"),
        ] {
            view(&s, tenant)
                .append_episodes(session, hi())
                .await
                .unwrap();
        }
        view(&s, "acme")
            .set_session_label("other", Some(r#"{"title":"Weekly sync"}"#))
            .await
            .unwrap();
        drop(s);
        back_before(&path, "sessions_ungrammed");
        let s = SqliteStore::open(&path).unwrap();
        let acme = view(&s, "acme");
        let mut found: Vec<String> = acme
            .sessions_labelled("weekly")
            .await
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect();
        found.sort();
        assert_eq!(found, ["other", "weekly-review"]);
        // More than one batch of sessions to add: all of them are found.
        for i in 0..1_100 {
            acme.append_episodes(&format!("bulk-{i}"), hi())
                .await
                .unwrap();
        }
        for q in ["bulk-0", "bulk-1099"] {
            let found = acme.sessions_labelled(q).await.unwrap();
            assert_eq!(found.len(), 1, "{q}");
            assert_eq!(found[0].0, q);
        }
    }

    /// Migration 30 gives each summary stored before it what it covers in two numbers, from
    /// its list of ids: a summary that had not yet taken in a newer member still folds it in.
    #[tokio::test]
    async fn summaries_stored_before_migration_30_keep_what_they_cover() {
        use crate::recall::RecallStore;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let s = SqliteStore::open(&path).unwrap();
        let mut cluster = None;
        for id in ["m1", "m2", "m3", "m4"] {
            let m = fact(id, &format!("fact {id}"), &[1.0, 0.0], cluster);
            cluster = Some(s.put_memory("acme", m).await.unwrap().cluster);
        }
        let cluster = cluster.unwrap();
        let set = s.members_after("acme", cluster, 0).await.unwrap();
        let seq3 = set.members[2].seq;
        let w = summary_write(cluster, (1, 1), set.version, "facts");
        assert!(s.write_cluster_summary("acme", w).await.unwrap());
        drop(s);
        back_before(&path, "memories_rank");
        // As an older version kept it: the ids of the first three.
        Connection::open(&path)
            .unwrap()
            .execute_batch(r#"UPDATE cluster_summaries SET sources = '["m1","m2","m3"]'"#)
            .unwrap();
        let s = SqliteStore::open(&path).unwrap();
        let sum = s.cluster_summary("acme", cluster).await.unwrap().unwrap();
        assert_eq!((sum.covered_seq, sum.covered), (seq3, 3));
        let newer = s
            .members_after("acme", cluster, sum.covered_seq)
            .await
            .unwrap();
        assert_eq!(newer.members.len(), 1);
        assert_eq!((newer.members[0].id.as_str(), newer.count), ("m4", 4));
    }

    /// Migration 33 moves memories and cluster summaries from WITHOUT ROWID tables to rowid
    /// tables: every row, plain or sealed, reads back the same, and recall finds them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_stored_before_the_index_are_indexed_in_batches_after_migration_34() {
        use crate::tables::IndexStore;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.db");
        let said = |i: usize, terms: &str| NewEpisode {
            terms: terms.into(),
            content: format!("m{i}"),
            source_key: format!("k{i}"),
            ..hi().remove(0)
        };
        {
            let s = SqliteStore::open(&path).unwrap();
            s.append_episodes("a", vec![said(1, "deploy key"), said(2, "garden")])
                .await
                .unwrap();
            view(&s, "acme")
                .append_episodes("b", vec![said(1, "deploy")])
                .await
                .unwrap();
        }
        back_before(&path, "sessions_unindexed");
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.unindexed().await.unwrap(), (2, 3));
        let deploy = vec!["deploy".to_string()];
        let m = s.search_episodes(None, None, &deploy, 10).await.unwrap();
        assert!(m.matches.is_empty(), "nothing indexed yet");
        // A message arriving meanwhile is indexed as it arrives; the catch-up skips it.
        s.append_episodes("a", vec![said(3, "deploy again")])
            .await
            .unwrap();
        while let Some((tenant, session)) = s.next_unindexed().await.unwrap() {
            let view = crate::AppStore::for_tenant(&s, &tenant);
            let eps = view.episodes_after(&session, 0, 100).await.unwrap();
            // The terms the guest would give for each message (here: the first words above).
            let docs: Vec<(u64, String)> = eps
                .iter()
                .map(|e| {
                    let t = match (session.as_str(), e.id) {
                        ("a", 1) => "deploy key",
                        ("a", 2) => "garden",
                        ("a", _) => "deploy again",
                        _ => "deploy",
                    };
                    (e.id, t.to_string())
                })
                .collect();
            view.index_episodes(&session, &docs, true).await.unwrap();
        }
        assert_eq!(s.unindexed().await.unwrap(), (0, 0));
        let m = s.search_episodes(None, None, &deploy, 10).await.unwrap();
        assert_eq!((m.docs, m.df.clone()), (3, vec![2]), "the local tenant's");
        let mut ids: Vec<u64> = m.matches.iter().map(|x| x.episode).collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 3]);
        let t = s
            .search_episodes(Some("acme"), None, &deploy, 10)
            .await
            .unwrap();
        assert_eq!((t.docs, t.matches.len()), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memories_stored_before_migration_36_are_current_and_stay_so() {
        use crate::recall::RecallStore;
        let dir = tempfile::tempdir().unwrap();
        for (path, key) in plain_and_sealed(dir.path(), "succession") {
            let open = || opened(&path, key.as_ref(), true);
            let s = open();
            s.put_memory("acme", fact("m0", "I live in Porto", &[1.0, 0.0], None))
                .await
                .unwrap();
            drop(s);
            back_before(&path, "memories_successor");
            let s = open();
            let m = s.get_memory("acme", "m0").await.unwrap().unwrap();
            assert_eq!(
                (m.supersedes, m.superseded_by, m.superseded_ms),
                (None, None, 0)
            );
            // It stated no fact key when it was written: a later fact does not find it.
            let later = crate::types::NewMemory {
                fact_key: "fact:lives in".into(),
                ..fact("m1", "I moved to Lyon", &[1.0, 0.0], Some(1))
            };
            let w = s.put_memory("acme", later).await.unwrap();
            assert_eq!(w.superseded, None);
            // Named, it is replaced.
            let named = crate::types::NewMemory {
                replaces: Some("m0".into()),
                ..fact("m2", "I moved to Oslo", &[1.0, 0.0], Some(1))
            };
            let w = s.put_memory("acme", named).await.unwrap();
            assert_eq!(w.superseded.as_deref(), Some("m0"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memories_stored_without_rowid_survive_migration_33() {
        use crate::recall::RecallStore;
        use crate::types::Memory;
        let dir = tempfile::tempdir().unwrap();
        for (path, key) in plain_and_sealed(dir.path(), "rowid") {
            let open = || opened(&path, key.as_ref(), true);
            let s = open();
            for (i, v) in [[1.0f32, 0.0], [0.9, 0.1], [0.0, 1.0]].iter().enumerate() {
                let text = format!("fact number {i}");
                let m = fact(&format!("m{i}"), &text, v, (i > 0).then_some(1));
                s.put_memory("acme", m).await.unwrap();
            }
            let set = s.members_after("acme", 1, 0).await.unwrap();
            let covered = (set.members.last().unwrap().seq, set.count);
            let w = summary_write(1, covered, set.version, "the facts");
            assert!(s.write_cluster_summary("acme", w).await.unwrap());
            let (before, _) = s
                .list_memories("acme", &Default::default(), 0, 10)
                .await
                .unwrap();
            drop(s);
            // Back to the layout before: both tables WITHOUT ROWID, as migration 16 made them.
            back_before(&path, "memories_rowid");
            let undo = MIGRATIONS[32]
                .replace("memories_rowid", "memories_old")
                .replace("cluster_summaries_rowid", "cluster_summaries_old")
                .replace(
                    "    PRIMARY KEY (tenant, id)\n);",
                    "    PRIMARY KEY (tenant, id)\n) WITHOUT ROWID;",
                );
            let c = Connection::open(&path).unwrap();
            c.execute_batch(&undo).unwrap();
            let layout = |c: &Connection| -> String {
                c.query_row(
                    "SELECT sql FROM sqlite_master WHERE name = 'memories'",
                    [],
                    |r| r.get(0),
                )
                .unwrap()
            };
            assert!(layout(&c).contains("WITHOUT ROWID"));
            drop(c);
            let s = open();
            let c = Connection::open(&path).unwrap();
            assert!(!layout(&c).contains("WITHOUT ROWID"), "migrated");
            let (after, _) = s
                .list_memories("acme", &Default::default(), 0, 10)
                .await
                .unwrap();
            let ids = |v: &[Memory]| {
                v.iter()
                    .map(|m| (m.id.clone(), m.text.clone(), m.seq))
                    .collect::<Vec<_>>()
            };
            assert_eq!(ids(&after), ids(&before));
            let sum = s.cluster_summary("acme", 1).await.unwrap().unwrap();
            assert_eq!(sum.text, "the facts");
            let hits = s
                .search("acme", &[1.0, 0.0], "emb", &Default::default(), 2)
                .await
                .unwrap();
            assert_eq!(hits[0].id, "m0");
            assert!(hits.iter().any(|h| h.text == "the facts"), "{hits:?}");
        }
    }

    /// Migration 27 fills in the running byte totals of episodes stored before it, plain or
    /// sealed (UTF-8 bytes of the text, not of what is on disk).
    #[tokio::test]
    async fn episodes_stored_before_migration_27_get_their_running_byte_totals() {
        let dir = tempfile::tempdir().unwrap();
        for (path, key) in plain_and_sealed(dir.path(), "old") {
            let sealed = key.is_some();
            let open = || opened(&path, key.as_ref(), false);
            let s = open();
            let texts = ["ab", "héllo €", "😀 x"];
            let eps = texts
                .iter()
                .enumerate()
                .map(|(i, t)| message(i + 1, t, 1, Some(i as i64)))
                .collect();
            s.append_episodes("a", eps).await.unwrap();
            drop(s);
            back_before(&path, "bytes_through");
            let s = open();
            let mut sum = 0;
            for (i, t) in texts.iter().enumerate() {
                sum += t.len() as u64;
                assert_eq!(
                    s.bytes_through("a", i as u64 + 1).await.unwrap(),
                    Some((sum, Some(i as i64))),
                    "sealed {sealed}, episode {}",
                    i + 1
                );
            }
        }
    }

    /// Migration 25 fills in the running token totals of episodes stored before it.
    #[tokio::test]
    async fn episodes_stored_before_migration_25_get_their_running_totals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let s = SqliteStore::open(&path).unwrap();
        for (session, tokens) in [("a", [3u32, 4, 5]), ("b", [7, 1, 2])] {
            let eps = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| message(i + 1, &format!("m{i}"), *t, None))
                .collect();
            s.append_episodes(session, eps).await.unwrap();
        }
        drop(s);
        // As a database written before migration 25 holds them.
        back_before(&path, "tokens_through");
        let s = SqliteStore::open(&path).unwrap();
        for (session, want) in [("a", [3u64, 7, 12]), ("b", [7, 8, 10])] {
            let got: Vec<u64> = s
                .episodes_after(session, 0, 10)
                .await
                .unwrap()
                .iter()
                .map(|e| e.tokens_through)
                .collect();
            assert_eq!(got, want, "{session}");
        }
    }
}
