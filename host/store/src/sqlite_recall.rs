//! SQLite's transactions ([`crate::sql::Backend`] for [`SqliteDb`]) and its index of
//! memory vectors: the in-process graph (`crate::ann`), saved in the database and followed as
//! rows change. `RecallStore` itself is written once (`crate::once`).

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params, params_from_iter};

use crate::rules::Dialect;
use crate::search::Candidate;
use crate::sql::{Row as SqlRow, Tx, VECTOR, Val};
use crate::sqlite::SqliteDb;
use crate::types::{Error, MemoryFilter, Scope};

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

use crate::keyring::{Stored, VectorKeys};

impl SqliteDb {
    /// The tenant's keys for its vectors in this call (see [`VectorKeys`]).
    fn vector_keys(&self, c: &Connection, tenant: &str) -> Result<VectorKeys, Error> {
        let Some(keys) = &self.sealing.keys else {
            return Ok(VectorKeys::plain(tenant));
        };
        if self.sealing.vectors {
            // Made on first use, like a data key for text.
            keys.current(c, tenant)?;
        }
        let versions: Vec<u32> = c
            .prepare_cached("SELECT version FROM data_keys WHERE tenant = ?1")
            .and_then(|mut st| st.query_map([tenant], |r| r.get(0))?.collect())
            .map_err(db_err)?;
        let mut all = std::collections::BTreeMap::new();
        for v in versions {
            all.insert(v, keys.key(c, tenant, v)?);
        }
        Ok(VectorKeys::new(tenant, all, self.sealing.vectors))
    }
}

/// The scope in columns `at`.. `at + 4` (user, project, environment, kind, key) of a row.
fn scope_from(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Scope> {
    Ok(Scope {
        user: r.get(at)?,
        project: r.get(at + 1)?,
        environment: r.get(at + 2)?,
        kind: r.get(at + 3)?,
        key: r.get(at + 4)?,
    })
}

impl SqliteDb {
    /// A tenant's lexical key (see `RecallStore::lexical_key`), read on an open connection.
    pub(crate) fn lexical_key_on(
        &self,
        c: &Connection,
        tenant: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        let Some(keys) = &self.sealing.keys else {
            return Ok(None);
        };
        let first: Option<u32> = c
            .query_row(
                "SELECT MIN(version) FROM data_keys WHERE tenant = ?1",
                [tenant],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        let k = match first {
            Some(v) => keys.key(c, tenant, v)?,
            None => keys.current(c, tenant)?.1,
        };
        Ok(Some(crate::keyring::lexical_key_of(&k)))
    }

    /// Bytes the full-text index holds: the hashed terms of each message (and its row's keys)
    /// and FTS5's blocks (what the scale bench reports per message).
    pub async fn index_bytes(&self) -> Result<u64, Error> {
        self.with(|c| {
            c.query_row(
                "SELECT (SELECT COALESCE(SUM(length(terms) + length(session) + 24), 0) FROM episode_terms) + (SELECT COALESCE(SUM(length(block)), 0) FROM episode_fts_data)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(db_err)
        })
    }
}

/// A transaction of the SQLite store, as the bodies written once ([`crate::sql`]) see it: the
/// store's connection, its lock held for the body, whose statements run at once. A write
/// transaction lasts until [`Txn::commit`] and is rolled back when dropped before it.
pub(crate) struct SqliteTxn<'a> {
    store: &'a SqliteDb,
    c: parking_lot::MutexGuard<'a, Connection>,
    open: bool,
}

impl SqliteTxn<'_> {}

impl SqliteDb {
    /// Open a transaction on the store's connection (see [`crate::sql::Backend::begin`]); the
    /// lock, and a write's `BEGIN IMMEDIATE`, are waited for as [`crate::sqlite::blocking`]
    /// waits.
    pub(crate) async fn begin_txn(&self, write: bool) -> Result<SqliteTxn<'_>, Error> {
        crate::count_call();
        let mut t = SqliteTxn {
            store: self,
            c: crate::sqlite::blocking(|| self.conn.lock()),
            open: false,
        };
        if write {
            crate::sqlite::blocking(|| t.c.execute_batch("BEGIN IMMEDIATE"))
                .map_err(|e| self.explained(e))?;
            t.open = true;
        }
        Ok(t)
    }
}

impl Drop for SqliteTxn<'_> {
    fn drop(&mut self) {
        if self.open {
            // Not committed (an error, or the caller went away): nothing of it stays.
            let _ = self.c.execute_batch("ROLLBACK");
        }
    }
}

