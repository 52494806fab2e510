//! Memories, their clusters and cluster summaries behind one trait ([`RecallStore`]), with
//! every call scoped to a tenant: a row of another tenant is simply not found. The in-memory
//! implementation lives here; the SQLite one in `sqlite_recall.rs`.
//!
//! A cluster keeps the sum of its members' vectors and their count, so its centroid updates
//! incrementally (add on write, subtract on delete). A membership change bumps the cluster's
//! version; a summarize run that ends settles the version it saw, so the sweeper finds the
//! clusters whose summary may be stale without the guest. A claim (owner and expiry) keeps two
//! workers from summarizing one cluster at once.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;

pub use abridge_engine::store::{ClusterRow, RecallStore, Unsettled, UsageDay, month_of_day};

use crate::types::{
    Centroid, ClusterSummary, ClusterSummaryWrite, Error, Hit, MemberSet, Memory, MemoryFilter,
    NewMemory, Scope, StoredMemory,
};

/// Text as stored when not sealed (invalid UTF-8 is replaced, never refused).
pub(crate) fn text_in(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Vectors as stored: little-endian f32.
pub fn vector_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A stored vector back.
pub fn vector_from(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

use crate::rules::{self, Ranking, SummaryHit};
pub use crate::rules::{cosine, matches, same_scope};

#[derive(Clone)]
struct MemRow {
    m: Memory,
    model: String,
    vector: Vec<f32>,
    seq: u64,
}

#[derive(Clone)]
struct ClusterState {
    scope: Scope,
    model: String,
    sum: Vec<f32>,
    members: BTreeSet<String>,
    version: u64,
    settled: u64,
    note: Option<String>,
    claim: Option<(String, u64)>,
    changed_seq: u64,
}

#[derive(Default)]
struct TenantTables {
    memories: BTreeMap<String, MemRow>,
    clusters: BTreeMap<u64, ClusterState>,
    summaries: BTreeMap<u64, (ClusterSummary, String, Vec<f32>)>, // by cluster: row, vector model, vector
    next_summary: u64,
    seq: u64,
    /// Memory ids by `seq` (what a vector index folds in since it was last used).
    by_seq: BTreeMap<u64, String>,
}

/// The in-memory tables (inside [`super::MemoryStore`]).
#[derive(Default)]
pub struct RecallTables {
    tenants: BTreeMap<String, TenantTables>,
    /// By tenant and period: a month (`YYYY-MM`) or a day (`YYYY-MM-DD`).
    usage: BTreeMap<(String, String), (u64, u64, u64)>,
    /// Recall's vector indexes (see `ann.rs`).
    ann: crate::ann::AnnIndexes,
}

fn mean(c: &ClusterState) -> Vec<f32> {
    rules::centroid(&c.sum, c.members.len() as u32)
}

impl TenantTables {
    /// A cluster's rows, oldest first.
    fn rows_of(&self, cluster: u64) -> Vec<&MemRow> {
        let ids = self.clusters.get(&cluster).map(|c| &c.members);
        let mut v: Vec<&MemRow> = ids
            .into_iter()
            .flatten()
            .filter_map(|id| self.memories.get(id))
            .collect();
        v.sort_by_key(|r| r.seq);
        v
    }

    fn members(&self, cluster: u64) -> Vec<Memory> {
        self.rows_of(cluster)
            .into_iter()
            .map(|r| r.m.clone())
            .collect()
    }

    fn bump(&mut self, cluster: u64) {
        self.seq += 1;
        let seq = self.seq;
        if let Some(c) = self.clusters.get_mut(&cluster) {
            c.version += 1;
            c.changed_seq = seq;
        }
    }
}

impl RecallTables {
    fn t(&mut self, tenant: &str) -> &mut TenantTables {
        self.tenants.entry(tenant.to_string()).or_default()
    }

    fn centroids(&mut self, tenant: &str, scope: &Scope) -> Vec<Centroid> {
        self.t(tenant)
            .clusters
            .iter()
            .filter(|(_, c)| same_scope(&c.scope, scope) && !c.members.is_empty())
            .map(|(&id, c)| Centroid {
                cluster: id,
                model: c.model.clone(),
                vector: mean(c),
                members: c.members.len() as u32,
            })
            .collect()
    }

    fn put(&mut self, tenant: &str, m: NewMemory) -> Result<StoredMemory, Error> {
        let t = self.t(tenant);
        if let Some(r) = t.memories.get(&m.id) {
            rules::check_same_memory(&r.m, &m)?;
            let members = t.clusters.get(&r.m.cluster).map_or(0, |c| c.members.len()) as u32;
            return Ok(StoredMemory {
                cluster: r.m.cluster,
                created: false,
                members,
            });
        }
        let (cluster, sum) = match m.cluster {
            Some(id) => {
                let found = t.clusters.get(&id);
                rules::check_named_cluster(id, found.map(|c| (&c.scope, c.model.as_str())), &m)?;
                (id, found.map(|c| c.sum.clone()).unwrap_or_default())
            }
            None => (
                t.clusters.keys().next_back().map_or(1, |k| k + 1),
                Vec::new(),
            ),
        };
        let sum = rules::joined_sum(cluster, sum, &m)?;
        t.seq += 1;
        let seq = t.seq;
        let c = t.clusters.entry(cluster).or_insert_with(|| ClusterState {
            scope: m.scope.clone(),
            model: m.model.clone(),
            sum: Vec::new(),
            members: BTreeSet::new(),
            version: 0,
            settled: 0,
            note: None,
            claim: None,
            changed_seq: 0,
        });
        c.sum = sum;
        c.members.insert(m.id.clone());
        let members = c.members.len() as u32;
        t.by_seq.insert(seq, m.id.clone());
        t.memories.insert(
            m.id.clone(),
            MemRow {
                m: Memory {
                    id: m.id,
                    scope: m.scope,
                    text: m.text,
                    importance: m.importance,
                    tokens: m.tokens,
                    created_ms: m.created_ms,
                    cluster,
                    seq,
                },
                model: m.model,
                vector: m.vector,
                seq,
            },
        );
        t.bump(cluster);
        Ok(StoredMemory {
            cluster,
            created: true,
            members,
        })
    }

    fn delete(&mut self, tenant: &str, id: &str) -> Option<Memory> {
        let t = self.t(tenant);
        let r = t.memories.remove(id)?;
        t.by_seq.remove(&r.seq);
        if let Some(c) = t.clusters.get_mut(&r.m.cluster) {
            c.members.remove(id);
            let sum = std::mem::take(&mut c.sum);
            c.sum = rules::left_sum(sum, c.members.len() as u32, &c.model, &r.model, &r.vector);
        }
        t.bump(r.m.cluster);
        if let Some(i) = self.ann.get(tenant, &r.model) {
            // Removing from a graph that holds it cannot fail short of a broken index,
            // which is then dropped (and rebuilt on next need).
            if crate::ann::locked(&i).remove(id).is_err() {
                self.ann.drop_tenant(tenant, Some(&r.model));
            }
        }
        Some(r.m)
    }

    /// Rank the tenant's memories of `model` through its vector index, built on first need
    /// once the tenant holds [`crate::ann::ANN_MIN`] of them and fed the rows written since
    /// it was last used; `false` when the tenant is too small (the caller scans exactly).
    fn ann_memories(
        &mut self,
        tenant: &str,
        q: &[f32],
        model: &str,
        f: &MemoryFilter,
        ranking: &mut Ranking,
        limit: u32,
    ) -> Result<bool, Error> {
        use crate::ann::{ANN_MIN, Meta, TenantIndex, locked};
        let index = match self.ann.get(tenant, model) {
            Some(i) => i,
            None => {
                let t = self.t(tenant);
                if t.memories.values().filter(|r| r.model == model).count() < ANN_MIN {
                    return Ok(false);
                }
                self.ann.put(tenant, model, TenantIndex::new(q.len())?)
            }
        };
        let t = self.t(tenant);
        let mut g = locked(&index);
        let newer: Vec<&String> = t.by_seq.range(g.seq + 1..).map(|(_, id)| id).collect();
        let mut batch = Vec::new();
        for id in newer {
            let Some(r) = t.memories.get(id) else {
                continue;
            };
            if r.model != model {
                continue;
            }
            if r.vector.len() != q.len() {
                drop(g);
                self.ann.drop_tenant(tenant, Some(model));
                return Ok(false);
            }
            let meta = Meta {
                id: r.m.id.clone(),
                scope: r.m.scope.clone(),
                importance: r.m.importance,
                cluster: r.m.cluster,
            };
            batch.push((meta, r.vector.clone()));
        }
        g.add_many(batch)?;
        g.seq = t.seq;
        for (similarity, m) in g.search(q, f, limit as usize)? {
            ranking.memory_at(similarity, || {
                let text = t
                    .memories
                    .get(&m.id)
                    .map(|r| r.m.text.clone())
                    .unwrap_or_default();
                (m.id.clone(), text, m.importance, m.cluster)
            });
        }
        Ok(true)
    }

    fn search(
        &mut self,
        tenant: &str,
        q: &[f32],
        model: &str,
        f: &MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        let mut ranking = Ranking::new(limit);
        let indexed = !f.exact && self.ann_memories(tenant, q, model, f, &mut ranking, limit)?;
        let t = self.t(tenant);
        for r in t.memories.values().filter(|_| !indexed) {
            if r.model != model || !matches(f, &r.m.scope) {
                continue;
            }
            ranking.memory(q, &r.vector, || {
                (
                    r.m.id.clone(),
                    r.m.text.clone(),
                    r.m.importance,
                    r.m.cluster,
                )
            });
        }
        for (cluster, (s, vmodel, v)) in &t.summaries {
            let Some(c) = t.clusters.get(cluster) else {
                continue;
            };
            if vmodel != model || !matches(f, &c.scope) {
                continue;
            }
            ranking.summary(q, v, || SummaryHit {
                id: s.id,
                text: s.text.clone(),
                importance: s.importance,
                cluster: *cluster,
                covered_seq: s.covered_seq,
                covered: s.covered,
            });
        }
        let (mut out, sums) = ranking.into_hits();
        out.extend(sums);
        Ok(out)
    }
}

#[async_trait]
impl RecallStore for super::MemoryStore {
    async fn centroids(&self, tenant: &str, scope: &Scope) -> Result<Vec<Centroid>, Error> {
        Ok(self.recall(|r| r.centroids(tenant, scope)))
    }

    async fn put_memory(&self, tenant: &str, m: NewMemory) -> Result<StoredMemory, Error> {
        self.recall(|r| r.put(tenant, m))
    }

    async fn get_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        Ok(self.recall(|r| r.t(tenant).memories.get(id).map(|x| x.m.clone())))
    }

    async fn cluster_members(&self, tenant: &str, cluster: u64) -> Result<Vec<Memory>, Error> {
        Ok(self.recall(|r| r.t(tenant).members(cluster)))
    }

    async fn members_after(
        &self,
        tenant: &str,
        cluster: u64,
        after: u64,
    ) -> Result<MemberSet, Error> {
        Ok(self.recall(|r| {
            let t = r.t(tenant);
            let rows = t.rows_of(cluster);
            MemberSet {
                version: t.clusters.get(&cluster).map_or(0, |c| c.version),
                count: rows.len() as u32,
                members: rows
                    .into_iter()
                    .filter(|r| r.seq > after)
                    .map(|r| r.m.clone())
                    .collect(),
            }
        }))
    }

    async fn top_members(
        &self,
        tenant: &str,
        cluster: u64,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<Memory>, Error> {
        Ok(self.recall(|r| {
            let mut v = r.t(tenant).members(cluster);
            rules::rank_members(&mut v);
            v.into_iter()
                .skip(offset as usize)
                .take(limit as usize)
                .collect()
        }))
    }

    async fn member_ids(
        &self,
        tenant: &str,
        cluster: u64,
        upto: u64,
    ) -> Result<Vec<String>, Error> {
        Ok(self.recall(|r| {
            r.t(tenant)
                .rows_of(cluster)
                .into_iter()
                .filter(|r| r.seq <= upto)
                .map(|r| r.m.id.clone())
                .collect()
        }))
    }

    async fn delete_memory(&self, tenant: &str, id: &str) -> Result<Option<Memory>, Error> {
        Ok(self.recall(|r| r.delete(tenant, id)))
    }

    async fn set_vectors(
        &self,
        tenant: &str,
        cluster: u64,
        model: &str,
        vectors: Vec<(String, Vec<f32>)>,
    ) -> Result<(), Error> {
        self.recall(|r| {
            // Vectors change model: the tenant's indexes are rebuilt on next need.
            r.ann.drop_tenant(tenant, None);
            let t = r.t(tenant);
            let mut reached = Vec::new();
            for (id, v) in &vectors {
                if let Some(row) = t.memories.get_mut(id)
                    && row.m.cluster == cluster
                {
                    row.vector = v.clone();
                    row.model = model.to_string();
                    reached.push(v.as_slice());
                }
            }
            let sum = rules::sum_of(reached);
            if let Some(c) = t.clusters.get_mut(&cluster) {
                c.model = model.to_string();
                c.sum = sum;
            }
            t.bump(cluster);
            Ok(())
        })
    }

    async fn cluster_summary(
        &self,
        tenant: &str,
        cluster: u64,
    ) -> Result<Option<ClusterSummary>, Error> {
        Ok(self.recall(|r| r.t(tenant).summaries.get(&cluster).map(|s| s.0.clone())))
    }

    async fn summary_by_id(&self, tenant: &str, id: u64) -> Result<Option<ClusterSummary>, Error> {
        Ok(self.recall(|r| {
            r.t(tenant)
                .summaries
                .values()
                .find(|s| s.0.id == id)
                .map(|s| s.0.clone())
        }))
    }

    async fn write_cluster_summary(
        &self,
        tenant: &str,
        w: ClusterSummaryWrite,
    ) -> Result<bool, Error> {
        Ok(self.recall(|r| {
            let t = r.t(tenant);
            let current = t.summaries.get(&w.cluster);
            let Some(c) = t.clusters.get(&w.cluster) else {
                return false;
            };
            let hash = current.map(|s| s.0.member_hash.as_str());
            if !rules::summary_write_allowed(hash, &w, Some(c.version)) {
                return false;
            }
            let current = current.map(|s| (s.0.id, s.0.created_ms));
            let next = &mut t.next_summary;
            let row = rules::summary_written(
                current,
                || {
                    *next += 1;
                    *next
                },
                &w,
            );
            t.summaries
                .insert(w.cluster, (row, w.vector_model, w.vector));
            true
        }))
    }

    async fn delete_cluster_summary(&self, tenant: &str, cluster: u64) -> Result<(), Error> {
        self.recall(|r| r.t(tenant).summaries.remove(&cluster));
        Ok(())
    }

    async fn set_cluster_note(
        &self,
        tenant: &str,
        cluster: u64,
        note: Option<String>,
    ) -> Result<(), Error> {
        self.recall(|r| {
            if let Some(c) = r.t(tenant).clusters.get_mut(&cluster) {
                c.note = note;
            }
        });
        Ok(())
    }

    async fn search(
        &self,
        tenant: &str,
        query: &[f32],
        model: &str,
        filter: &MemoryFilter,
        limit: u32,
    ) -> Result<Vec<Hit>, Error> {
        self.recall(|r| r.search(tenant, query, model, filter, limit))
    }

    async fn list_memories(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Memory>, usize), Error> {
        Ok(self.recall(|r| {
            let mut v: Vec<&MemRow> = r
                .t(tenant)
                .memories
                .values()
                .filter(|x| matches(filter, &x.m.scope))
                .collect();
            v.sort_by_key(|x| x.seq);
            let total = v.len();
            (
                v.into_iter()
                    .skip(offset)
                    .take(limit)
                    .map(|x| x.m.clone())
                    .collect(),
                total,
            )
        }))
    }

    async fn clusters(
        &self,
        tenant: &str,
        filter: &MemoryFilter,
    ) -> Result<Vec<ClusterRow>, Error> {
        Ok(self.recall(|r| {
            let t = r.t(tenant);
            t.clusters
                .iter()
                .filter(|(_, c)| matches(filter, &c.scope) && !c.members.is_empty())
                .map(|(&id, c)| ClusterRow {
                    id,
                    scope: c.scope.clone(),
                    members: c.members.len() as u32,
                    member_ids: t.members(id).into_iter().map(|m| m.id).collect(),
                    summary: t.summaries.get(&id).map(|s| s.0.id),
                    note: c.note.clone(),
                    model: c.model.clone(),
                    version: c.version,
                    settled: c.settled,
                })
                .collect()
        }))
    }

    async fn unsettled(&self, tenant: Option<&str>, limit: usize) -> Result<Vec<Unsettled>, Error> {
        Ok(self.recall(|r| {
            let mut out: Vec<(u64, Unsettled)> = Vec::new();
            for (name, t) in &r.tenants {
                if tenant.is_some_and(|x| x != name) {
                    continue;
                }
                for (&id, c) in &t.clusters {
                    if c.version > c.settled {
                        out.push((
                            c.changed_seq,
                            Unsettled {
                                tenant: name.clone(),
                                cluster: id,
                                version: c.version,
                                user: c.scope.user.clone(),
                                project: c.scope.project.clone(),
                            },
                        ));
                    }
                }
            }
            out.sort_by_key(|x| x.0);
            out.into_iter().take(limit).map(|x| x.1).collect()
        }))
    }

    async fn cluster_version(&self, tenant: &str, cluster: u64) -> Result<Option<u64>, Error> {
        Ok(self.recall(|r| r.t(tenant).clusters.get(&cluster).map(|c| c.version)))
    }

    async fn settle(&self, tenant: &str, cluster: u64, version: u64) -> Result<(), Error> {
        self.recall(|r| {
            if let Some(c) = r.t(tenant).clusters.get_mut(&cluster) {
                c.settled = c.settled.max(version);
            }
        });
        Ok(())
    }

    async fn claim_cluster(
        &self,
        tenant: &str,
        cluster: u64,
        owner: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, Error> {
        Ok(
            self.recall(|r| match r.t(tenant).clusters.get_mut(&cluster) {
                Some(c) => {
                    let free = match &c.claim {
                        None => true,
                        Some((o, until)) => o == owner || *until <= now_ms,
                    };
                    if free {
                        c.claim = Some((owner.to_string(), until_ms));
                    }
                    free
                }
                None => false,
            }),
        )
    }

    async fn release_cluster(&self, tenant: &str, cluster: u64, owner: &str) -> Result<(), Error> {
        self.recall(|r| {
            if let Some(c) = r.t(tenant).clusters.get_mut(&cluster)
                && c.claim.as_ref().is_some_and(|(o, _)| o == owner)
            {
                c.claim = None;
            }
        });
        Ok(())
    }

    async fn add_usage(
        &self,
        tenant: &str,
        day: &str,
        calls: u64,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> Result<(), Error> {
        self.recall(|r| {
            for period in [month_of_day(day), day] {
                let u = r
                    .usage
                    .entry((tenant.to_string(), period.to_string()))
                    .or_default();
                u.0 += calls;
                u.1 += prompt_tokens;
                u.2 += output_tokens;
            }
        });
        Ok(())
    }

    async fn usage_days(&self, tenant: &str, month: &str) -> Result<Vec<UsageDay>, Error> {
        Ok(self.recall(|r| {
            r.usage
                .iter()
                .filter(|((t, p), _)| t == tenant && p.len() == 10 && month_of_day(p) == month)
                .map(|((_, p), u)| UsageDay {
                    day: p.clone(),
                    calls: u.0,
                    prompt_tokens: u.1,
                    output_tokens: u.2,
                })
                .collect()
        }))
    }

    async fn usage(&self, tenant: &str, month: &str) -> Result<(u64, u64, u64), Error> {
        Ok(self.recall(|r| {
            r.usage
                .get(&(tenant.to_string(), month.to_string()))
                .copied()
                .unwrap_or_default()
        }))
    }

    async fn forget_tenant(&self, tenant: &str) -> Result<(), Error> {
        self.recall(|r| {
            r.tenants.remove(tenant);
            r.usage.retain(|(t, _), _| t != tenant);
            r.ann.drop_tenant(tenant, None);
        });
        Ok(())
    }
}
