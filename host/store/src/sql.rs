//! Transactions written once for both SQL stores: a body runs its statements through [`Tx`]
//! with the SQL in the store's [`Dialect`], and each store gives only its plumbing (running a
//! statement in its open transaction, its keys, and what it keeps beside a row). SQLite runs a
//! body inside its write transaction (the body never waits on anything but its statements,
//! which SQLite answers at once); PostgreSQL awaits it on its pooled connection.
//!
//! Every value crosses as a [`Val`]: the two schemas use 64-bit integers, doubles, text and
//! bytes for every column a body touches (`tests/schema.rs` keeps the tables alike).

use crate::keyring::{Stored, VectorKeys};
use crate::rules::Dialect;
use crate::search::Candidate;
use crate::types::{Error, Memory, MemoryFilter, Scope};

/// The vector columns, as named in a sealed vector's associated data.
pub(crate) const VECTOR: &str = "memories.vector";
pub(crate) const SUMMARY_VECTOR: &str = "cluster_summaries.vector";
pub(crate) const SUM: &str = "clusters.sum";

/// One SQL value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    /// NULL.
    Null,
    /// An integer.
    Int(i64),
    /// A double.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl From<&str> for Val {
    fn from(s: &str) -> Val {
        Val::Text(s.to_string())
    }
}

impl From<String> for Val {
    fn from(s: String) -> Val {
        Val::Text(s)
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Val {
        Val::Int(v)
    }
}

impl From<u64> for Val {
    fn from(v: u64) -> Val {
        Val::Int(v as i64)
    }
}

impl From<u32> for Val {
    fn from(v: u32) -> Val {
        Val::Int(i64::from(v))
    }
}

impl From<f32> for Val {
    fn from(v: f32) -> Val {
        Val::Real(f64::from(v))
    }
}

impl From<bool> for Val {
    fn from(v: bool) -> Val {
        Val::Int(i64::from(v))
    }
}

impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Val {
        v.map_or(Val::Null, Into::into)
    }
}

impl From<Vec<u8>> for Val {
    fn from(v: Vec<u8>) -> Val {
        Val::Bytes(v)
    }
}

/// One row of a query.
#[derive(Clone, Debug)]
pub(crate) struct Row(pub Vec<Val>);

impl Row {
    fn at(&self, i: usize) -> Result<&Val, Error> {
        self.0
            .get(i)
            .ok_or_else(|| Error::Storage(format!("the row has no column {i}")))
    }

    fn wrong(&self, i: usize, want: &str) -> Error {
        Error::Storage(format!("column {i} is {:?}, not {want}", self.0.get(i)))
    }

    /// Column `i` as an integer.
    pub fn int(&self, i: usize) -> Result<i64, Error> {
        match self.at(i)? {
            Val::Int(v) => Ok(*v),
            _ => Err(self.wrong(i, "an integer")),
        }
    }

    /// Column `i` as a non-negative integer.
    pub fn u64(&self, i: usize) -> Result<u64, Error> {
        self.int(i).map(|v| v as u64)
    }

    /// Column `i` as a double.
    pub fn real(&self, i: usize) -> Result<f64, Error> {
        match self.at(i)? {
            Val::Real(v) => Ok(*v),
            Val::Int(v) => Ok(*v as f64),
            _ => Err(self.wrong(i, "a number")),
        }
    }

    /// Column `i` as text.
    pub fn text(&self, i: usize) -> Result<String, Error> {
        match self.at(i)? {
            Val::Text(v) => Ok(v.clone()),
            _ => Err(self.wrong(i, "text")),
        }
    }