impl SqliteTxn<'_> {
    /// Commit, keeping the connection (for what SQLite does after a commit).
    pub(crate) async fn commit_here(&mut self) -> Result<(), Error> {
        if self.open {
            crate::sqlite::blocking(|| self.c.execute_batch("COMMIT"))
                .map_err(|e| self.store.explained(e))?;
            self.open = false;
        }
        Ok(())
    }
}

impl crate::sql::Txn for SqliteTxn<'_> {
    async fn commit(mut self) -> Result<(), Error> {
        self.commit_here().await
    }

    async fn rollback(self) {
        // Dropping it rolls it back, at once.
        drop(self);
    }
}

impl crate::sql::Backend for SqliteDb {
    type Txn<'a> = SqliteTxn<'a>;

    async fn begin(&self, write: bool) -> Result<SqliteTxn<'_>, Error> {
        self.begin_txn(write).await
    }

    fn shared(&self) -> bool {
        false
    }

    async fn scrub(&self) {
        let _ = self.with(|c| {
            crate::sqlite::scrub(c);
            Ok(())
        });
    }

    async fn snapshot(&self) -> Result<SqliteTxn<'_>, Error> {
        self.begin_txn(false).await
    }

    fn seals(&self) -> &crate::keyring::Sealing {
        &self.sealing
    }

    fn seals_mut(&mut self) -> &mut crate::keyring::Sealing {
        &mut self.sealing
    }

    async fn warm(&self) -> Result<usize, Error> {
        if self.name == ":memory:" {
            return Ok(0);
        }
        let saved: Vec<(String, String, i64)> = self.with(|c| {
            c.prepare("SELECT tenant, model, dim FROM ann_graphs")
                .and_then(|mut st| {
                    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                        .collect()
                })
                .map_err(db_err)
        })?;
        let mut loaded = 0;
        // One graph at a time, each under the store's lock for its read only: requests go on
        // between them (a recall of a tenant not loaded yet loads its graph itself).
        for (tenant, model, dim) in saved {
            if self.ann.get(&tenant, &model).is_some() || self.ann.building(&tenant, &model) {
                continue;
            }
            let saved = self.with(|c| {
                if self.ann.get(&tenant, &model).is_some() {
                    return Ok(None);
                }
                let vk = self.vector_keys(c, &tenant)?;
                let (deletes, max_seq) = marks(c, &tenant)?;
                read_graph(c, &vk, (&tenant, &model), (deletes, max_seq, dim as usize))
            })?;
            // Loaded without the store's lock (rows written meanwhile are folded in at the
            // next recall, as for any graph).
            let t = match saved {
                Some(saved) => saved.load()?,
                None => None,
            };
            if let Some(t) = t
                && self.ann.get(&tenant, &model).is_none()
            {
                self.ann.put(&tenant, &model, t);
                loaded += 1;
            }
        }
        Ok(loaded)
    }

    async fn memory_deleted(
        &self,
        tenant: &str,
        model: &str,
        id: &str,
        mark: u64,
    ) -> Result<(), Error> {
        self.scrub().await;
        // This process's index follows at once (another process's rebuilds: the count).
        if let Some(i) = self.ann.get(tenant, model) {
            let mut g = crate::ann::locked(&i);
            if g.deletes + 1 == mark {
                g.remove(id)?;
                g.deletes = mark;
                // The saved graph went with the deletion: save this one anew.
                g.unsaved_whole();
            }
        }
        Ok(())
    }

    async fn tenant_forgotten(&self, tenant: &str) -> Result<(), Error> {
        self.scrub().await;
        self.ann.drop_tenant(tenant, None);
        Ok(())
    }

    fn listen(&self, _: &'static str) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        None
    }
}

fn val_in(v: rusqlite::types::ValueRef<'_>) -> Val {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => Val::Null,
        ValueRef::Integer(i) => Val::Int(i),
        ValueRef::Real(f) => Val::Real(f),
        ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Val::Bytes(b.to_vec()),
    }
}

fn val_out(v: &Val) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match v {
        Val::Null => Value::Null,
        Val::Int(i) => Value::Integer(*i),
        Val::Real(f) => Value::Real(*f),
        Val::Text(t) => Value::Text(t.clone()),
        Val::Bytes(b) => Value::Blob(b.clone()),
    }
}

