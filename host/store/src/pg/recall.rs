//! PostgreSQL's transactions ([`crate::sql::Backend`] for [`PgDb`]): its keys, sealing the
//! same way as SQLite's, and its locks. Writes that change a tenant's clusters take the
//! tenant's advisory lock first ([`Tx::lock_clusters`]), so the cluster rules (incremental
//! sums, one summary covering exactly its members, dense ids) hold with writers on several
//! instances. `RecallStore` itself is written once (`crate::once`).
//!
//! Recall asks pgvector's index when the server has the extension (`ann.rs`), else (and
//! whenever the index cannot answer fully) scans the tenant's vectors exactly, the same
//! ranking as SQLite's.

use std::sync::Arc;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::{LOCK, P, PgDb, g32, g64};
use crate::crypto::Secret;
use crate::keyring::{Revealed, Sealer, Stored, VectorKeys, now_ms, open_under};
use crate::rules::Dialect;
use crate::search::Candidate;
use crate::sql::{Row as SqlRow, Tx, Val};
use crate::types::{Error, MemoryFilter};

impl PgDb {
    /// A tenant's lexical key (see `RecallStore::lexical_key`), read on `c`.
    pub(super) async fn lexical_key_on<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        if self.sealing.keys.is_none() {
            return Ok(None);
        }
        let first: Option<i64> = c
            .query_one(
                "SELECT MIN(version) FROM data_keys WHERE tenant = $1",
                &[&tenant],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        let v = match first {
            Some(v) => v as u32,
            None => {
                // Made on first use, like a data key for sealing.
                self.sealer(c, tenant).await?;
                1
            }
        };
        let k = self.data_key(c, tenant, v).await?;
        Ok(Some(crate::keyring::lexical_key_of(&k)))
    }

