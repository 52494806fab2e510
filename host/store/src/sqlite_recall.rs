//! [`RecallStore`] in the SQLite database (tables of migration 016).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params, params_from_iter};

use super::SqliteStore;
use super::recall::{ClusterRow, RecallStore, Unsettled, UsageDay, month_of_day};
use crate::rules::{self, Dialect};
use crate::search::Candidate;
use crate::sql::{Row as SqlRow, SUM, Tx, Txn, VECTOR, Val};
use crate::sqlite::SqliteDb;
use crate::types::{
    Centroid, ClusterSummary, ClusterSummaryWrite, Error, Hit, MemberSet, Memory, MemoryFilter,
    NewMemory, Scope, StoredMemory,
};

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

use crate::keyring::{Stored, VectorKeys};

impl SqliteDb {
    /// The tenant's keys for its vectors in this call (see [`VectorKeys`]).
    fn vector_keys(&self, c: &Connection, tenant: &str) -> Result<VectorKeys, Error> {
        let Some(keys) = &self.keys else {
            return Ok(VectorKeys::plain(tenant));
        };
        if self.seal_vectors {
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
        Ok(VectorKeys::new(tenant, all, self.seal_vectors))
    }

    fn memories_revealed(
        &self,
        c: &Connection,
        tenant: &str,
        rows: Vec<(Memory, Stored)>,
    ) -> Result<Vec<Memory>, Error> {
        rows.into_iter()
            .map(|(mut m, s)| {
                m.text = self.reveal(c, tenant, "memories", &m.id, s)?;
                Ok(m)
            })
            .collect()
    }

    fn summary_revealed(
        &self,
        c: &Connection,
        tenant: &str,
        (mut s, st): (ClusterSummary, Stored),
    ) -> Result<ClusterSummary, Error> {
        s.text = self.reveal(c, tenant, "cluster_summaries", &s.id.to_string(), st)?;
        Ok(s)
    }
}

/// The filter's `WHERE` fragment in SQLite's dialect (see [`rules::filter_sql`]).
fn filter_sql(tenant: &str, f: &MemoryFilter, prefix: &str) -> (String, Vec<String>) {
    rules::filter_sql(Dialect::Sqlite, tenant, f, prefix)
}

const MEM_COLS: &str = "id, user, project, environment, kind, key, text, importance, tokens, created_ms, cluster, sealed, seq";

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

fn memory_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Memory, Stored)> {
    let m = Memory {
        id: r.get(0)?,
        scope: scope_from(r, 1)?,
        text: String::new(),
        importance: r.get::<_, f64>(7)? as f32,
        tokens: r.get(8)?,
        created_ms: r.get::<_, i64>(9)? as u64,
        cluster: r.get::<_, i64>(10)? as u64,
        seq: r.get::<_, i64>(12)? as u64,
    };
    Ok((
        m,
        Stored {
            bytes: r.get(6)?,
            sealed: r.get(11)?,
        },
    ))
}

const SUM_COLS: &str = "id, cluster, text, member_hash, covered_seq, covered, importance, tokens, model, calls, prompt_tokens, output_tokens, created_ms, updated_ms, sealed";

fn summary_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<(ClusterSummary, Stored)> {
    let stored = Stored {
        bytes: r.get(2)?,
        sealed: r.get(14)?,
    };
    let s = ClusterSummary {
        id: r.get::<_, i64>(0)? as u64,
        cluster: r.get::<_, i64>(1)? as u64,
        text: String::new(),
        member_hash: r.get(3)?,
        covered_seq: r.get::<_, i64>(4)? as u64,
        covered: r.get(5)?,
        importance: r.get::<_, f64>(6)? as f32,
        tokens: r.get(7)?,
        model: r.get(8)?,
        calls: r.get(9)?,
        prompt_tokens: r.get(10)?,
        output_tokens: r.get(11)?,
        created_ms: r.get::<_, i64>(12)? as u64,
        updated_ms: r.get::<_, i64>(13)? as u64,
    };
    Ok((s, stored))
}