impl Tx for SqliteTxn<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    async fn rows(&mut self, sql: &str, args: &[Val]) -> Result<Vec<SqlRow>, Error> {
        // A statement answers at once (the file's lock was taken by BEGIN): it runs in place;
        // only a scan ([`Tx::each`]) hands the worker's other tasks on meanwhile.
        let sql = crate::sql::sqlite_params(sql);
        let read = || -> Result<Vec<SqlRow>, rusqlite::Error> {
            let mut st = self.c.prepare_cached(&sql)?;
            let n = st.column_count();
            let mut rows = st.query(params_from_iter(args.iter().map(val_out)))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let mut row = Vec::with_capacity(n);
                for i in 0..n {
                    row.push(val_in(r.get_ref(i)?));
                }
                out.push(SqlRow(row));
            }
            Ok(out)
        };
        read().map_err(|e| self.store.explained(e))
    }

    async fn exec(&mut self, sql: &str, args: &[Val]) -> Result<u64, Error> {
        let sql = crate::sql::sqlite_params(sql);
        self.c
            .prepare_cached(&sql)
            .and_then(|mut st| st.execute(params_from_iter(args.iter().map(val_out))))
            .map(|n| n as u64)
            .map_err(|e| self.store.explained(e))
    }

    async fn vector_keys(&mut self, tenant: &str) -> Result<VectorKeys, Error> {
        self.store.vector_keys(&self.c, tenant)
    }

    async fn seal(
        &mut self,
        tenant: &str,
        table: &str,
        id: &str,
        text: &str,
    ) -> Result<(Vec<u8>, u32), Error> {
        self.store.seal(&self.c, tenant, table, id, text)
    }

    async fn reveal(
        &mut self,
        tenant: &str,
        table: &str,
        id: &str,
        stored: Stored,
    ) -> Result<String, Error> {
        self.store.reveal(&self.c, tenant, table, id, stored)
    }

    async fn each(
        &mut self,
        sql: &str,
        args: &[Val],
        f: &mut (dyn FnMut(&SqlRow) -> Result<(), Error> + Send),
    ) -> Result<(), Error> {
        let sql = crate::sql::sqlite_params(sql);
        let c = &*self.c;
        crate::sqlite::blocking(|| {
            let mut st = c.prepare_cached(&sql).map_err(db_err)?;
            let n = st.column_count();
            let mut rows = st
                .query(params_from_iter(args.iter().map(val_out)))
                .map_err(db_err)?;
            // One row's values, their buffers reused from row to row (a scan reads every vector).
            let mut row = SqlRow(vec![Val::Null; n]);
            while let Some(r) = rows.next().map_err(db_err)? {
                for (i, v) in row.0.iter_mut().enumerate() {
                    let got = r.get_ref(i).map_err(db_err)?;
                    match (got, &mut *v) {
                        (rusqlite::types::ValueRef::Blob(b), Val::Bytes(buf)) => {
                            buf.clear();
                            buf.extend_from_slice(b);
                        }
                        (got, v) => *v = val_in(got),
                    }
                }
                f(&row)?;
            }
            Ok(())
        })
        .map_err(|e| self.store.explain_err(e))
    }

    async fn indexed(
        &mut self,
        vk: &VectorKeys,
        at: (&str, &str),
        query: &[f32],
        filter: &MemoryFilter,
        _: (&str, &[Val]),
        limit: u32,
    ) -> Result<Option<Vec<Candidate>>, Error> {
        self.store
            .ann_memories(&self.c, vk, at, query, filter, limit)
    }

    async fn lock_clusters(&mut self, _: &str) -> Result<(), Error> {
        Ok(())
    }

    async fn lexical_key(&mut self, tenant: &str) -> Result<Option<Vec<u8>>, Error> {
        self.store.lexical_key_on(&self.c, tenant)
    }

    async fn deleted(&mut self, tenant: &str) -> Result<u64, Error> {
        mark_delete(&self.c, tenant)
    }

    async fn take_turn(&mut self, _: &str) -> Result<(), Error> {
        Ok(())
    }

    async fn notify(&mut self, _: &str, _: &str) -> Result<(), Error> {
        Ok(())
    }

    async fn memory_written(&mut self, _: &str, _: &str, _: &[f32]) -> Result<(), Error> {
        Ok(())
    }
}

/// Count one deletion (or re-embedding) of the tenant's memories; the new count. The saved
/// recall graphs go too: they hold the vector taken out.
fn mark_delete(c: &Connection, tenant: &str) -> Result<u64, Error> {
    c.execute("DELETE FROM ann_graphs WHERE tenant = ?1", [tenant])
        .map_err(db_err)?;
    c.query_row(
        "INSERT INTO memory_marks (tenant, deletes) VALUES (?1, 1) ON CONFLICT (tenant) DO UPDATE SET deletes = deletes + 1 RETURNING deletes",
        [tenant],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as u64)
    .map_err(db_err)
}

