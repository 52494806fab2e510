//! [`RecallStore`] written once: memories, their clusters, cluster summaries and usage, over
//! either SQL store's transactions. Writes that change a tenant's clusters go through
//! `crate::writes` (which takes the tenant's cluster lock first); what is left to a store is
//! its index (SQLite's in-process graph, pgvector) and what it does after a deletion.

use async_trait::async_trait;

use super::Sql;
use crate::keyring::{Stored, place};
use crate::recall::{ClusterRow, RecallStore, Unsettled, UsageDay, month_of_day};
use crate::rules::{self, Dialect};
use crate::sql::{Backend, Row, SUM, Tx, Txn, Val, memory_cols, memory_from};
use crate::types::{
    Centroid, ClusterSummary, ClusterSummaryWrite, Error, Hit, MemberSet, Memory, MemoryFilter,
    NewMemory, Scope, StoredMemory,
};

const SUM_COLS: &str = "id, cluster, text, member_hash, covered_seq, covered, importance, tokens, model, calls, prompt_tokens, output_tokens, created_ms, updated_ms, sealed";

/// A cluster summary row of [`SUM_COLS`], its text still as stored.
fn summary_from(r: &Row) -> Result<(ClusterSummary, Stored), Error> {
    Ok((
        ClusterSummary {
            id: r.u64(0)?,
            cluster: r.u64(1)?,
            text: String::new(),
            member_hash: r.text(3)?,
            covered_seq: r.u64(4)?,
            covered: r.int(5)? as u32,
            importance: r.real(6)? as f32,
            tokens: r.int(7)? as u32,
            model: r.text(8)?,
            calls: r.int(9)? as u32,
            prompt_tokens: r.int(10)? as u32,
            output_tokens: r.int(11)? as u32,
            created_ms: r.u64(12)?,
            updated_ms: r.u64(13)?,
        },
        Stored {
            bytes: r.bytes(2)?,
            sealed: r.int(14)? as u32,
        },
    ))
}

/// The memories of `sql` with `args`, their texts opened.
async fn memories(
    t: &mut impl Tx,
    tenant: &str,
    sql: &str,
    args: &[Val],
) -> Result<Vec<Memory>, Error> {
    let rows = t.rows(sql, args).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let (mut m, stored) = memory_from(r)?;
        m.text = t.reveal(tenant, place::MEMORY, &m.id, stored).await?;
        out.push(m);
    }
    Ok(out)
}

/// The cluster summary of `sql` with `args`, its text opened.
async fn summary(
    t: &mut impl Tx,
    tenant: &str,
    sql: &str,
    args: &[Val],
) -> Result<Option<ClusterSummary>, Error> {
    let Some(r) = t.row(sql, args).await? else {
        return Ok(None);
    };
    let (mut s, stored) = summary_from(&r)?;
    s.text = t
        .reveal(tenant, place::CLUSTER_SUMMARY, &s.id.to_string(), stored)
        .await?;
    Ok(Some(s))
}

/// A cluster's members with `seq > after`, oldest first (the `memories_cluster` index).
async fn members_raw(
    t: &mut impl Tx,
    tenant: &str,
    cluster: u64,
    after: u64,
) -> Result<Vec<Memory>, Error> {
    let cols = memory_cols(t.dialect());
    memories(
        t,
        tenant,
        &format!(
            "SELECT {cols} FROM memories WHERE tenant = $1 AND cluster = $2 AND seq > $3 ORDER BY seq"
        ),
        &[tenant.into(), cluster.into(), rules::seq_arg(after).into()],
    )
    .await
}

/// A cluster's membership version (`None`: no such cluster) and member count.
async fn cluster_figures(
    t: &mut impl Tx,
    tenant: &str,
    cluster: u64,
) -> Result<Option<(u64, u32)>, Error> {
    match t
        .row(
            "SELECT version, members FROM clusters WHERE tenant = $1 AND id = $2",
            &[tenant.into(), cluster.into()],
        )
        .await?
    {
        Some(r) => Ok(Some((r.u64(0)?, r.int(1)? as u32))),
        None => Ok(None),
    }
}

