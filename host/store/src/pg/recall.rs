//! [`RecallStore`] in PostgreSQL: memories, clusters and cluster summaries, sealed at rest
//! the same way as in SQLite. Writes that change a tenant's clusters take the tenant's
//! advisory lock first, so the cluster rules (incremental sums, one summary covering exactly
//! its members, dense ids) hold with writers on several instances.
//!
//! Recall asks pgvector's index when the server has the extension (`ann.rs`), else (and
//! whenever the index cannot answer fully) scans the tenant's vectors exactly, the same
//! ranking as SQLite's.

use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::{LOCK, P, PgDb, PgStore, g32, g64};
use crate::crypto::Secret;
use crate::keyring::{Revealed, Sealer, Stored, VectorKeys, now_ms, open_under};
use crate::recall::{ClusterRow, RecallStore, Unsettled, UsageDay, month_of_day};
use crate::rules::{self, Dialect};
use crate::search::Candidate;
use crate::sql::{Row as SqlRow, SUM, Tx, Val};
use crate::types::{
    Centroid, ClusterSummary, ClusterSummaryWrite, Error, Hit, MemberSet, Memory, MemoryFilter,
    NewMemory, Scope, StoredMemory,
};

impl PgDb {
    /// A tenant's lexical key (see `RecallStore::lexical_key`), read on `c`.
    pub(super) async fn lexical_key_on<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        if self.keys.is_none() {
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
        let keys = self.keys.as_ref().expect("called with a keyring");
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
        let Some(keys) = &self.keys else {
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
        match crate::keyring::reveal(self.keys.as_ref(), table, row, s)? {
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
        if self.keys.is_none() {
            return Ok(VectorKeys::plain(tenant));
        }
        if self.seal_vectors {
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
        Ok(VectorKeys::new(tenant, all, self.seal_vectors))
    }

    async fn memories_revealed<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        rows: Vec<(Memory, Stored)>,
    ) -> Result<Vec<Memory>, Error> {
        let mut out = Vec::with_capacity(rows.len());
        for (mut m, s) in rows {
            m.text = self.reveal(c, tenant, "memories", &m.id, s).await?;
            out.push(m);
        }
        Ok(out)
    }

    async fn summary_revealed<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        (mut s, st): (ClusterSummary, Stored),
    ) -> Result<ClusterSummary, Error> {
        s.text = self
            .reveal(c, tenant, "cluster_summaries", &s.id.to_string(), st)
            .await?;
        Ok(s)
    }

    /// Rotate the master key (see [`crate::SqliteStore::rotate_master_key`]).
    pub async fn rotate_master_key(&self, new: &Secret) -> Result<usize, Error> {
        let keys = self.keys.as_ref().ok_or_else(|| {
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

/// The filter's `WHERE` fragment in PostgreSQL's dialect (see [`rules::filter_sql`]).
fn filter_sql(tenant: &str, f: &MemoryFilter, prefix: &str) -> (String, Vec<String>) {
    rules::filter_sql(Dialect::Postgres, tenant, f, prefix)
}

fn params(args: &[String]) -> Vec<P<'_>> {
    args.iter().map(|a| a as P<'_>).collect()
}

const MEM_COLS: &str = "id, \"user\", project, environment, kind, key, text, importance, tokens, created_ms, cluster, sealed, seq";

fn scope_from(r: &Row) -> Scope {
    scope_at(r, 1)
}

/// The scope in columns `at`.. `at + 4` (user, project, environment, kind, key) of a row.
fn scope_at(r: &Row, at: usize) -> Scope {
    Scope {
        user: r.get(at),
        project: r.get(at + 1),
        environment: r.get(at + 2),
        kind: r.get(at + 3),
        key: r.get(at + 4),
    }
}

fn memory_from(r: &Row) -> (Memory, Stored) {
    (
        Memory {
            id: r.get(0),
            scope: scope_from(r),
            text: String::new(),
            importance: r.get::<_, f64>(7) as f32,
            tokens: g32(r, 8),
            created_ms: g64(r, 9),
            cluster: g64(r, 10),
            seq: g64(r, 12),
        },
        Stored {
            bytes: r.get(6),
            sealed: g32(r, 11),
        },
    )
}

const SUM_COLS: &str = "id, cluster, text, member_hash, covered_seq, covered, importance, tokens, model, calls, prompt_tokens, output_tokens, created_ms, updated_ms, sealed";

fn summary_from(r: &Row) -> (ClusterSummary, Stored) {
    (
        ClusterSummary {
            id: g64(r, 0),
            cluster: g64(r, 1),
            text: String::new(),
            member_hash: r.get(3),
            covered_seq: g64(r, 4),
            covered: g32(r, 5),
            importance: r.get::<_, f64>(6) as f32,
            tokens: g32(r, 7),
            model: r.get(8),
            calls: g32(r, 9),
            prompt_tokens: g32(r, 10),
            output_tokens: g32(r, 11),
            created_ms: g64(r, 12),
            updated_ms: g64(r, 13),
        },
        Stored {
            bytes: r.get(2),
            sealed: g32(r, 14),
        },
    )
}

impl PgDb {
    /// A cluster's members with `seq > after`, oldest first (the `memories_cluster` index).
    async fn members_raw<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        cluster: u64,
        after: u64,
    ) -> Result<Vec<(Memory, Stored)>, Error> {
        Ok(c.query(
            &format!(
                "SELECT {MEM_COLS} FROM memories WHERE tenant = $1 AND cluster = $2 AND seq > $3 ORDER BY seq"
            ),
            &[&tenant, &(cluster as i64), &rules::seq_arg(after)],
        )
        .await
        .map_err(|e| self.err(e))?
        .iter()
        .map(memory_from)
        .collect())
    }

    async fn summary_raw<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<(ClusterSummary, Stored)>, Error> {
        Ok(c.query_opt(
            &format!("SELECT {SUM_COLS} FROM cluster_summaries WHERE tenant = $1 AND cluster = $2"),
            &[&tenant, &(cluster as i64)],
        )
        .await
        .map_err(|e| self.err(e))?
        .as_ref()
        .map(summary_from))
    }

    async fn lock_tenant<C: GenericClient + Sync>(&self, c: &C, tenant: &str) -> Result<(), Error> {
        c.execute(LOCK, &[&format!("clusters:{tenant}")])
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// A cluster's membership version (`None`: no such cluster) and member count.
    async fn cluster_figures<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<(u64, u32)>, Error> {
        Ok(c.query_opt(
            "SELECT version, members FROM clusters WHERE tenant = $1 AND id = $2",
            &[&tenant, &(cluster as i64)],
        )
        .await
        .map_err(|e| self.err(e))?
        .map(|r| (g64(&r, 0), g32(&r, 1))))
    }
}

#[async_trait]
impl RecallStore for PgStore {
    async fn centroids(&self, tenant: &str, scope: &Scope) -> Result<Vec<Centroid>, Error> {
        let c = self.client().await?;
        let vk = self.vector_keys(&c, tenant).await?;
        c.query(
            "SELECT id, model, sum, members FROM clusters WHERE tenant = $1 AND \"user\" = $2 AND project = $3 AND environment = $4 AND kind = $5 AND key = $6 AND members > 0 ORDER BY id",
            &[&tenant, &scope.user, &scope.project, &scope.environment, &scope.kind, &scope.key],
        )
        .await
        .map_err(|e| self.err(e))?
        .iter()
        .map(|r| {
            let n = g32(r, 3);
            let id = g64(r, 0);
            let sum = vk.open(SUM, &id.to_string(), &r.get::<_, Vec<u8>>(2))?;
            Ok(Centroid {
                cluster: id,
                model: r.get(1),
                vector: rules::centroid(&sum, n),
                members: n,
            })
        })
        .collect()
    }

    async fn put_memory(&self, tenant: &str, m: NewMemory) -> Result<StoredMemory, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        let stored = {
            let mut t = PgTx {
                store: self,
                c: &tx,
            };
            crate::writes::put_memory(&mut t, tenant, m).await?
        };
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(stored)
    }

    async fn get_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        let c = self.client().await?;
        let raw = c
            .query_opt(
                &format!("SELECT {MEM_COLS} FROM memories WHERE tenant = $1 AND id = $2"),
                &[&tenant, &id],
            )
            .await
            .map_err(|e| self.err(e))?;
        Ok(self
            .memories_revealed(&c, tenant, raw.iter().map(memory_from).collect())
            .await?
            .pop())
    }

    async fn cluster_members(&self, tenant: &str, cluster: u64) -> Result<Vec<Memory>, Error> {
        let c = self.client().await?;
        let raw = self.members_raw(&c, tenant, cluster, 0).await?;
        self.memories_revealed(&c, tenant, raw).await
    }

    async fn members_after(
        &self,
        tenant: &str,
        cluster: u64,
        after: u64,
    ) -> Result<MemberSet, Error> {
        let mut c = self.client().await?;
        // One snapshot: the figures and the rows agree.
        let tx = c
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| self.err(e))?;
        let Some((version, count)) = self.cluster_figures(&tx, tenant, cluster).await? else {
            return Ok(MemberSet {
                version: 0,
                count: 0,
                members: Vec::new(),
            });
        };
        let raw = self.members_raw(&tx, tenant, cluster, after).await?;
        let members = self.memories_revealed(&tx, tenant, raw).await?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(MemberSet {
            version,
            count,
            members,
        })
    }

    async fn top_members(
        &self,
        tenant: &str,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<Memory>, Error> {
        let c = self.client().await?;
        // The `memories_rank` index: a page costs what it returns (plus the offset).
        let raw: Vec<(Memory, Stored)> = c
            .query(
                &format!(
                    "SELECT {MEM_COLS} FROM memories WHERE tenant = $1 AND cluster = $2 ORDER BY importance DESC, created_ms, id LIMIT $3 OFFSET $4"
                ),
                &[&tenant, &(cluster as i64), &i64::from(limit), &i64::from(offset)],
            )
            .await
            .map_err(|e| self.err(e))?
            .iter()
            .map(memory_from)
            .collect();
        self.memories_revealed(&c, tenant, raw).await
    }

    async fn member_ids(
        &self,
        tenant: &str,
        cluster: u64,
        upto: u64,
    ) -> Result<Vec<String>, Error> {
        let c = self.client().await?;
        Ok(c.query(
            "SELECT id FROM memories WHERE tenant = $1 AND cluster = $2 AND seq <= $3 ORDER BY seq",
            &[&tenant, &(cluster as i64), &rules::seq_arg(upto)],
        )
        .await
        .map_err(|e| self.err(e))?
        .iter()
        .map(|r| r.get(0))
        .collect())
    }

    async fn delete_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        let gone = {
            let mut t = PgTx {
                store: self,
                c: &tx,
            };
            crate::writes::delete_memory(&mut t, tenant, id).await?
        };
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(gone.map(|(m, _)| m))
    }

    async fn set_vectors(
        &self,
        tenant: &str,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        {
            let mut t = PgTx {
                store: self,
                c: &tx,
            };
            crate::writes::set_vectors(&mut t, tenant, cluster, model, &vectors).await?;
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn cluster_summary(
        &self,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<ClusterSummary>, Error> {
        let c = self.client().await?;
        match self.summary_raw(&c, tenant, cluster).await? {
            Some(raw) => self.summary_revealed(&c, tenant, raw).await.map(Some),
            None => Ok(None),
        }
    }

    async fn summary_by_id(&self, tenant: &str, id: u64) -> Result<Option<ClusterSummary>, Error> {
        let c = self.client().await?;
        let raw = c
            .query_opt(
                &format!("SELECT {SUM_COLS} FROM cluster_summaries WHERE tenant = $1 AND id = $2"),
                &[&tenant, &(id as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
        match raw {
            Some(r) => self
                .summary_revealed(&c, tenant, summary_from(&r))
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    async fn write_cluster_summary(
        &self,
        tenant: &str,
        w: ClusterSummaryWrite,
    ) -> Result<bool, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        let written = {
            let mut t = PgTx {
                store: self,
                c: &tx,
            };
            crate::writes::write_cluster_summary(&mut t, tenant, w).await?
        };
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(written)
    }

    async fn delete_cluster_summary(&self, tenant: &str, cluster: u64) -> Result<(), Error> {
        self.exec(
            "DELETE FROM cluster_summaries WHERE tenant = $1 AND cluster = $2",
            &[&tenant, &(cluster as i64)],
        )
        .await
        .map(drop)
    }

    async fn set_cluster_note(
        &self,
        tenant: &str,
        cluster: u64,
        note: Option<String>,
    ) -> Result<(), Error> {
        self.exec(
            "UPDATE clusters SET note = $3 WHERE tenant = $1 AND id = $2",
            &[&tenant, &(cluster as i64), &note],
        )
        .await
        .map(drop)
    }

    async fn search(
        &self,
        tenant: &str,
        query: &[f32],
        model: &str,
        filter: &MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        let c = self.client().await?;
        let mut t = PgTx { store: self, c: &c };
        crate::search::search(&mut t, tenant, query, model, filter, limit).await
    }

    async fn list_memories(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Memory>, usize), Error> {
        let c = self.client().await?;
        let (fsql, args) = filter_sql(tenant, filter, "");
        let total: i64 = c
            .query_one(
                &format!("SELECT COUNT(*) FROM memories WHERE tenant = $1{fsql}"),
                &params(&args),
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        let rows = c
            .query(
                &format!(
                    "SELECT {MEM_COLS} FROM memories WHERE tenant = $1{fsql} ORDER BY seq LIMIT {} OFFSET {}",
                    limit.min(i64::MAX as usize),
                    offset.min(i64::MAX as usize)
                ),
                &params(&args),
            )
            .await
            .map_err(|e| self.err(e))?;
        let raw = rows.iter().map(memory_from).collect();
        Ok((
            self.memories_revealed(&c, tenant, raw).await?,
            total as usize,
        ))
    }

    async fn clusters(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
    ) -> Result<Vec<ClusterRow>, Error> {
        let c = self.client().await?;
        let (fsql, args) = filter_sql(tenant, filter, "c.");
        let rows = c
            .query(
                &format!(
                    "SELECT c.id, c.\"user\", c.project, c.environment, c.kind, c.key, c.members, c.note, c.model, c.version, c.settled, s.id FROM clusters c LEFT JOIN cluster_summaries s ON s.tenant = c.tenant AND s.cluster = c.id WHERE c.tenant = $1{fsql} AND c.members > 0 ORDER BY c.id"
                ),
                &params(&args),
            )
            .await
            .map_err(|e| self.err(e))?;
        let mut out: Vec<ClusterRow> = rows
            .iter()
            .map(|r| ClusterRow {
                id: g64(r, 0),
                scope: scope_from(r),
                members: g32(r, 6),
                member_ids: Vec::new(),
                note: r.get(7),
                model: r.get(8),
                version: g64(r, 9),
                settled: g64(r, 10),
                summary: r.get::<_, Option<i64>>(11).map(|x| x as u64),
            })
            .collect();
        for row in &mut out {
            row.member_ids = c
                .query(
                    "SELECT id FROM memories WHERE tenant = $1 AND cluster = $2 ORDER BY seq",
                    &[&tenant, &(row.id as i64)],
                )
                .await
                .map_err(|e| self.err(e))?
                .iter()
                .map(|r| r.get(0))
                .collect();
        }
        Ok(out)
    }

    async fn unsettled(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<Unsettled>, Error> {
        Ok(self
            .rows(
                &format!(
                    "SELECT tenant, id, version, \"user\", project FROM clusters WHERE version > settled AND ($1::text IS NULL OR tenant = $1) ORDER BY changed_seq LIMIT {}",
                    limit.min(i64::MAX as usize)
                ),
                &[&tenant],
            )
            .await?
            .iter()
            .map(|r| Unsettled {
                tenant: r.get(0),
                cluster: g64(r, 1),
                version: g64(r, 2),
                user: r.get(3),
                project: r.get(4),
            })
            .collect())
    }

    async fn cluster_version(&self, tenant: &str, cluster: u64) -> Result<Option<u64>, Error> {
        let c = self.client().await?;
        Ok(self
            .cluster_figures(&c, tenant, cluster)
            .await?
            .map(|f| f.0))
    }

    async fn settle(&self, tenant: &str, cluster: u64, version: u64) -> Result<(), Error> {
        self.exec(
            "UPDATE clusters SET settled = GREATEST(settled, $3) WHERE tenant = $1 AND id = $2",
            &[&tenant, &(cluster as i64), &(version as i64)],
        )
        .await
        .map(drop)
    }

    async fn claim_cluster(
        &self,
        tenant: &str,
        cluster: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, Error> {
        Ok(self
            .exec(
                "UPDATE clusters SET claim_owner = $3, claim_until_ms = $5 WHERE tenant = $1 AND id = $2 AND (claim_owner IS NULL OR claim_owner = $3 OR claim_until_ms <= $4)",
                &[&tenant, &(cluster as i64), &owner, &(now_ms as i64), &(until_ms as i64)],
            )
            .await?
            == 1)
    }

    async fn release_cluster(&self, tenant: &str, cluster: u64, owner: &str) -> Result<(), Error> {
        self.exec(
            "UPDATE clusters SET claim_owner = NULL, claim_until_ms = NULL WHERE tenant = $1 AND id = $2 AND claim_owner = $3",
            &[&tenant, &(cluster as i64), &owner],
        )
        .await
        .map(drop)
    }

    async fn add_usage(
        &self,
        tenant: &str,
        day: &str,
        calls: u64,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        let (calls, prompt, output) = (calls as i64, prompt_tokens as i64, output_tokens as i64);
        for (table, column, period) in [
            ("usage", "month", month_of_day(day)),
            ("usage_days", "day", day),
        ] {
            tx.execute(
                &format!(
                    "INSERT INTO {table} (tenant, {column}, calls, prompt_tokens, output_tokens) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (tenant, {column}) DO UPDATE SET calls = {table}.calls + excluded.calls, prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, output_tokens = {table}.output_tokens + excluded.output_tokens"
                ),
                &[&tenant, &period, &calls, &prompt, &output],
            )
            .await
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn usage_days(&self, tenant: &str, month: &str) -> Result<Vec<UsageDay>, Error> {
        let pattern = format!("{month}-%");
        Ok(self
            .rows(
                "SELECT day, calls, prompt_tokens, output_tokens FROM usage_days WHERE tenant = $1 AND day LIKE $2 ORDER BY day",
                &[&tenant, &pattern],
            )
            .await?
            .iter()
            .map(|r| UsageDay {
                day: r.get(0),
                calls: g64(r, 1),
                prompt_tokens: g64(r, 2),
                output_tokens: g64(r, 3),
            })
            .collect())
    }

    async fn usage(&self, tenant: &str, month: &str) -> Result<(u64, u64, u64), Error> {
        Ok(self
            .row(
                "SELECT calls, prompt_tokens, output_tokens FROM usage WHERE tenant = $1 AND month = $2",
                &[&tenant, &month],
            )
            .await?
            .map(|r| (g64(&r, 0), g64(&r, 1), g64(&r, 2)))
            .unwrap_or_default())
    }

    async fn lexical_key(&self, tenant: &str) -> Result<Option<Vec<u8>>, Error> {
        if self.keys.is_none() {
            return Ok(None);
        }
        let c = self.client().await?;
        self.lexical_key_on(&c, tenant).await
    }

    async fn forget_tenant(&self, tenant: &str) -> Result<(), Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        self.lock_tenant(&tx, tenant).await?;
        for t in [
            "memories",
            "cluster_summaries",
            "clusters",
            "data_keys",
            "usage",
            "usage_days",
        ] {
            tx.execute(&format!("DELETE FROM {t} WHERE tenant = $1"), &[&tenant])
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        // Deleted rows stay in the table files as dead tuples until VACUUM reclaims their
        // space (new rows then overwrite it; VACUUM FULL rewrites the files at once, under an
        // exclusive lock). A tenant's deletion is rare: vacuum what held its text now.
        c.batch_execute(
            "VACUUM episodes, episode_terms, summaries, partials, events, session_focus, session_labels, memories, cluster_summaries, clusters, data_keys",
        )
        .await
        .map_err(|e| self.err(e))
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
        if self.store.seal_vectors {
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

    fn listen(
        &self,
        channel: &'static str,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        Some(PgDb::listen(self, channel))
    }
}