/// A cluster's members with `seq > after`, oldest first (the `memories_cluster` index).
fn members_raw(
    c: &Connection,
    tenant: &str,
    cluster: u64,
    after: u64,
) -> Result<Vec<(Memory, Stored)>, Error> {
    let mut st = c
        .prepare_cached(&format!(
            "SELECT {MEM_COLS} FROM memories WHERE tenant = ?1 AND cluster = ?2 AND seq > ?3 ORDER BY seq"
        ))
        .map_err(db_err)?;
    st.query_map(
        params![tenant, cluster as i64, rules::seq_arg(after)],
        memory_from,
    )
    .map_err(db_err)?
    .collect::<Result<_, _>>()
    .map_err(db_err)
}

/// A cluster's membership version (`None`: no such cluster) and member count.
fn cluster_figures(
    c: &Connection,
    tenant: &str,
    cluster: u64,
) -> Result<Option<(u64, u32)>, Error> {
    c.query_row(
        "SELECT version, members FROM clusters WHERE tenant = ?1 AND id = ?2",
        params![tenant, cluster as i64],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
    )
    .optional()
    .map_err(db_err)
}

fn summary_raw(
    c: &Connection,
    tenant: &str,
    cluster: u64,
) -> Result<Option<(ClusterSummary, Stored)>, Error> {
    c.query_row(
        &format!("SELECT {SUM_COLS} FROM cluster_summaries WHERE tenant = ?1 AND cluster = ?2"),
        params![tenant, cluster as i64],
        summary_from,
    )
    .optional()
    .map_err(db_err)
}

#[async_trait]
impl RecallStore for SqliteStore {
    async fn centroids(&self, tenant: &str, scope: &Scope) -> Result<Vec<Centroid>, Error> {
        self.with(|c| {
            let vk = self.vector_keys(c, tenant)?;
            let mut st = c
                .prepare_cached(
                    "SELECT id, model, sum, members FROM clusters WHERE tenant = ?1 AND user = ?2 AND project = ?3 AND environment = ?4 AND kind = ?5 AND key = ?6 AND members > 0 ORDER BY id",
                )
                .map_err(db_err)?;
            let raw: Vec<(u64, String, Vec<u8>, u32)> = st
                .query_map(
                    params![tenant, scope.user, scope.project, scope.environment, scope.kind, scope.key],
                    |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)?;
            raw.into_iter()
                .map(|(id, model, sum, n)| {
                    let sum = vk.open(SUM, &id.to_string(), &sum)?;
                    Ok(Centroid {
                        cluster: id,
                        model,
                        vector: rules::centroid(&sum, n),
                        members: n,
                    })
                })
                .collect()
        })
    }

    async fn put_memory(&self, tenant: &str, m: NewMemory) -> Result<StoredMemory, Error> {
        let mut t = self.begin_txn(true).await?;
        let stored = crate::writes::put_memory(&mut t, tenant, m).await?;
        t.commit().await?;
        Ok(stored)
    }