/// A filter's `WHERE` fragment and its arguments (the tenant first) as values.
fn filter_vals(d: Dialect, tenant: &str, f: &MemoryFilter, prefix: &str) -> (String, Vec<Val>) {
    let (fsql, args) = rules::filter_sql(d, tenant, f, prefix);
    (fsql, args.into_iter().map(Val::from).collect())
}

/// A scope's five fields as SQL values, in the order the `memories` and `clusters` columns
/// name them (user, project, environment, kind, key).
pub(crate) fn scope_vals(s: &Scope) -> [Val; 5] {
    [
        s.user.as_str().into(),
        s.project.as_str().into(),
        s.environment.as_str().into(),
        s.kind.as_str().into(),
        s.key.as_str().into(),
    ]
}

/// A memory's fact key as the store keeps it: a keyed hash under the tenant's full-text key
/// (its lexical key with a master key), so a sealed tenant's facts are not in the clear; empty
/// for none. `js/src/stores.js` derives the same.
async fn fact_token<B: Backend>(s: &Sql<B>, tenant: &str, fact_key: &str) -> Result<String, Error> {
    if fact_key.is_empty() {
        return Ok(String::new());
    }
    let key = crate::terms::terms_key(tenant, s.lexical_key(tenant).await?.as_deref());
    Ok(crate::terms::token(&key, &format!("\0fact\0{fact_key}")))
}

