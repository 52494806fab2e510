//! Approximate nearest-neighbour search over a tenant's memory vectors, for the SQLite store,
//! in a file or in memory (PostgreSQL has pgvector, `pg/ann.rs`).
//!
//! The index is an HNSW graph from `usearch` (Unum's single-header library, Apache-2.0),
//! chosen over the pure-Rust crates because it is the one maintained HNSW that supports all
//! three operations a memory store needs: insert, **remove** (`forget` must take a memory out
//! of every later answer) and **search with a predicate**, so a filter (user, project, kind,
//! key) is applied while the graph is walked instead of cutting a fixed candidate list. With
//! 384-dimension vectors it costs ~1.6 KB of memory per memory (the f32 vector and the graph),
//! and an insert is a graph walk (~0.1–0.3 ms), which is why inserts are not made on the write
//! path: a store folds new rows in at the next search (see [`TenantIndex::seq`]).
//!
//! A build of more than [`BUILD_INLINE`] rows runs on a thread of its own (SQLite: with a read
//! connection of its own) while searches answer by the exact scan.
//!
//! One index per tenant and embedding model, built on the first search of a tenant that holds
//! at least [`ANN_MIN`] vectors (below that the exact scan is as fast), kept in memory only —
//! vectors may be sealed at rest, and an index on disk would hold them in clear. Every answer
//! is reranked with the exact cosine of the stored vectors (the same arithmetic as the exact
//! scan, so both paths agree on every score), and a filter never silently cuts results: a
//! selective filter is answered by an exact scan of the matching vectors, and an index answer
//! shorter than the matching set allows is replaced by one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use crate::rules::{cosine, matches};
use crate::types::{Error, MemoryFilter, Scope};

/// Vectors a tenant must hold (for one model) before an index is built.
pub const ANN_MIN: usize = 2_000;

/// Most rows a search folds into an index itself (a build, or the rows written since the
/// index was last used; ~0.2 s at 384 dimensions). More is built on a thread of its own while
/// searches answer by the exact scan: no search waits for a large build (17 s at 100,000
/// memories), and the store is not held meanwhile.
pub const BUILD_INLINE: usize = 2_500;

/// A filter matching at most this share of the index (or [`ANN_MIN`] vectors, whichever is
/// more) is answered by an exact scan of the matching vectors: a graph walk under a selective
/// predicate loses recall, and the scan is small.
const SELECTIVE: usize = 10;

/// What the index keeps beside each vector: what a filter and a hit need.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Memory id.
    pub id: String,
    /// Its scope (the filter's fields).
    pub scope: Scope,
    /// Its importance.
    pub importance: f32,
    /// Its cluster.
    pub cluster: u64,
}

/// One tenant's index for one embedding model.
pub struct TenantIndex {
    index: Index,
    dim: usize,
    keys: BTreeMap<String, u64>,
    metas: BTreeMap<u64, Meta>,
    next_key: u64,
    /// The highest memory sequence number folded in: rows written after it (by this process
    /// or another one on the same file) are folded in at the next search.
    pub seq: u64,
    /// The tenant's deletion count this index reflects: a store that sees another count (a
    /// deletion by another process) rebuilds.
    pub deletes: u64,
    /// Rows folded in (or taken out) since the graph was last saved; `None` when it is saved
    /// as it is (see [`TenantIndex::saved`]).
    pub unsaved: Option<usize>,
}

/// Rows changed since the last save after which a store saves the graph again.
pub const SAVE_AFTER: usize = 1_000;

/// A graph as saved: the HNSW graph with its vectors, and which memory each key stands for.
pub struct Saved {
    /// The serialized graph (usearch's own format).
    pub graph: Vec<u8>,
    /// `[[key, memory id], ...]` as JSON.
    pub keys: String,
}

fn ann_err(e: impl std::fmt::Display) -> Error {
    Error::Storage(format!("vector index: {e}"))
}

impl TenantIndex {
    /// An empty index for `dim`-dimension vectors.
    pub fn new(dim: usize) -> Result<TenantIndex, Error> {
        let index = Index::new(&IndexOptions {
            dimensions: dim,
            metric: MetricKind::Cos,
            quantization: ScalarKind::F32,
            // HNSW's usual M = 16 and efConstruction = 64: recall@10 at or above 0.99 on the
            // memories benchmark; lower values cost recall, higher ones insert time.
            connectivity: 16,
            expansion_add: 64,
            expansion_search: 64,
            multi: false,
        })
        .map_err(ann_err)?;
        Ok(TenantIndex {
            index,
            dim,
            keys: BTreeMap::new(),
            metas: BTreeMap::new(),
            next_key: 1,
            seq: 0,
            deletes: 0,
            unsaved: Some(0),
        })
    }