    async fn get_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        self.with(|c| {
            let raw = c
                .query_row(
                    &format!("SELECT {MEM_COLS} FROM memories WHERE tenant = ?1 AND id = ?2"),
                    params![tenant, id],
                    memory_from,
                )
                .optional()
                .map_err(db_err)?;
            Ok(self
                .memories_revealed(c, tenant, raw.into_iter().collect())?
                .pop())
        })
    }

    async fn cluster_members(&self, tenant: &str, cluster: u64) -> Result<Vec<Memory>, Error> {
        self.with(|c| {
            let raw = members_raw(c, tenant, cluster, 0)?;
            self.memories_revealed(c, tenant, raw)
        })
    }

    async fn members_after(
        &self,
        tenant: &str,
        cluster: u64,
        after: u64,
    ) -> Result<MemberSet, Error> {
        self.with(|conn| {
            // One snapshot: the figures and the rows agree.
            let tx = conn.transaction().map_err(db_err)?;
            let Some((version, count)) = cluster_figures(&tx, tenant, cluster)? else {
                return Ok(MemberSet {
                    version: 0,
                    count: 0,
                    members: Vec::new(),
                });
            };
            let raw = members_raw(&tx, tenant, cluster, after)?;
            let members = self.memories_revealed(&tx, tenant, raw)?;
            tx.commit().map_err(db_err)?;
            Ok(MemberSet {
                version,
                count,
                members,
            })
        })
    }

    async fn top_members(
        &self,
        tenant: &str,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<Memory>, Error> {
        self.with(|c| {
            // The `memories_rank` index: a page costs what it returns (plus the offset).
            let raw = c
                .prepare_cached(&format!(
                    "SELECT {MEM_COLS} FROM memories WHERE tenant = ?1 AND cluster = ?2 ORDER BY importance DESC, created_ms, id LIMIT ?3 OFFSET ?4"
                ))
                .map_err(db_err)?
                .query_map(params![tenant, cluster as i64, limit, offset], memory_from)
                .map_err(db_err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_err)?;
            self.memories_revealed(c, tenant, raw)
        })
    }

    async fn member_ids(
        &self,
        tenant: &str,
        cluster: u64,
        upto: u64,
    ) -> Result<Vec<String>, Error> {
        self.with(|c| {
            c.prepare_cached(
                "SELECT id FROM memories WHERE tenant = ?1 AND cluster = ?2 AND seq <= ?3 ORDER BY seq",
            )
            .map_err(db_err)?
            .query_map(params![tenant, cluster as i64, rules::seq_arg(upto)], |r| r.get(0))
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })
    }

    async fn delete_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        let mut t = self.begin_txn(true).await?;
        let Some((m, model)) = crate::writes::delete_memory(&mut t, tenant, id).await? else {
            return Ok(None);
        };
        let deletes = mark_delete(t.conn(), tenant)?;
        t.commit_here().await?;
        crate::sqlite::scrub(t.conn());
        // This process's index follows at once (another process's rebuilds: the count).
        if let Some(i) = self.ann.get(tenant, &model) {
            let mut g = crate::ann::locked(&i);
            if g.deletes + 1 == deletes {
                g.remove(id)?;
                g.deletes = deletes;
                // The saved graph went with the deletion: save this one anew.
                g.unsaved_whole();
            }
        }
        Ok(Some(m))
    }

    async fn set_vectors(
        &self,
        tenant: &str,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error> {
        let mut t = self.begin_txn(true).await?;
        crate::writes::set_vectors(&mut t, tenant, cluster, model, &vectors).await?;
        // Vectors changed model: every index of the tenant is rebuilt on next need.
        mark_delete(t.conn(), tenant)?;
        t.commit().await?;
        self.ann.drop_tenant(tenant, None);
        Ok(())
    }

    async fn cluster_summary(
        &self,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<ClusterSummary>, Error> {
        self.with(|c| match summary_raw(c, tenant, cluster)? {
            Some(raw) => self.summary_revealed(c, tenant, raw).map(Some),
            None => Ok(None),
        })
    }

    async fn summary_by_id(&self, tenant: &str, id: u64) -> Result<Option<ClusterSummary>, Error> {
        self.with(|c| {
            let raw = c
                .query_row(
                    &format!(
                        "SELECT {SUM_COLS} FROM cluster_summaries WHERE tenant = ?1 AND id = ?2"
                    ),
                    params![tenant, id as i64],
                    summary_from,
                )
                .optional()
                .map_err(db_err)?;
            match raw {
                Some(raw) => self.summary_revealed(c, tenant, raw).map(Some),
                None => Ok(None),
            }
        })
    }

    async fn write_cluster_summary(
        &self,
        tenant: &str,
        w: ClusterSummaryWrite,
    ) -> Result<bool, Error> {
        let mut t = self.begin_txn(true).await?;
        let written = crate::writes::write_cluster_summary(&mut t, tenant, w).await?;
        t.commit().await?;
        Ok(written)
    }

    async fn delete_cluster_summary(&self, tenant: &str, cluster: u64) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "DELETE FROM cluster_summaries WHERE tenant = ?1 AND cluster = ?2",
                params![tenant, cluster as i64],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    async fn set_cluster_note(
        &self,
        tenant: &str,
        cluster: u64,
        note: Option<String>,
    ) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "UPDATE clusters SET note = ?3 WHERE tenant = ?1 AND id = ?2",
                params![tenant, cluster as i64, note],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    async fn search(
        &self,
        tenant: &str,
        query: &[f32],
        model: &str,
        filter: &MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        let mut t = self.begin_txn(false).await?;
        crate::search::search(&mut t, tenant, query, model, filter, limit).await
    }

    async fn list_memories(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Memory>, usize), Error> {
        self.with(|c| {
            let (fsql, args) = filter_sql(tenant, filter, "");
            let total: i64 = c
                .query_row(
                    &format!("SELECT COUNT(*) FROM memories WHERE tenant = ?1{fsql}"),
                    params_from_iter(args.iter()),
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            let mut st = c
                .prepare(&format!(
                    "SELECT {MEM_COLS} FROM memories WHERE tenant = ?1{fsql} ORDER BY seq LIMIT {} OFFSET {}",
                    limit.min(i64::MAX as usize),
                    offset
                ))
                .map_err(db_err)?;
            let rows: Vec<(Memory, Stored)> = st
                .query_map(params_from_iter(args.iter()), memory_from)
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)?;
            Ok((self.memories_revealed(c, tenant, rows)?, total as usize))
        })
    }

    async fn clusters(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
    ) -> Result<Vec<ClusterRow>, Error> {
        self.with(|c| {
            let (fsql, args) = filter_sql(tenant, filter, "c.");
            let mut st = c
                .prepare(&format!(
                    "SELECT c.id, c.user, c.project, c.environment, c.kind, c.key, c.members, c.note, c.model, c.version, c.settled, s.id FROM clusters c LEFT JOIN cluster_summaries s ON s.tenant = c.tenant AND s.cluster = c.id WHERE c.tenant = ?1{fsql} AND c.members > 0 ORDER BY c.id"
                ))
                .map_err(db_err)?;
            let mut rows: Vec<ClusterRow> = st
                .query_map(params_from_iter(args.iter()), |r| {
                    Ok(ClusterRow {
                        id: r.get::<_, i64>(0)? as u64,
                        scope: scope_from(r, 1)?,
                        members: r.get(6)?,
                        member_ids: Vec::new(),
                        note: r.get(7)?,
                        model: r.get(8)?,
                        version: r.get::<_, i64>(9)? as u64,
                        settled: r.get::<_, i64>(10)? as u64,
                        summary: r.get::<_, Option<i64>>(11)?.map(|x| x as u64),
                    })
                })
                .map_err(db_err)?
                .collect::<Result<_, _>>()
                .map_err(db_err)?;
            let mut ids = c
                .prepare_cached("SELECT id FROM memories WHERE tenant = ?1 AND cluster = ?2 ORDER BY seq")
                .map_err(db_err)?;
            for row in &mut rows {
                row.member_ids = ids
                    .query_map(params![tenant, row.id as i64], |r| r.get(0))
                    .map_err(db_err)?
                    .collect::<Result<_, _>>()
                    .map_err(db_err)?;
            }
            Ok(rows)
        })
    }

    async fn unsettled(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<Unsettled>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare(&format!(
                    "SELECT tenant, id, version, user, project FROM clusters WHERE version > settled AND (?1 IS NULL OR tenant = ?1) ORDER BY changed_seq LIMIT {}",
                    limit.min(i64::MAX as usize)
                ))
                .map_err(db_err)?;
            st.query_map(params![tenant], |r| {
                Ok(Unsettled {
                    tenant: r.get(0)?,
                    cluster: r.get::<_, i64>(1)? as u64,
                    version: r.get::<_, i64>(2)? as u64,
                    user: r.get(3)?,
                    project: r.get(4)?,
                })
            })
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })
    }

    async fn cluster_version(&self, tenant: &str, cluster: u64) -> Result<Option<u64>, Error> {
        self.with(|c| Ok(cluster_figures(c, tenant, cluster)?.map(|f| f.0)))
    }

    async fn settle(&self, tenant: &str, cluster: u64, version: u64) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "UPDATE clusters SET settled = MAX(settled, ?3) WHERE tenant = ?1 AND id = ?2",
                params![tenant, cluster as i64, version as i64],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    async fn claim_cluster(
        &self,
        tenant: &str,
        cluster: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, Error> {
        self.with(|c| {
            let n = c
                .execute(
                    "UPDATE clusters SET claim_owner = ?3, claim_until_ms = ?5 WHERE tenant = ?1 AND id = ?2 AND (claim_owner IS NULL OR claim_owner = ?3 OR claim_until_ms <= ?4)",
                    params![tenant, cluster as i64, owner, now_ms as i64, until_ms as i64],
                )
                .map_err(db_err)?;
            Ok(n == 1)
        })
    }

    async fn release_cluster(&self, tenant: &str, cluster: u64, owner: &str) -> Result<(), Error> {
        self.with(|c| {
            c.execute(
                "UPDATE clusters SET claim_owner = NULL, claim_until_ms = NULL WHERE tenant = ?1 AND id = ?2 AND claim_owner = ?3",
                params![tenant, cluster as i64, owner],
            )
            .map_err(db_err)?;
            Ok(())
        })
    }

    async fn add_usage(
        &self,
        tenant: &str,
        day: &str,
        calls: u64,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), Error> {
        self.with(|conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let values = params![tenant, month_of_day(day), day, calls as i64, prompt_tokens as i64, output_tokens as i64];
            tx.execute(
                "INSERT INTO usage (tenant, month, calls, prompt_tokens, output_tokens) VALUES (?1, ?2, ?4, ?5, ?6) ON CONFLICT (tenant, month) DO UPDATE SET calls = calls + excluded.calls, prompt_tokens = prompt_tokens + excluded.prompt_tokens, output_tokens = output_tokens + excluded.output_tokens",
                values,
            )
            .map_err(db_err)?;
            tx.execute(
                "INSERT INTO usage_days (tenant, day, calls, prompt_tokens, output_tokens) VALUES (?1, ?3, ?4, ?5, ?6) ON CONFLICT (tenant, day) DO UPDATE SET calls = calls + excluded.calls, prompt_tokens = prompt_tokens + excluded.prompt_tokens, output_tokens = output_tokens + excluded.output_tokens",
                values,
            )
            .map_err(db_err)?;
            tx.commit().map_err(db_err)
        })
    }

    async fn usage_days(&self, tenant: &str, month: &str) -> Result<Vec<UsageDay>, Error> {
        self.with(|c| {
            let mut st = c
                .prepare("SELECT day, calls, prompt_tokens, output_tokens FROM usage_days WHERE tenant = ?1 AND day LIKE ?2 || '-%' ORDER BY day")
                .map_err(db_err)?;
            st.query_map(params![tenant, month], |r| {
                Ok(UsageDay {
                    day: r.get(0)?,
                    calls: r.get::<_, i64>(1)? as u64,
                    prompt_tokens: r.get::<_, i64>(2)? as u64,
                    output_tokens: r.get::<_, i64>(3)? as u64,
                })
            })
            .and_then(Iterator::collect)
            .map_err(db_err)
        })
    }

    async fn usage(&self, tenant: &str, month: &str) -> Result<(u64, u64, u64), Error> {
        self.with(|c| {
            c.query_row(
                "SELECT calls, prompt_tokens, output_tokens FROM usage WHERE tenant = ?1 AND month = ?2",
                params![tenant, month],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64)),
            )
            .optional()
            .map(Option::unwrap_or_default)
            .map_err(db_err)
        })
    }

    async fn lexical_key(&self, tenant: &str) -> Result<Option<Vec<u8>>, Error> {
        if self.keys.is_none() {
            return Ok(None);
        }
        self.with(|c| self.lexical_key_on(c, tenant))
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

    async fn forget_tenant(&self, tenant: &str) -> Result<(), Error> {
        self.with(|conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db_err)?;
            for t in [
                "memories",
                "cluster_summaries",
                "clusters",
                "data_keys",
                "usage",
                "usage_days",
                "memory_marks",
                "ann_graphs",
            ] {
                tx.execute(&format!("DELETE FROM {t} WHERE tenant = ?1"), [tenant])
                    .map_err(db_err)?;
            }
            tx.commit().map_err(db_err)?;
            crate::sqlite::scrub(conn);
            self.ann.drop_tenant(tenant, None);
            Ok(())
        })
    }
}

impl SqliteDb {
    /// A tenant's lexical key (see `RecallStore::lexical_key`), read on an open connection.
    pub(crate) fn lexical_key_on(
        &self,
        c: &Connection,
        tenant: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        let Some(keys) = &self.keys else {
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

impl SqliteTxn<'_> {
    /// The connection, for SQLite's own statements beside a body's.
    pub(crate) fn conn(&self) -> &Connection {
        &self.c
    }
}

impl SqliteDb {
    /// Open a transaction on the store's connection (see [`crate::sql::Backend::begin`]); the
    /// lock, and a write's `BEGIN IMMEDIATE`, are waited for as [`crate::sqlite::blocking`]
    /// waits.
    pub(crate) async fn begin_txn(&self, write: bool) -> Result<SqliteTxn<'_>, Error> {
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