    async fn data_key<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        version: u32,
    ) -> Result<Arc<Secret>, Error> {
        let keys = self.sealing.keys.as_ref().expect("called with a keyring");
        if let Some(k) = keys.cached(tenant, version) {
            return Ok(k);
        }
        let wrapped = c
            .query_opt(
                "SELECT wrapped FROM data_keys WHERE tenant = $1 AND version = $2",
                &[&tenant, &i64::from(version)],
            )
            .await
            .map_err(|e| self.err(e))?
            .map(|r| r.get::<_, Vec<u8>>(0));
        keys.admit(tenant, version, wrapped)
    }

    /// The bytes and key version to store `text` under (sealed when a master key is set).
    async fn seal<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        table: &str,
        row: &str,
        text: &str,
    ) -> Result<(Vec<u8>, u32), Error> {
        self.sealer(c, tenant).await?.seal(table, row, text)
    }

    /// `tenant`'s current data key (made on first use) for sealing a batch of rows; plain
    /// without a master key.
    pub(super) async fn sealer<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
    ) -> Result<Sealer, Error> {
        let Some(keys) = &self.sealing.keys else {
            return Ok(Sealer::new(tenant, None));
        };
        let newest: Option<i64> = c
            .query_one(
                "SELECT MAX(version) FROM data_keys WHERE tenant = $1",
                &[&tenant],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        let v = match newest {
            Some(v) => v as u32,
            None => {
                let wrapped = keys.new_wrapped(tenant, 1)?;
                c.execute(
                    "INSERT INTO data_keys (tenant, version, wrapped, created_ms) VALUES ($1, 1, $2, $3) ON CONFLICT DO NOTHING",
                    &[&tenant, &wrapped, &(now_ms() as i64)],
                )
                .await
                .map_err(|e| self.err(e))?;
                // Another writer may have made it first: what is stored is read back.
                1
            }
        };
        let k = self.data_key(c, tenant, v).await?;
        Ok(Sealer::new(tenant, Some((v, k))))
    }

    pub(super) async fn reveal<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        table: &str,
        row: &str,
        s: Stored,
    ) -> Result<String, Error> {
        match crate::keyring::reveal(self.sealing.keys.as_ref(), table, row, s)? {
            Revealed::Text(t) => Ok(t),
            Revealed::Sealed { bytes, version, .. } => {
                let k = self.data_key(c, tenant, version).await?;
                open_under(&k, version, tenant, table, row, &bytes)
            }
        }
    }

    /// The tenant's keys for its vectors in this call (see [`VectorKeys`]).
    pub(super) async fn vector_keys<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
    ) -> Result<VectorKeys, Error> {
        if self.sealing.keys.is_none() {
            return Ok(VectorKeys::plain(tenant));
        }
        if self.sealing.vectors {
            // Made on first use, like a data key for text.
            self.sealer(c, tenant).await?;
        }
        let versions = c
            .query(
                "SELECT version FROM data_keys WHERE tenant = $1",
                &[&tenant],
            )
            .await
            .map_err(|e| self.err(e))?;
        let mut all = std::collections::BTreeMap::new();
        for r in &versions {
            let v = g64(r, 0) as u32;
            all.insert(v, self.data_key(c, tenant, v).await?);
        }
        Ok(VectorKeys::new(tenant, all, self.sealing.vectors))
    }

    /// Rotate the master key (see [`crate::SqliteStore::rotate_master_key`]).
    pub async fn rotate_master_key(&self, new: &Secret) -> Result<usize, Error> {
        let keys = self.sealing.keys.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "no current master key is set: set ABRIDGE_MASTER_KEY_FILE to the key the database was written with".into(),
            )
        })?;
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        tx.execute("LOCK TABLE data_keys IN EXCLUSIVE MODE", &[])
            .await
            .map_err(|e| self.err(e))?;
        let rows = tx
            .query("SELECT tenant, version, wrapped FROM data_keys", &[])
            .await
            .map_err(|e| self.err(e))?;
        let mut newest: std::collections::BTreeMap<String, u32> = Default::default();
        for r in &rows {
            let (tenant, version, wrapped): (String, u32, Vec<u8>) =
                (r.get(0), g32(r, 1), r.get(2));
            let re = keys.rewrapped(new, &tenant, version, &wrapped)?;
            tx.execute(
                "UPDATE data_keys SET wrapped = $3 WHERE tenant = $1 AND version = $2",
                &[&tenant, &i64::from(version), &re],
            )
            .await
            .map_err(|e| self.err(e))?;
            let e = newest.entry(tenant).or_default();
            *e = (*e).max(version);
        }
        for (tenant, v) in &newest {
            let w = crate::keyring::new_wrapped_under(new, tenant, v + 1)?;
            tx.execute(
                "INSERT INTO data_keys (tenant, version, wrapped, created_ms) VALUES ($1, $2, $3, $4)",
                &[tenant, &i64::from(v + 1), &w, &(now_ms() as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        keys.forget();
        Ok(newest.len())
    }
}

impl PgDb {
    async fn lock_tenant<C: GenericClient + Sync>(&self, c: &C, tenant: &str) -> Result<(), Error> {
        c.execute(LOCK, &[&format!("clusters:{tenant}")])
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// A value as a PostgreSQL parameter: the two schemas' columns are BIGINT, DOUBLE
/// PRECISION, TEXT and BYTEA, which these carry as they are.
impl tokio_postgres::types::ToSql for Val {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::Null => Ok(tokio_postgres::types::IsNull::Yes),
            Val::Int(v) if *ty == tokio_postgres::types::Type::INT4 => {
                i32::try_from(*v)?.to_sql(ty, out)
            }
            Val::Int(v) => v.to_sql(ty, out),
            Val::Real(v) if *ty == tokio_postgres::types::Type::FLOAT4 => {
                (*v as f32).to_sql(ty, out)
            }
            Val::Real(v) => v.to_sql(ty, out),
            Val::Text(v) => v.to_sql(ty, out),
            Val::Bytes(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A PostgreSQL row's column as a value, by its type.
fn val_at(r: &Row, i: usize) -> Result<Val, Error> {
    use tokio_postgres::types::Type;
    let ty = r.columns()[i].type_().clone();
    let bad = |e: tokio_postgres::Error| Error::Storage(format!("column {i}: {e}"));
    Ok(match ty {
        Type::INT8 => r
            .try_get::<_, Option<i64>>(i)
            .map_err(bad)?
            .map_or(Val::Null, Val::Int),
        Type::INT4 => r
            .try_get::<_, Option<i32>>(i)
            .map_err(bad)?
            .map_or(Val::Null, |v| Val::Int(i64::from(v))),
        Type::BOOL => r
            .try_get::<_, Option<bool>>(i)
            .map_err(bad)?
            .map_or(Val::Null, |v| Val::Int(i64::from(v))),
        Type::FLOAT8 => r
            .try_get::<_, Option<f64>>(i)
            .map_err(bad)?
            .map_or(Val::Null, Val::Real),
        Type::BYTEA => r
            .try_get::<_, Option<Vec<u8>>>(i)
            .map_err(bad)?
            .map_or(Val::Null, Val::Bytes),
        _ => r
            .try_get::<_, Option<String>>(i)
            .map_err(bad)?
            .map_or(Val::Null, Val::Text),
    })
}

/// The PostgreSQL store's open transaction for the bodies written once ([`crate::sql`]): its
/// statements on `c`, a transaction a caller holds (`&Transaction`) or one
/// [`Backend::begin`](crate::sql::Backend::begin) opened ([`PgTxn`]).
pub(crate) struct PgTx<'a, C> {
    store: &'a PgDb,
    c: C,
}

impl<C> Tx for PgTx<'_, C>
where
    C: std::ops::Deref + Send + Sync,
    C::Target: GenericClient + Sync + Sized,
{
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn rows(&mut self, sql: &str, args: &[Val]) -> Result<Vec<SqlRow>, Error> {
        let params: Vec<P<'_>> = args.iter().map(|a| a as P<'_>).collect();
        let rows = self
            .c
            .query(sql, &params)
            .await
            .map_err(|e| self.store.err(e))?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| val_at(r, i))
                    .collect::<Result<_, _>>()
                    .map(SqlRow)
            })
            .collect()
    }

    async fn exec(&mut self, sql: &str, args: &[Val]) -> Result<u64, Error> {
        let params: Vec<P<'_>> = args.iter().map(|a| a as P<'_>).collect();
        self.c
            .execute(sql, &params)
            .await
            .map_err(|e| self.store.err(e))
    }

    async fn vector_keys(&mut self, tenant: &str) -> Result<VectorKeys, Error> {
        self.store.vector_keys(&*self.c, tenant).await
    }

    async fn seal(
        &mut self,
        tenant: &str,
        table: &str,
        id: &str,
        text: &str,
    ) -> Result<(Vec<u8>, u32), Error> {
        self.store.seal(&*self.c, tenant, table, id, text).await
    }

    async fn reveal(
        &mut self,
        tenant: &str,
        table: &str,
        id: &str,
        stored: Stored,
    ) -> Result<String, Error> {
        self.store.reveal(&*self.c, tenant, table, id, stored).await
    }

    async fn each(
        &mut self,
        sql: &str,
        args: &[Val],
        f: &mut (dyn FnMut(&SqlRow) -> Result<(), Error> + Send),
    ) -> Result<(), Error> {
        for r in self.rows(sql, args).await? {
            f(&r)?;
        }
        Ok(())
    }

    async fn indexed(
        &mut self,
        _: &VectorKeys,
        (_, model): (&str, &str),
        query: &[f32],
        _: &MemoryFilter,
        (fsql, args): (&str, &[Val]),
        limit: u32,
    ) -> Result<Option<Vec<Candidate>>, Error> {
        // Sealed vectors have no pgvector copy: search scans and opens them.
        if self.store.sealing.vectors {
            return Ok(None);
        }
        // The index query names the model itself: the filter's arguments without it.
        let args = &args[..args.len() - 1];
        let found = self
            .store
            .ann_search(&*self.c, query, model, fsql, args, limit)
            .await;
        Ok(found.map(|found| {
            found
                .into_iter()
                .map(|(id, importance, cluster, similarity)| Candidate {
                    similarity,
                    id,
                    importance,
                    cluster,
                })
                .collect()
        }))
    }

    async fn lock_clusters(&mut self, tenant: &str) -> Result<(), Error> {
        self.store.lock_tenant(&*self.c, tenant).await
    }

    async fn lexical_key(&mut self, tenant: &str) -> Result<Option<Vec<u8>>, Error> {
        self.store.lexical_key_on(&*self.c, tenant).await
    }

    async fn deleted(&mut self, _: &str) -> Result<u64, Error> {
        Ok(0)
    }

    async fn take_turn(&mut self, key: &str) -> Result<(), Error> {
        self.c
            .execute(LOCK, &[&key])
            .await
            .map(drop)
            .map_err(|e| self.store.err(e))
    }

    async fn notify(&mut self, channel: &str, payload: &str) -> Result<(), Error> {
        self.c
            .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
            .await
            .map(drop)
            .map_err(|e| self.store.err(e))
    }

    async fn memory_written(
        &mut self,
        tenant: &str,
        id: &str,
        vector: &[f32],
    ) -> Result<(), Error> {
        self.store
            .set_embedding(&*self.c, tenant, id, vector)
            .await
            .map(drop)
    }
}