    /// The graph and its keys, to save (a copy of the graph's memory: quick, under the lock).
    pub fn saved(&self) -> Result<Saved, Error> {
        let mut graph = vec![0u8; self.index.serialized_length()];
        self.index.save_to_buffer(&mut graph).map_err(ann_err)?;
        let keys: Vec<(u64, &str)> = self
            .metas
            .iter()
            .map(|(k, m)| (*k, m.id.as_str()))
            .collect();
        Ok(Saved {
            graph,
            keys: serde_json::to_string(&keys).expect("keys serialize"),
        })
    }

    /// An index back from a saved graph of `dim`-dimension vectors: `keys` as [`Saved::keys`]
    /// wrote them, and each memory's meta (read again from its row; a memory without one is
    /// gone, and the graph is not used). `None` when the graph does not load.
    pub fn restore(
        dim: usize,
        graph: &[u8],
        keys: &str,
        mut metas: BTreeMap<String, Meta>,
    ) -> Result<Option<TenantIndex>, Error> {
        let Ok(keys) = serde_json::from_str::<Vec<(u64, String)>>(keys) else {
            return Ok(None);
        };
        let mut t = TenantIndex::new(dim)?;
        if t.index.load_from_buffer(graph).is_err() || t.index.dimensions() != dim {
            return Ok(None);
        }
        for (key, id) in keys {
            let Some(meta) = metas.remove(&id) else {
                return Ok(None);
            };
            t.next_key = t.next_key.max(key + 1);
            t.keys.insert(id, key);
            t.metas.insert(key, meta);
        }
        if t.metas.len() != t.index.size() {
            return Ok(None);
        }
        t.unsaved = None;
        Ok(Some(t))
    }

    /// Note `n` rows changed since the last save.
    pub fn changed(&mut self, n: usize) {
        self.unsaved = Some(self.unsaved.unwrap_or(0).saturating_add(n));
    }

    /// Whether the graph is to be saved: [`SAVE_AFTER`] rows changed since the last save, or
    /// there is no saved graph (built here, or the saved one went with a deletion).
    pub fn save_due(&self) -> bool {
        self.unsaved.is_some_and(|n| n >= SAVE_AFTER)
    }

    /// There is no saved graph to load: save this one at the next chance.
    pub fn unsaved_whole(&mut self) {
        self.unsaved = Some(SAVE_AFTER);
    }

    /// Vectors held.
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// Add (or replace) a memory's vector. A vector of another dimension is refused.
    pub fn add(&mut self, meta: Meta, vector: &[f32]) -> Result<(), Error> {
        if vector.len() != self.dim {
            return Err(ann_err(format!(
                "memory {} has {} dimensions, the index {}",
                meta.id,
                vector.len(),
                self.dim
            )));
        }
        self.remove(&meta.id)?;
        if self.index.size() + 1 > self.index.capacity() {
            let want = (self.index.capacity() * 2).max(1024);
            self.index.reserve(want).map_err(ann_err)?;
        }
        let key = self.next_key;
        self.next_key += 1;
        self.index.add(key, vector).map_err(ann_err)?;
        self.keys.insert(meta.id.clone(), key);
        self.metas.insert(key, meta);
        Ok(())
    }