/// Rows as an index takes them: what it keeps of each memory, and its vector.
type IndexRows = Vec<(crate::ann::Meta, Vec<f32>)>;

/// The tenant's memories of `model` with `after < seq <= upto`, as an index takes them (their
/// vectors opened); `None` when one has another dimension than `dim` (the index cannot answer
/// for the model; the exact scan does).
fn index_rows(
    c: &Connection,
    vk: &VectorKeys,
    (tenant, model): (&str, &str),
    (after, upto): (u64, u64),
    dim: usize,
) -> Result<Option<IndexRows>, Error> {
    let mut st = c
        .prepare_cached(
            "SELECT id, user, project, environment, kind, key, importance, cluster, vector, seq FROM memories WHERE tenant = ?1 AND seq > ?2 AND seq <= ?4 AND model = ?3 ORDER BY seq",
        )
        .map_err(db_err)?;
    let mut rows = st
        .query(params![tenant, after as i64, model, upto as i64])
        .map_err(db_err)?;
    let mut batch = Vec::new();
    while let Some(r) = rows.next().map_err(db_err)? {
        let id: String = r.get(0).map_err(db_err)?;
        let blob = r
            .get_ref(8)
            .map_err(db_err)?
            .as_blob()
            .map_err(|e| Error::Storage(e.to_string()))?;
        let v = vk.open(VECTOR, &id, blob)?;
        if v.len() != dim {
            return Ok(None);
        }
        let meta = crate::ann::Meta {
            scope: scope_from(r, 1).map_err(db_err)?,
            importance: r.get::<_, f64>(6).map_err(db_err)? as f32,
            cluster: r.get::<_, i64>(7).map_err(db_err)? as u64,
            id,
        };
        batch.push((meta, v));
    }
    Ok(Some(batch))
}

/// Build `tenant`'s index of `model` (every row through `upto`, `deletes` as counted when it
/// started) on a thread of its own, with a read connection of its own to the file, and keep
/// it; searches meanwhile answer by the exact scan. A failure is logged and leaves no index
/// (the next search tries again).
fn build_in_background(
    path: std::path::PathBuf,
    ann: crate::ann::AnnIndexes,
    vk: VectorKeys,
    (tenant, model): (String, String),
    (upto, deletes, dim): (u64, u64, usize),
) {
    let (t, m, a) = (tenant.clone(), model.clone(), ann.clone());
    let undo = (tenant.clone(), model.clone(), ann.clone());
    let run = move || -> Result<(), Error> {
        let c = Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(db_err)?;
        c.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(db_err)?;
        let Some(rows) = index_rows(&c, &vk, (&tenant, &model), (0, upto), dim)? else {
            return Ok(());
        };
        let mut t = crate::ann::TenantIndex::new(dim)?;
        t.add_many(rows)?;
        t.seq = upto;
        t.deletes = deletes;
        let saved = t.saved()?;
        t.unsaved = None;
        ann.put(&tenant, &model, t);
        drop(c);
        save_graph(&path, &vk, (&tenant, &model), (upto, deletes, dim), saved)
    };
    let spawned = std::thread::Builder::new()
        .name("abridge-ann-build".into())
        .spawn(move || {
            if let Err(e) = run() {
                tracing::warn!(tenant = %t, model = %m, error = %e, "building the recall index failed; recall scans exactly and tries again later");
            }
            a.end_build(&t, &m);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to build the recall index; recall scans exactly");
        undo.2.end_build(&undo.0, &undo.1);
    }
}

/// Where a saved graph is sealed (its table and column).
const GRAPH: &str = "ann_graphs.graph";

/// Save `tenant`'s graph of `model` (through `seq`, reflecting `deletes`) with a connection of
/// its own, unless a deletion came since (the graph holds the vector taken out).
fn save_graph(
    path: &std::path::Path,
    vk: &VectorKeys,
    (tenant, model): (&str, &str),
    (seq, deletes, dim): (u64, u64, usize),
    saved: crate::ann::Saved,
) -> Result<(), Error> {
    let (graph, sealed) = vk.seal_bytes(GRAPH, model, saved.graph)?;
    let mut c = Connection::open(path).map_err(db_err)?;
    c.busy_timeout(std::time::Duration::from_secs(30))
        .map_err(db_err)?;
    c.pragma_update(None, "secure_delete", "ON")
        .map_err(db_err)?;
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db_err)?;
    let now: i64 = tx
        .query_row(
            "SELECT COALESCE((SELECT deletes FROM memory_marks WHERE tenant = ?1), 0)",
            [tenant],
            |r| r.get(0),
        )
        .map_err(db_err)?;
    if now as u64 != deletes {
        return Ok(());
    }
    tx.execute(
        "INSERT OR REPLACE INTO ann_graphs (tenant, model, seq, deletes, dim, graph, keys, sealed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![tenant, model, seq as i64, deletes as i64, dim as i64, graph, saved.keys, sealed],
    )
    .map_err(db_err)?;
    tx.commit().map_err(db_err)
}