/// The pooled connection a transaction of [`Backend::begin`](crate::sql::Backend::begin)
/// holds, inside `BEGIN` when it writes. Dropped before its commit, it is rolled back on its
/// own connection, which then goes back to the pool (without a runtime to do that, the
/// connection leaves the pool and closes, and the server rolls back when it notices).
pub(crate) struct Held {
    c: Option<deadpool_postgres::Object>,
    open: bool,
}

impl std::ops::Deref for Held {
    type Target = deadpool_postgres::Object;

    fn deref(&self) -> &deadpool_postgres::Object {
        self.c
            .as_ref()
            .expect("a transaction keeps its connection until it ends")
    }
}

impl Held {
    /// Roll back now when still open; the connection goes back to the pool (or leaves it when
    /// the rollback fails).
    async fn roll_back(&mut self) {
        if self.open
            && let Some(c) = self.c.take()
        {
            self.open = false;
            if c.batch_execute("ROLLBACK").await.is_err() {
                drop(deadpool_postgres::Object::take(c));
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.open
            && let Some(c) = self.c.take()
        {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn(async move {
                        if c.batch_execute("ROLLBACK").await.is_err() {
                            drop(deadpool_postgres::Object::take(c));
                        }
                    });
                }
                Err(_) => drop(deadpool_postgres::Object::take(c)),
            }
        }
    }
}