    /// Add many memories at once (a first build, or a large catch-up): the graph inserts run
    /// on every core. Vectors of another dimension are refused before any is added.
    pub fn add_many(&mut self, rows: Vec<(Meta, Vec<f32>)>) -> Result<(), Error> {
        if rows.len() < 256 {
            for (m, v) in rows {
                self.add(m, &v)?;
            }
            return Ok(());
        }
        if let Some((m, v)) = rows.iter().find(|(_, v)| v.len() != self.dim) {
            return Err(ann_err(format!(
                "memory {} has {} dimensions, the index {}",
                m.id,
                v.len(),
                self.dim
            )));
        }
        for (m, _) in &rows {
            self.remove(&m.id)?;
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let want = self.index.size() + rows.len();
        self.index
            .reserve_capacity_and_threads(want.max(self.index.capacity()), threads)
            .map_err(ann_err)?;
        let first = self.next_key;
        self.next_key += rows.len() as u64;
        let index = &self.index;
        let failed = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (rows, failed) = (&rows, &failed);
                s.spawn(move || {
                    for (i, (_, v)) in rows.iter().enumerate().skip(t).step_by(threads) {
                        if let Err(e) = index.add(first + i as u64, v) {
                            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(ann_err(e));
        }
        for (i, (m, _)) in rows.into_iter().enumerate() {
            let key = first + i as u64;
            self.keys.insert(m.id.clone(), key);
            self.metas.insert(key, m);
        }
        Ok(())
    }

    /// Take a memory out (nothing when it is not held).
    pub fn remove(&mut self, id: &str) -> Result<(), Error> {
        if let Some(key) = self.keys.remove(id) {
            self.metas.remove(&key);
            self.index.remove(key).map_err(ann_err)?;
        }
        Ok(())
    }

    fn vector(&self, key: u64) -> Option<Vec<f32>> {
        let mut v = vec![0f32; self.dim];
        match self.index.get(key, &mut v) {
            Ok(n) if n > 0 => Some(v),
            _ => None,
        }
    }

    /// Exact similarities of `keys` to `query`, from the stored vectors.
    fn scored(&self, query: &[f32], keys: impl Iterator<Item = u64>) -> Vec<(f32, &Meta)> {
        keys.filter_map(|k| {
            let meta = self.metas.get(&k)?;
            let v = self.vector(k)?;
            Some((cosine(query, &v), meta))
        })
        .collect()
    }

    /// The memories most similar to `query` under `filter`: at least the `limit` best of the
    /// index's answer, each with its exact cosine similarity (the caller ranks them).
    pub fn search(
        &self,
        query: &[f32],
        filter: &MemoryFilter,
        limit: usize,
    ) -> Result<Vec<(f32, &Meta)>, Error> {
        if query.len() != self.dim || limit == 0 || self.metas.is_empty() {
            return Ok(Vec::new());
        }
        // The graph is asked for the results wanted, at least 40, each re-scored exactly. No
        // oversample: recall already asks the store for four times the results it returns
        // (to weigh importance), and a fourfold oversample on top of that made the walk 1.5×
        // as long at 50,000 memories for no measured gain in recall@10 (0.983 and 0.918 with
        // it, 0.975 and 0.960 without, plaintext and sealed, `cargo bench --bench memories --
        // --sizes 50000 --queries 100`).
        let want = limit.max(40);
        let unfiltered = filter.user.is_none()
            && filter.project.is_none()
            && filter.environment.is_none()
            && filter.kind.is_none()
            && filter.key.is_none();
        // What the filter matches, found once (the selective test and the scan both use it).
        let matched: Option<Vec<u64>> = (!unfiltered).then(|| {
            self.metas
                .iter()
                .filter(|(_, m)| matches(filter, &m.scope))
                .map(|(k, _)| *k)
                .collect()
        });
        let matching = matched.as_ref().map_or(self.metas.len(), Vec::len);
        if matching == 0 {
            return Ok(Vec::new());
        }
        // A selective filter: the exact scan of what it matches.
        let exact = || match &matched {
            Some(keys) => self.scored(query, keys.iter().copied()),
            None => self.scored(query, self.metas.keys().copied()),
        };
        if !unfiltered && matching <= ANN_MIN.max(self.metas.len() / SELECTIVE) {
            return Ok(exact());
        }
        // The walk's breadth (HNSW's ef): twice the candidates, at least 128. Memories often
        // differ by a word, so many lie at nearly the same distance; a narrow walk swaps
        // them for equally close ones the exact scan ranks lower.
        self.index
            .change_expansion_search((want * 2).max(128).min(self.metas.len()));
        let found = if unfiltered {
            self.index.search(query, want).map_err(ann_err)?
        } else {
            self.index
                .filtered_search(query, want, |k: u64| {
                    self.metas
                        .get(&k)
                        .is_some_and(|m| matches(filter, &m.scope))
                })
                .map_err(ann_err)?
        };
        let hits = self.scored(query, found.keys.into_iter());
        // The graph gave fewer than the matching set allows: never cut, scan instead.
        if hits.len() < limit.min(matching) {
            return Ok(exact());
        }
        Ok(hits)
    }
}

/// Indexes by tenant and model.
type ByTenant = BTreeMap<(String, String), Arc<Mutex<TenantIndex>>>;

/// Every tenant's indexes in one process, by tenant and model, and the builds under way (a
/// clone shares them, for a build's thread).
#[derive(Clone, Default)]
pub struct AnnIndexes {
    map: Arc<Mutex<ByTenant>>,
    building: Arc<Mutex<BTreeSet<(String, String)>>>,
}

impl AnnIndexes {
    /// The index of `tenant` and `model`, if one was built.
    pub fn get(&self, tenant: &str, model: &str) -> Option<Arc<Mutex<TenantIndex>>> {
        self.lock()
            .get(&(tenant.to_string(), model.to_string()))
            .cloned()
    }

    /// Keep `index` as the tenant's for `model`.
    pub fn put(&self, tenant: &str, model: &str, index: TenantIndex) -> Arc<Mutex<TenantIndex>> {
        let i = Arc::new(Mutex::new(index));
        self.lock()
            .insert((tenant.to_string(), model.to_string()), i.clone());
        i
    }

    /// Forget every index of `tenant` (its memories were deleted), or one model's.
    pub fn drop_tenant(&self, tenant: &str, model: Option<&str>) {
        self.lock()
            .retain(|(t, m), _| t != tenant || model.is_some_and(|x| x != m));
    }

    /// Mark a build of `tenant`'s index of `model` as started; false when one already is.
    pub fn start_build(&self, tenant: &str, model: &str) -> bool {
        self.building
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((tenant.to_string(), model.to_string()))
    }

    /// A build of `tenant`'s index of `model` ended (done or given up).
    pub fn end_build(&self, tenant: &str, model: &str) {
        self.building
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(tenant.to_string(), model.to_string()));
    }

    /// Whether a build of `tenant`'s index of `model` is under way.
    pub fn building(&self, tenant: &str, model: &str) -> bool {
        self.building
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(tenant.to_string(), model.to_string()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByTenant> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Lock a tenant index (a panic elsewhere never poisons recall).
pub fn locked(i: &Mutex<TenantIndex>) -> std::sync::MutexGuard<'_, TenantIndex> {
    i.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(i: usize) -> Meta {
        Meta {
            id: format!("m{i}"),
            scope: Scope {
                user: format!("u{}", i % 50),
                project: "p".into(),
                environment: String::new(),
                kind: "fact".into(),
                key: format!("k{}", i % 7),
            },
            importance: 0.5,
            cluster: i as u64,
        }
    }

    fn vectors(n: usize, dim: usize) -> Vec<Vec<f32>> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let centers: Vec<Vec<f32>> = (0..40)
            .map(|_| (0..dim).map(|_| next()).collect())
            .collect();
        (0..n)
            .map(|i| centers[i % 40].iter().map(|c| c + 0.5 * next()).collect())
            .collect()
    }

    fn exact_top(
        data: &[Vec<f32>],
        q: &[f32],
        f: &MemoryFilter,
        k: usize,
        gone: &[usize],
    ) -> Vec<String> {
        let mut all: Vec<(f32, usize)> = data
            .iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i) && matches(f, &meta(*i).scope))
            .map(|(i, v)| (cosine(q, v), i))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        all.into_iter()
            .take(k)
            .map(|(_, i)| format!("m{i}"))
            .collect()
    }

    fn top(idx: &TenantIndex, q: &[f32], f: &MemoryFilter, k: usize) -> Vec<String> {
        let mut hits = idx.search(q, f, k).unwrap();
        hits.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
        hits.into_iter()
            .take(k)
            .map(|(_, m)| m.id.clone())
            .collect()
    }

    #[test]
    fn recall_at_10_holds_with_and_without_filters_and_removed_memories_are_gone() {
        let (n, dim) = (6_000, 48);
        let data = vectors(n, dim);
        let mut idx = TenantIndex::new(dim).unwrap();
        // Half one by one, half in one batch on every core.
        for (i, v) in data.iter().enumerate().take(n / 2) {
            idx.add(meta(i), v).unwrap();
        }
        idx.add_many(
            data.iter()
                .enumerate()
                .skip(n / 2)
                .map(|(i, v)| (meta(i), v.clone()))
                .collect(),
        )
        .unwrap();
        assert_eq!(idx.len(), n);
        let gone: Vec<usize> = (0..n).step_by(9).collect();
        for &i in &gone {
            idx.remove(&format!("m{i}")).unwrap();
        }
        let queries = vectors(60, dim);
        let filters = [
            MemoryFilter::default(),
            MemoryFilter {
                key: Some("k3".into()),
                ..MemoryFilter::default()
            },
            MemoryFilter {
                user: Some("u7".into()),
                ..MemoryFilter::default()
            },
        ];
        for f in &filters {
            let (mut agree, mut total) = (0, 0);
            for q in &queries {
                let want = exact_top(&data, q, f, 10, &gone);
                let got = top(&idx, q, f, 10);
                assert_eq!(got.len(), want.len(), "a filter never cuts results");
                for id in &got {
                    let i: usize = id[1..].parse().unwrap();
                    assert!(!gone.contains(&i), "{id} was removed");
                }
                total += want.len();
                agree += want.iter().filter(|id| got.contains(id)).count();
            }
            let recall = agree as f64 / total as f64;
            assert!(recall >= 0.95, "recall@10 {recall:.3} under {f:?}");
        }
    }

    #[test]
    fn a_vector_of_another_dimension_is_refused() {
        let mut idx = TenantIndex::new(4).unwrap();
        assert!(idx.add(meta(1), &[1.0, 0.0]).is_err());
        idx.add(meta(1), &[1.0, 0.0, 0.0, 0.0]).unwrap();
        idx.add(meta(1), &[0.0, 1.0, 0.0, 0.0]).unwrap();
        assert_eq!(idx.len(), 1, "a second add replaces");
        assert!(
            idx.search(&[1.0], &MemoryFilter::default(), 5)
                .unwrap()
                .is_empty()
        );
    }
}