    /// Column `i` as an integer, or `None` for NULL.
    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, Error> {
        match self.at(i)? {
            Val::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    /// Column `i` as text, or `None` for NULL.
    pub fn opt_text(&self, i: usize) -> Result<Option<String>, Error> {
        match self.at(i)? {
            Val::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    /// Column `i` as bytes (a text value gives its UTF-8), or `None` for NULL.
    pub fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, Error> {
        match self.at(i)? {
            Val::Null => Ok(None),
            _ => self.bytes(i).map(Some),
        }
    }

    /// Column `i` as bytes (a text value gives its UTF-8).
    pub fn bytes(&self, i: usize) -> Result<Vec<u8>, Error> {
        match self.at(i)? {
            Val::Bytes(v) => Ok(v.clone()),
            Val::Text(v) => Ok(v.as_bytes().to_vec()),
            _ => Err(self.wrong(i, "bytes")),
        }
    }

    /// Column `i` as bytes, borrowed.
    pub fn blob(&self, i: usize) -> Result<&[u8], Error> {
        match self.at(i)? {
            Val::Bytes(v) => Ok(v),
            Val::Text(v) => Ok(v.as_bytes()),
            _ => Err(self.wrong(i, "bytes")),
        }
    }

    /// The scope in columns `at`.. `at + 4` (user, project, environment, kind, key).
    pub fn scope(&self, at: usize) -> Result<Scope, Error> {
        Ok(Scope {
            user: self.text(at)?,
            project: self.text(at + 1)?,
            environment: self.text(at + 2)?,
            kind: self.text(at + 3)?,
            key: self.text(at + 4)?,
        })
    }
}

/// A store's open transaction, as a body written once sees it. Its futures are `Send`, so a
/// body written once is a `Send` future on either store (the store traits' methods are).
///
/// SQL is written in PostgreSQL's spelling of parameters (`$1`, `$2`, …); SQLite's
/// transaction reads them as its own `?1`, `?2`, …. Where the dialects differ beyond that
/// ([`Tx::dialect`]), a body picks the statement.
pub(crate) trait Tx: Send {
    /// The dialect its SQL is written in.
    fn dialect(&self) -> Dialect;

    /// The rows of `sql` with `args`.
    fn rows(
        &mut self,
        sql: &str,
        args: &[Val],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    /// Run `sql` with `args`; the rows it changed.
    fn exec(&mut self, sql: &str, args: &[Val]) -> impl Future<Output = Result<u64, Error>> + Send;

    /// The tenant's vector keys.
    fn vector_keys(
        &mut self,
        tenant: &str,
    ) -> impl Future<Output = Result<VectorKeys, Error>> + Send;

    /// `text` as stored in `table`'s row `id`: sealed with the tenant's current data key when
    /// there is a master key; and the key's version (0: plain).
    fn seal(
        &mut self,
        tenant: &str,
        table: &str,
        id: &str,
        text: &str,
    ) -> impl Future<Output = Result<(Vec<u8>, u32), Error>> + Send;

    /// A stored text of `table`'s row `id`, opened.
    fn reveal(
        &mut self,
        tenant: &str,
        table: &str,
        id: &str,
        stored: Stored,
    ) -> impl Future<Output = Result<String, Error>> + Send;

    /// Before a write that changes the tenant's clusters: PostgreSQL takes the tenant's
    /// advisory lock (writers on several instances); SQLite's write transaction already holds
    /// the file.
    fn lock_clusters(&mut self, tenant: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Writers holding the same `key` take turns until they commit: PostgreSQL takes a
    /// transaction's advisory lock on it (writers on several instances); SQLite's write
    /// transaction already holds the file.
    fn take_turn(&mut self, key: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Tell `channel`'s listeners `payload` when the transaction commits (PostgreSQL's
    /// NOTIFY; a SQLite file has no listeners beside its one process, which polls).
    fn notify(
        &mut self,
        channel: &str,
        payload: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// After a memory's row is written: PostgreSQL keeps its vector's pgvector copy for the
    /// index; SQLite keeps nothing beside it.
    fn memory_written(
        &mut self,
        tenant: &str,
        id: &str,
        vector: &[f32],
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Each row of `sql` with `args`, one at a time (a scan of many rows is never held).
    fn each(
        &mut self,
        sql: &str,
        args: &[Val],
        f: &mut (dyn FnMut(&Row) -> Result<(), Error> + Send),
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The index's candidates for `query` among the tenant's memories of `model` that the
    /// filter (`filter_sql`: its fragment and arguments, the model last) selects, at least the
    /// best `limit`; `None` when the index does not answer (too few rows, being built, vectors
    /// sealed, or none on this store) and the search scans.
    #[allow(clippy::too_many_arguments)]
    fn indexed(
        &mut self,
        vk: &VectorKeys,
        tenant_model: (&str, &str),
        query: &[f32],
        filter: &MemoryFilter,
        filter_sql: (&str, &[Val]),
        limit: u32,
    ) -> impl Future<Output = Result<Option<Vec<Candidate>>, Error>> + Send;

    /// The tenant's lexical key (`RecallStore::lexical_key`), made on first use.
    fn lexical_key(
        &mut self,
        tenant: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, Error>> + Send;

    /// After a memory of the tenant was deleted in this transaction: SQLite counts the
    /// deletion (its vector graphs of other processes rebuild when the count moves past
    /// theirs) and gives the new count; PostgreSQL's index follows its rows (0).
    fn deleted(&mut self, tenant: &str) -> impl Future<Output = Result<u64, Error>> + Send;

    /// The first row of `sql` with `args`, if any.
    fn row(
        &mut self,
        sql: &str,
        args: &[Val],
    ) -> impl Future<Output = Result<Option<Row>, Error>> + Send {
        async move { Ok(self.rows(sql, args).await?.into_iter().next()) }
    }
}

/// A transaction a [`Backend`] opened: its statements are applied by [`Txn::commit`]; one
/// dropped before that (an error, a cancelled request) is rolled back.
pub(crate) trait Txn: Tx {
    /// Apply the transaction's statements.
    fn commit(self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Undo the transaction's statements now, its locks released before the next request
    /// (a dropped transaction is rolled back too, but without waiting for it).
    fn rollback(self) -> impl Future<Output = ()> + Send;
}

/// What a SQL store supplies beside its SQL: transactions. The store traits are written once
/// over it (`crate::once`): SQLite and PostgreSQL give only this, their migrations and their
/// index mechanisms.
pub(crate) trait Backend: Send + Sync {
    /// An open transaction.
    type Txn<'a>: Txn
    where
        Self: 'a;

    /// Open a transaction; a `write` one takes the store's write lock at once (SQLite's
    /// `BEGIN IMMEDIATE`), so two writers never both read and then both write.
    fn begin(&self, write: bool) -> impl Future<Output = Result<Self::Txn<'_>, Error>> + Send;

    /// Whether other processes write the same tables (PostgreSQL, shared by instances): their
    /// events reach this one through [`Backend::listen`].
    fn shared(&self) -> bool;

    /// After rows were deleted: SQLite copies its WAL into the file and truncates it, so the
    /// deleted rows' old page images leave the disk too; PostgreSQL's own vacuum does that.
    fn scrub(&self) -> impl Future<Output = ()> + Send;

    /// The payloads of notifications on `channel` ([`Tx::notify`]), when other processes
    /// send them.
    fn listen(&self, channel: &'static str)
    -> Option<tokio::sync::mpsc::UnboundedReceiver<String>>;

    /// A read that sees one snapshot across its statements (PostgreSQL: a repeatable-read,
    /// read-only transaction; SQLite's reader holds the connection, which no one writes
    /// meanwhile).
    fn snapshot(&self) -> impl Future<Output = Result<Self::Txn<'_>, Error>> + Send;

    /// What the database seals at rest.
    fn seals(&self) -> &crate::keyring::Sealing;

    /// The same, to set (see [`crate::Sql::with_master_key`]).
    fn seals_mut(&mut self) -> &mut crate::keyring::Sealing;

    /// Whether texts are sealed (a master key is set).
    fn sealing(&self) -> bool {
        self.seals().keys.is_some()
    }

    /// Load the saved vector indexes, so the first recalls do not wait (SQLite's graphs;
    /// PostgreSQL's index lives in the server): how many were loaded.
    fn warm(&self) -> impl Future<Output = Result<usize, Error>> + Send;

    /// After a memory's deletion committed (`mark`: [`Tx::deleted`]'s count): SQLite's
    /// graph of the tenant's `model` vectors drops it, and the deleted text leaves the WAL.
    fn memory_deleted(
        &self,
        tenant: &str,
        model: &str,
        id: &str,
        mark: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// After a tenant's memories, clusters and keys were deleted: the rows leave the disk
    /// (SQLite's WAL scrubbed and its graphs dropped; PostgreSQL vacuums the tables).
    fn tenant_forgotten(&self, tenant: &str) -> impl Future<Output = Result<(), Error>> + Send;
}

/// `sql` with PostgreSQL's parameters (`$1`) spelled as SQLite's (`?1`). A `$` inside a
/// quoted literal is left alone.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_params(sql: &str) -> std::borrow::Cow<'_, str> {
    if !sql.contains('$') {
        return std::borrow::Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '$' && !quoted && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The memory columns a [`memory_from`] row holds, in the dialect's spelling.
pub(crate) fn memory_cols(d: Dialect) -> String {
    format!(
        "id, {}, project, environment, kind, key, text, importance, tokens, created_ms, cluster, sealed, seq, supersedes, superseded_by, superseded_ms",
        d.user_column()
    )
}

/// A memory row of [`memory_cols`], its text still as stored.
pub(crate) fn memory_from(r: &Row) -> Result<(Memory, Stored), Error> {
    Ok((
        Memory {
            id: r.text(0)?,
            scope: r.scope(1)?,
            text: String::new(),
            importance: r.real(7)? as f32,
            tokens: r.int(8)? as u32,
            created_ms: r.u64(9)?,
            cluster: r.u64(10)?,
            seq: r.u64(12)?,
            supersedes: r.opt_text(13)?,
            superseded_by: r.opt_text(14)?,
            superseded_ms: r.u64(15)?,
        },
        Stored {
            bytes: r.bytes(6)?,
            sealed: r.int(11)? as u32,
        },
    ))
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::sqlite_params;

    #[test]
    fn postgres_parameters_read_as_sqlites_and_literals_keep_their_dollars() {
        assert_eq!(
            sqlite_params("SELECT a FROM t WHERE b = $1 AND c IN ($12, $2)"),
            "SELECT a FROM t WHERE b = ?1 AND c IN (?12, ?2)"
        );
        assert_eq!(
            sqlite_params("SELECT '$1 costs', x FROM t WHERE y = $1"),
            "SELECT '$1 costs', x FROM t WHERE y = ?1"
        );
        assert!(matches!(
            sqlite_params("SELECT 1"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