/// A transaction of [`PgStore`]'s [`Backend::begin`](crate::sql::Backend::begin).
pub(crate) type PgTxn<'a> = PgTx<'a, Held>;

impl crate::sql::Txn for PgTxn<'_> {
    async fn rollback(mut self) {
        self.c.roll_back().await;
    }

    async fn commit(mut self) -> Result<(), Error> {
        if self.c.open {
            self.c
                .batch_execute("COMMIT")
                .await
                .map_err(|e| self.store.err(e))?;
            self.c.open = false;
        }
        Ok(())
    }
}

impl crate::sql::Backend for PgDb {
    type Txn<'a> = PgTxn<'a>;

    async fn begin(&self, write: bool) -> Result<PgTxn<'_>, Error> {
        let c = self.client().await?;
        if write {
            c.batch_execute("BEGIN").await.map_err(|e| self.err(e))?;
        }
        Ok(PgTx {
            store: self,
            c: Held {
                c: Some(c),
                open: write,
            },
        })
    }

    fn shared(&self) -> bool {
        true
    }

    async fn scrub(&self) {}

    async fn snapshot(&self) -> Result<PgTxn<'_>, Error> {
        let c = self.client().await?;
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|e| self.err(e))?;
        Ok(PgTx {
            store: self,
            c: Held {
                c: Some(c),
                open: true,
            },
        })
    }

    fn seals(&self) -> &crate::keyring::Sealing {
        &self.sealing
    }

    fn seals_mut(&mut self) -> &mut crate::keyring::Sealing {
        &mut self.sealing
    }

    async fn warm(&self) -> Result<usize, Error> {
        Ok(0)
    }

    async fn memory_deleted(&self, _: &str, _: &str, _: &str, _: u64) -> Result<(), Error> {
        Ok(())
    }

    async fn tenant_forgotten(&self, _: &str) -> Result<(), Error> {
        // Deleted rows stay in the table files as dead tuples until VACUUM reclaims their
        // space (new rows then overwrite it; VACUUM FULL rewrites the files at once, under an
        // exclusive lock). A tenant's deletion is rare: vacuum what held its text now.
        self.client()
            .await?
            .batch_execute(
                "VACUUM episodes, episode_terms, summaries, partials, events, session_focus, session_labels, memories, cluster_summaries, clusters, data_keys",
            )
            .await
            .map_err(|e| self.err(e))
    }

    fn listen(
        &self,
        channel: &'static str,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        Some(PgDb::listen(self, channel))
    }
}