#[async_trait]
impl<B: Backend> RecallStore for Sql<B> {
    async fn centroids(&self, tenant: &str, scope: &Scope) -> Result<Vec<Centroid>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            let vk = t.vector_keys(tenant).await?;
            let user = t.dialect().user_column();
            let mut out = Vec::new();
            for r in t
                .rows(
                    &format!("SELECT id, model, sum, members FROM clusters WHERE tenant = $1 AND {user} = $2 AND project = $3 AND environment = $4 AND kind = $5 AND key = $6 AND members > 0 ORDER BY id"),
                    &[&[tenant.into()][..], &scope_vals(scope)].concat(),
                )
                .await?
            {
                let id = r.u64(0)?;
                let n = r.int(3)? as u32;
                let sum = vk.open(SUM, &id.to_string(), r.blob(2)?)?;
                out.push(Centroid {
                    cluster: id,
                    model: r.text(1)?,
                    vector: rules::centroid(&sum, n),
                    members: n,
                });
            }
            Ok(out)
        })
    }

    async fn put_memory(&self, tenant: &str, mut m: NewMemory) -> Result<StoredMemory, Error> {
        let tenant = self.own(tenant)?;
        m.fact_key = fact_token(self, tenant, &m.fact_key).await?;
        writing!(self, |t| crate::writes::put_memory(&mut t, tenant, m).await)
    }

    async fn current_memory(
        &self,
        tenant: &str,
        scope: &Scope,
        fact_key: &str,
    ) -> Result<Option<Memory>, Error> {
        let tenant = self.own(tenant)?;
        if fact_key.is_empty() {
            return Ok(None);
        }
        let token = fact_token(self, tenant, fact_key).await?;
        reading!(self, |t| {
            let d = t.dialect();
            let cols = memory_cols(d);
            Ok(memories(
                &mut t,
                tenant,
                &format!(
                    "SELECT {cols} FROM memories WHERE tenant = $1 AND fact_key = $2 AND {} = $3 AND project = $4 AND environment = $5 AND kind = $6 AND key = $7 AND superseded_by IS NULL ORDER BY seq DESC LIMIT 1",
                    d.user_column()
                ),
                &[&[tenant.into(), token.as_str().into()][..], &scope_vals(scope)].concat(),
            )
            .await?
            .pop())
        })
    }

    async fn get_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            let cols = memory_cols(t.dialect());
            Ok(memories(
                &mut t,
                tenant,
                &format!("SELECT {cols} FROM memories WHERE tenant = $1 AND id = $2"),
                &[tenant.into(), id.into()],
            )
            .await?
            .pop())
        })
    }

    async fn cluster_members(&self, tenant: &str, cluster: u64) -> Result<Vec<Memory>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| members_raw(&mut t, tenant, cluster, 0).await)
    }

    async fn members_after(
        &self,
        tenant: &str,
        cluster: u64,
        after: u64,
    ) -> Result<MemberSet, Error> {
        let tenant = self.own(tenant)?;
        // One snapshot: the figures and the rows agree.
        let mut t = self.snapshot().await?;
        let r: Result<MemberSet, Error> = async {
            let Some((version, count)) = cluster_figures(&mut t, tenant, cluster).await? else {
                return Ok(MemberSet {
                    version: 0,
                    count: 0,
                    members: Vec::new(),
                });
            };
            let members = members_raw(&mut t, tenant, cluster, after).await?;
            Ok(MemberSet {
                version,
                count,
                members,
            })
        }
        .await;
        t.rollback().await;
        r
    }

    async fn top_members(
        &self,
        tenant: &str,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<Memory>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            let cols = memory_cols(t.dialect());
            // The `memories_rank` index: a page costs what it returns (plus the offset).
            memories(
                &mut t,
                tenant,
                &format!("SELECT {cols} FROM memories WHERE tenant = $1 AND cluster = $2 ORDER BY importance DESC, created_ms, id LIMIT $3 OFFSET $4"),
                &[tenant.into(), cluster.into(), limit.into(), offset.into()],
            )
            .await
        })
    }

    async fn member_ids(
        &self,
        tenant: &str,
        cluster: u64,
        upto: u64,
    ) -> Result<Vec<String>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            t
            .rows(
                "SELECT id FROM memories WHERE tenant = $1 AND cluster = $2 AND seq <= $3 ORDER BY seq",
                &[tenant.into(), cluster.into(), rules::seq_arg(upto).into()],
            )
            .await?
            .iter()
            .map(|r| r.text(0))
            .collect()
        })
    }

    async fn delete_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        let tenant = self.own(tenant)?;
        let gone = writing!(self, |t| {
            let Some((m, model)) = crate::writes::delete_memory(&mut t, tenant, id).await? else {
                return Ok(None);
            };
            let mark = t.deleted(tenant).await?;
            Ok(Some((m, model, mark)))
        })?;
        let Some((m, model, mark)) = gone else {
            return Ok(None);
        };
        self.memory_deleted(tenant, &model, id, mark).await?;
        Ok(Some(m))
    }

    async fn set_vectors(
        &self,
        tenant: &str,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| crate::writes::set_vectors(
            &mut t, tenant, cluster, model, &vectors
        )
        .await)
    }

    async fn cluster_summary(
        &self,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<ClusterSummary>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| summary(
            &mut t,
            tenant,
            &format!("SELECT {SUM_COLS} FROM cluster_summaries WHERE tenant = $1 AND cluster = $2"),
            &[tenant.into(), cluster.into()],
        )
        .await)
    }

    async fn summary_by_id(&self, tenant: &str, id: u64) -> Result<Option<ClusterSummary>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| summary(
            &mut t,
            tenant,
            &format!("SELECT {SUM_COLS} FROM cluster_summaries WHERE tenant = $1 AND id = $2"),
            &[tenant.into(), id.into()],
        )
        .await)
    }

    async fn write_cluster_summary(
        &self,
        tenant: &str,
        w: ClusterSummaryWrite,
    ) -> Result<bool, Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| crate::writes::write_cluster_summary(
            &mut t, tenant, w
        )
        .await)
    }

    async fn delete_cluster_summary(&self, tenant: &str, cluster: u64) -> Result<(), Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| t
            .exec(
                "DELETE FROM cluster_summaries WHERE tenant = $1 AND cluster = $2",
                &[tenant.into(), cluster.into()],
            )
            .await
            .map(drop))
    }

    async fn set_cluster_note(
        &self,
        tenant: &str,
        cluster: u64,
        note: Option<String>,
    ) -> Result<(), Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| t
            .exec(
                "UPDATE clusters SET note = $3 WHERE tenant = $1 AND id = $2",
                &[tenant.into(), cluster.into(), note.into()],
            )
            .await
            .map(drop))
    }

    async fn search(
        &self,
        tenant: &str,
        query: &[f32],
        model: &str,
        filter: &MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| crate::search::search(
            &mut t,
            (tenant, model),
            (query, filter, limit)
        )
        .await)
    }

    async fn list_memories(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Memory>, usize), Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            let d = t.dialect();
            let (fsql, args) = filter_vals(d, tenant, filter, "");
            let total = match t
                .row(
                    &format!("SELECT COUNT(*) FROM memories WHERE tenant = $1{fsql}"),
                    &args,
                )
                .await?
            {
                Some(r) => r.u64(0)? as usize,
                None => 0,
            };
            let cols = memory_cols(d);
            let page = memories(
                &mut t,
                tenant,
                &format!(
                    "SELECT {cols} FROM memories WHERE tenant = $1{fsql} ORDER BY seq LIMIT {} OFFSET {}",
                    limit.min(i64::MAX as usize),
                    offset.min(i64::MAX as usize)
                ),
                &args,
            )
            .await?;
            Ok((page, total))
        })
    }

    async fn clusters(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
    ) -> Result<Vec<ClusterRow>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            let d = t.dialect();
            let (fsql, args) = filter_vals(d, tenant, filter, "c.");
            let user = d.user_column();
            let mut out = Vec::new();
            for r in t
                .rows(
                    &format!(
                        "SELECT c.id, c.{user}, c.project, c.environment, c.kind, c.key, c.members, c.note, c.model, c.version, c.settled, s.id FROM clusters c LEFT JOIN cluster_summaries s ON s.tenant = c.tenant AND s.cluster = c.id WHERE c.tenant = $1{fsql} AND c.members > 0 ORDER BY c.id"
                    ),
                    &args,
                )
                .await?
            {
                out.push(ClusterRow {
                    id: r.u64(0)?,
                    scope: r.scope(1)?,
                    members: r.int(6)? as u32,
                    member_ids: Vec::new(),
                    note: r.opt_text(7)?,
                    model: r.text(8)?,
                    version: r.u64(9)?,
                    settled: r.u64(10)?,
                    summary: r.opt_int(11)?.map(|x| x as u64),
                });
            }
            for row in &mut out {
                row.member_ids = t
                    .rows(
                        "SELECT id FROM memories WHERE tenant = $1 AND cluster = $2 ORDER BY seq",
                        &[tenant.into(), row.id.into()],
                    )
                    .await?
                    .iter()
                    .map(|r| r.text(0))
                    .collect::<Result<_, _>>()?;
            }
            Ok(out)
        })
    }

    async fn unsettled(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<Unsettled>, Error> {
        let tenant = match tenant {
            Some(t) => Some(self.own(t)?),
            None => self.bound().map(|t| t.name()),
        };
        reading!(self, |t| {
            let user = t.dialect().user_column();
            let (only, args): (&str, Vec<Val>) = match tenant {
                Some(x) => (" AND tenant = $1", vec![x.into()]),
                None => ("", Vec::new()),
            };
            t.rows(
                &format!(
                    "SELECT tenant, id, version, {user}, project FROM clusters WHERE version > settled{only} ORDER BY changed_seq LIMIT {}",
                    limit.min(i64::MAX as usize)
                ),
                &args,
            )
            .await?
            .iter()
            .map(|r| {
                Ok(Unsettled {
                    tenant: r.text(0)?,
                    cluster: r.u64(1)?,
                    version: r.u64(2)?,
                    user: r.text(3)?,
                    project: r.text(4)?,
                })
            })
            .collect()
        })
    }

    async fn cluster_version(&self, tenant: &str, cluster: u64) -> Result<Option<u64>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| Ok(cluster_figures(&mut t, tenant, cluster)
            .await?
            .map(|f| f.0)))
    }

    async fn settle(&self, tenant: &str, cluster: u64, version: u64) -> Result<(), Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| {
            let greatest = match t.dialect() {
                Dialect::Sqlite => "MAX",
                Dialect::Postgres => "GREATEST",
            };
            t.exec(
                &format!("UPDATE clusters SET settled = {greatest}(settled, $3) WHERE tenant = $1 AND id = $2"),
                &[tenant.into(), cluster.into(), version.into()],
            )
            .await
            .map(drop)
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
        let tenant = self.own(tenant)?;
        writing!(self, |t| {
            Ok(t
            .exec(
                "UPDATE clusters SET claim_owner = $3, claim_until_ms = $5 WHERE tenant = $1 AND id = $2 AND (claim_owner IS NULL OR claim_owner = $3 OR claim_until_ms <= $4)",
                &[tenant.into(), cluster.into(), owner.into(), now_ms.into(), until_ms.into()],
            )
            .await?
            == 1)
        })
    }

    async fn release_cluster(&self, tenant: &str, cluster: u64, owner: &str) -> Result<(), Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| {
            t
            .exec(
                "UPDATE clusters SET claim_owner = NULL, claim_until_ms = NULL WHERE tenant = $1 AND id = $2 AND claim_owner = $3",
                &[tenant.into(), cluster.into(), owner.into()],
            )
            .await
            .map(drop)
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
        let tenant = self.own(tenant)?;
        writing!(self, |t| {
            for (table, column, period) in [
                ("usage", "month", month_of_day(day)),
                ("usage_days", "day", day),
            ] {
                t.exec(
                    &format!(
                        "INSERT INTO {table} (tenant, {column}, calls, prompt_tokens, output_tokens) VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (tenant, {column}) DO UPDATE SET calls = {table}.calls + excluded.calls, prompt_tokens = {table}.prompt_tokens + excluded.prompt_tokens, output_tokens = {table}.output_tokens + excluded.output_tokens"
                    ),
                    &[tenant.into(), period.into(), calls.into(), prompt_tokens.into(), output_tokens.into()],
                )
                .await?;
            }
            Ok(())
        })
    }

    async fn usage_days(&self, tenant: &str, month: &str) -> Result<Vec<UsageDay>, Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            t
            .rows(
                "SELECT day, calls, prompt_tokens, output_tokens FROM usage_days WHERE tenant = $1 AND day LIKE $2 ORDER BY day",
                &[tenant.into(), format!("{month}-%").into()],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(UsageDay {
                    day: r.text(0)?,
                    calls: r.u64(1)?,
                    prompt_tokens: r.u64(2)?,
                    output_tokens: r.u64(3)?,
                })
            })
            .collect()
        })
    }

    async fn usage(&self, tenant: &str, month: &str) -> Result<(u64, u64, u64), Error> {
        let tenant = self.own(tenant)?;
        reading!(self, |t| {
            match t
            .row(
                "SELECT calls, prompt_tokens, output_tokens FROM usage WHERE tenant = $1 AND month = $2",
                &[tenant.into(), month.into()],
            )
            .await?
        {
            Some(r) => Ok((r.u64(0)?, r.u64(1)?, r.u64(2)?)),
            None => Ok((0, 0, 0)),
        }
        })
    }

    async fn lexical_key(&self, tenant: &str) -> Result<Option<Vec<u8>>, Error> {
        let tenant = self.own(tenant)?;
        if !self.sealing() {
            return Ok(None);
        }
        reading!(self, |t| t.lexical_key(tenant).await)
    }

    async fn warm(&self) -> Result<usize, Error> {
        self.db.warm().await
    }

    async fn forget_tenant(&self, tenant: &str) -> Result<(), Error> {
        let tenant = self.own(tenant)?;
        writing!(self, |t| {
            t.lock_clusters(tenant).await?;
            let kept_beside: &[&str] = match t.dialect() {
                // SQLite's index of the tenant's vectors, and its deletion count.
                Dialect::Sqlite => &["memory_marks", "ann_graphs"],
                Dialect::Postgres => &[],
            };
            for table in [
                "memories",
                "cluster_summaries",
                "clusters",
                "data_keys",
                "usage",
                "usage_days",
            ]
            .iter()
            .chain(kept_beside)
            {
                t.exec(
                    &format!("DELETE FROM {table} WHERE tenant = $1"),
                    &[tenant.into()],
                )
                .await?;
            }
            Ok(())
        })?;
        self.tenant_forgotten(tenant).await
    }
}