/// Save a graph on a thread of its own (a failure is logged; the graph is saved again later).
fn save_in_background(
    path: std::path::PathBuf,
    vk: VectorKeys,
    (tenant, model): (String, String),
    at: (u64, u64, usize),
    saved: crate::ann::Saved,
) {
    let spawned = std::thread::Builder::new()
        .name("abridge-ann-save".into())
        .spawn(move || {
            if let Err(e) = save_graph(&path, &vk, (&tenant, &model), at, saved) {
                tracing::warn!(tenant = %tenant, model = %model, error = %e, "saving the recall index failed; a restart builds it again");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to save the recall index");
    }
}

/// A tenant's deletion count and newest memory sequence number: what a vector index must
/// reflect to be used.
fn marks(c: &Connection, tenant: &str) -> Result<(u64, u64), Error> {
    let max_seq: i64 = c
        .query_row(
            "SELECT COALESCE(MAX(seq), 0) FROM memories WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .map_err(db_err)?;
    let deletes: i64 = c
        .query_row(
            "SELECT deletes FROM memory_marks WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(db_err)?
        .unwrap_or(0);
    Ok((deletes as u64, max_seq as u64))
}

/// A saved graph as read from the database, not yet loaded (see [`GraphRow::load`]).
struct GraphRow {
    dim: usize,
    graph: Vec<u8>,
    keys: String,
    metas: std::collections::BTreeMap<String, crate::ann::Meta>,
    seq: u64,
    deletes: u64,
}

impl GraphRow {
    /// The graph loaded (`None` when it does not load, or a memory it holds is gone).
    fn load(self) -> Result<Option<crate::ann::TenantIndex>, Error> {
        let Some(mut t) =
            crate::ann::TenantIndex::restore(self.dim, &self.graph, &self.keys, self.metas)?
        else {
            return Ok(None);
        };
        t.seq = self.seq;
        t.deletes = self.deletes;
        Ok(Some(t))
    }
}

/// `tenant`'s saved graph of `model` when it holds no memory deleted since (`deletes`) and
/// nothing past `max_seq`: loaded, each key's memory read again from its row.
fn load_graph(
    c: &Connection,
    vk: &VectorKeys,
    at: (&str, &str),
    marks: (u64, u64, usize),
) -> Result<Option<crate::ann::TenantIndex>, Error> {
    match read_graph(c, vk, at, marks)? {
        Some(saved) => saved.load(),
        None => Ok(None),
    }
}

/// What [`load_graph`] reads: the saved graph (opened) and each key's memory's meta.
fn read_graph(
    c: &Connection,
    vk: &VectorKeys,
    (tenant, model): (&str, &str),
    (deletes, max_seq, dim): (u64, u64, usize),
) -> Result<Option<GraphRow>, Error> {
    let row = c
        .query_row(
            "SELECT seq, deletes, dim, graph, keys, sealed FROM ann_graphs WHERE tenant = ?1 AND model = ?2",
            [tenant, model],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, i64>(2)? as usize,
                    r.get::<_, Vec<u8>>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, u32>(5)?,
                ))
            },
        )
        .optional()
        .map_err(db_err)?;
    let Some((seq, was, d, graph, keys, sealed)) = row else {
        return Ok(None);
    };
    if was != deletes || seq > max_seq || d != dim {
        return Ok(None);
    }
    let graph = vk.open_bytes(GRAPH, model, sealed, &graph)?;
    let mut st = c
        .prepare_cached(
            "SELECT id, user, project, environment, kind, key, importance, cluster FROM memories WHERE tenant = ?1 AND model = ?2 AND seq <= ?3",
        )
        .map_err(db_err)?;
    let mut rows = st
        .query(params![tenant, model, seq as i64])
        .map_err(db_err)?;
    let mut metas = std::collections::BTreeMap::new();
    while let Some(r) = rows.next().map_err(db_err)? {
        let id: String = r.get(0).map_err(db_err)?;
        let meta = crate::ann::Meta {
            scope: scope_from(r, 1).map_err(db_err)?,
            importance: r.get::<_, f64>(6).map_err(db_err)? as f32,
            cluster: r.get::<_, i64>(7).map_err(db_err)? as u64,
            id: id.clone(),
        };
        metas.insert(id, meta);
    }
    Ok(Some(GraphRow {
        dim,
        graph,
        keys,
        metas,
        seq,
        deletes,
    }))
}

impl SqliteDb {
    /// Rank the tenant's memories of `model` through its vector index (see `ann.rs`): built on
    /// first need once the tenant holds [`crate::ann::ANN_MIN`] of them, rows written since it
    /// was last used folded in, rebuilt when another process deleted rows. A build (or a
    /// catch-up) of more than [`crate::ann::BUILD_INLINE`] rows runs on a thread of its own.
    /// `false` when the index cannot answer now (too small a tenant, a build under way): the
    /// caller scans exactly.
    #[allow(clippy::too_many_arguments)]
    fn ann_memories(
        &self,
        c: &Connection,
        vk: &VectorKeys,
        (tenant, model): (&str, &str),
        query: &[f32],
        filter: &MemoryFilter,
        limit: u32,
    ) -> Result<Option<Vec<Candidate>>, Error> {
        use crate::ann::{ANN_MIN, TenantIndex, locked};
        if self.ann.building(tenant, model) {
            return Ok(None);
        }
        let (deletes, max_seq) = marks(c, tenant)?;
        let mut current = self.ann.get(tenant, model).filter(|i| {
            let g = locked(i);
            g.deletes == deletes && g.seq <= max_seq
        });
        // None in this process yet: the graph saved by the last one, when it still holds.
        if current.is_none()
            && self.name != ":memory:"
            && let Some(t) = load_graph(c, vk, (tenant, model), (deletes, max_seq, query.len()))?
        {
            current = Some(self.ann.put(tenant, model, t));
        }
        // Rows the index lacks (all of them when there is none), counted only as far as the
        // decisions need: whether a build is worth it, and whether it is made here.
        let after = current.as_ref().map_or(0, |i| locked(i).seq);
        let enough = ANN_MIN.max(self.ann_inline).saturating_add(1);
        let missing: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM (SELECT 1 FROM memories WHERE tenant = ?1 AND seq > ?2 AND model = ?3 LIMIT ?4)",
                params![tenant, after as i64, model, i64::try_from(enough).unwrap_or(i64::MAX)],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        let missing = missing as usize;
        if current.is_none() && missing < ANN_MIN {
            self.ann.drop_tenant(tenant, Some(model));
            return Ok(None);
        }
        if missing > self.ann_inline && self.name != ":memory:" {
            if self.ann.start_build(tenant, model) {
                build_in_background(
                    std::path::PathBuf::from(&self.name),
                    self.ann.clone(),
                    vk.clone(),
                    (tenant.to_string(), model.to_string()),
                    (max_seq, deletes, query.len()),
                );
            }
            return Ok(None);
        }
        let index = match current {
            Some(i) => i,
            None => {
                let mut t = TenantIndex::new(query.len())?;
                t.deletes = deletes;
                t.unsaved_whole();
                self.ann.put(tenant, model, t)
            }
        };
        let mut g = locked(&index);
        if g.seq < max_seq {
            let Some(batch) = index_rows(c, vk, (tenant, model), (g.seq, max_seq), query.len())?
            else {
                drop(g);
                self.ann.drop_tenant(tenant, Some(model));
                return Ok(None);
            };
            let n = batch.len();
            g.add_many(batch)?;
            g.seq = max_seq;
            g.changed(n);
        }
        if g.save_due() && self.name != ":memory:" {
            let saved = g.saved()?;
            g.unsaved = None;
            save_in_background(
                std::path::PathBuf::from(&self.name),
                vk.clone(),
                (tenant.to_string(), model.to_string()),
                (g.seq, g.deletes, query.len()),
                saved,
            );
        }
        let found = g.search(query, filter, limit as usize)?;
        Ok(Some(
            found
                .into_iter()
                .map(|(similarity, m)| Candidate {
                    similarity,
                    id: m.id.clone(),
                    importance: m.importance,
                    cluster: m.cluster,
                })
                .collect(),
        ))
    }
}
