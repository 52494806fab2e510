//! Recall's search, written once for both databases: the candidates (through the store's
//! index, or an exact scan), the summaries of the candidates' clusters, and the texts of the
//! hits kept, with the SQL in the store's [`Dialect`]. A store supplies only its row plumbing
//! ([`SearchRows`]): how it runs a statement, reads its index and opens a sealed text.

use std::collections::BTreeSet;

use crate::keyring::{Stored, VectorKeys};
use crate::rules::{Dialect, Ranking, SummaryHit, filter_sql};
use crate::types::{Error, Hit, MemoryFilter};

/// The vector columns, as named in a sealed vector's associated data.
pub(crate) const VECTOR: &str = "memories.vector";
pub(crate) const SUMMARY_VECTOR: &str = "cluster_summaries.vector";

/// A memory the index found, with its similarity to the query.
pub(crate) struct Candidate {
    /// Cosine similarity to the query.
    pub similarity: f32,
    /// The memory's id.
    pub id: String,
    /// Its importance.
    pub importance: f32,
    /// Its cluster.
    pub cluster: u64,
}

/// A memory row of a scan: its id, stored vector, importance and cluster.
pub(crate) type MemoryRow<'a> = (String, &'a [u8], f32, u64);

/// A summary row of a scan: its id, stored vector, importance, cluster, newest covered
/// member and how many members it covers.
pub(crate) type SummaryRow<'a> = (u64, &'a [u8], f32, u64, u64, u32);

/// What a store gives the search: its statements' rows, its index and its sealing.
pub(crate) trait SearchRows {
    /// The dialect its SQL is written in.
    fn dialect(&self) -> Dialect;

    /// The tenant's vector keys for this call.
    async fn vector_keys(&mut self) -> Result<VectorKeys, Error>;

    /// The index's candidates for `query` among the rows the filter (`fsql` with `args`, the
    /// model last) selects, at least the best `limit`; `None` when the index does not answer
    /// (too few rows, being built, vectors sealed, or none on this store) and the search
    /// scans.
    async fn indexed(
        &mut self,
        vk: &VectorKeys,
        query: &[f32],
        filter: &MemoryFilter,
        filter_sql: (&str, &[String]),
        limit: u32,
    ) -> Result<Option<Vec<Candidate>>, Error>;

    /// Each memory row of `sql` with `args`.
    async fn memories(
        &mut self,
        sql: &str,
        args: &[String],
        each: &mut (dyn FnMut(MemoryRow<'_>) -> Result<(), Error> + Send),
    ) -> Result<(), Error>;

    /// Each summary row of `sql` with `args`.
    async fn summaries(
        &mut self,
        sql: &str,
        args: &[String],
        each: &mut (dyn FnMut(SummaryRow<'_>) -> Result<(), Error> + Send),
    ) -> Result<(), Error>;

    /// The stored text of the one row of `sql` with `args`.
    async fn stored(&mut self, sql: &str, args: &[String]) -> Result<Stored, Error>;

    /// A stored text of `table`'s row `id`, opened.
    async fn reveal(&mut self, table: &str, id: &str, stored: Stored) -> Result<String, Error>;
}

/// The `limit` memories nearest `query` and the `limit` nearest summaries of their clusters
/// (of every cluster, when the search scanned), texts opened for the hits kept only.
pub(crate) async fn search<R: SearchRows + Send>(
    rows: &mut R,
    tenant: &str,
    query: &[f32],
    model: &str,
    filter: &MemoryFilter,
    limit: u32,
) -> Result<Vec<Hit>, Error> {
    let d = rows.dialect();
    let p = |n: usize| d.param(n);
    let vk = rows.vector_keys().await?;
    let mut ranking = Ranking::new(limit);
    let (fsql, mut args) = filter_sql(d, tenant, filter, "");
    args.push(model.to_string());
    let found = if filter.exact {
        None
    } else {
        rows.indexed(&vk, query, filter, (&fsql, &args), limit)
            .await?
    };
    // Through the index, the clusters of the best `limit` name the summaries to rank (a
    // summary's text is its members': one no candidate belongs to is not near the query);
    // the exact scan ranks every summary.
    let near: Option<BTreeSet<u64>> = match found {
        Some(mut found) => {
            found.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
            let near = found
                .iter()
                .take(limit as usize)
                .map(|c| c.cluster)
                .collect();
            for c in found {
                ranking.memory_at(c.similarity, || {
                    (c.id, String::new(), c.importance, c.cluster)
                });
            }
            Some(near)
        }
        None => {
            // Without statistics SQLite prefers scanning the tenant's primary key over the
            // user index once a column outside it is read.
            let hint = match d {
                Dialect::Sqlite if filter.user.is_some() => " INDEXED BY memories_user",
                _ => "",
            };
            let sql = format!(
                "SELECT id, vector, importance, cluster FROM memories{hint} WHERE tenant = {}{fsql} AND model = {}",
                p(1),
                p(args.len())
            );
            rows.memories(&sql, &args, &mut |(id, bytes, importance, cluster)| {
                let v = vk.open(VECTOR, &id, bytes)?;
                ranking.memory(query, &v, || (id, String::new(), importance, cluster));
                Ok(())
            })
            .await?;
            None
        }
    };
    let (fsql, mut args) = filter_sql(d, tenant, filter, "c.");
    args.push(model.to_string());
    let model_at = args.len();
    // Each summary found by its cluster (a list in a subquery would read every summary of
    // the tenant).
    let (from, among) = match (&near, d) {
        (None, _) => ("cluster_summaries s".to_string(), String::new()),
        (Some(near), Dialect::Sqlite) => {
            args.push(serde_json::to_string(near).expect("ids serialize"));
            let from = format!(
                "json_each({}) j CROSS JOIN cluster_summaries s ON s.tenant = {} AND s.cluster = j.value",
                p(args.len()),
                p(1)
            );
            (from, String::new())
        }
        (Some(near), Dialect::Postgres) => {
            let list: Vec<String> = near.iter().map(u64::to_string).collect();
            args.push(list.join(","));
            let among = format!(
                " AND s.cluster = ANY(string_to_array(NULLIF({}, ''), ',')::bigint[])",
                p(args.len())
            );
            ("cluster_summaries s".to_string(), among)
        }
    };
    let sql = format!(
        "SELECT s.id, s.vector, s.importance, s.cluster, s.covered_seq, s.covered FROM {from} JOIN clusters c ON c.tenant = s.tenant AND c.id = s.cluster WHERE s.tenant = {}{fsql} AND s.vector_model = {}{among}",
        p(1),
        p(model_at)
    );
    rows.summaries(&sql, &args, &mut |(
        id,
        bytes,
        importance,
        cluster,
        covered_seq,
        covered,
    )| {
        let v = vk.open(SUMMARY_VECTOR, &id.to_string(), bytes)?;
        ranking.summary(query, &v, || SummaryHit {
            id,
            text: String::new(),
            importance,
            cluster,
            covered_seq,
            covered,
        });
        Ok(())
    })
    .await?;
    // Only the hits kept are opened.
    let (mut hits, sums) = ranking.into_hits();
    let text_of = |table: &str, id: &str| {
        format!(
            "SELECT text, sealed FROM {table} WHERE tenant = {} AND id = {}",
            p(1),
            id
        )
    };
    let memory_sql = text_of("memories", &p(2));
    for h in &mut hits {
        let st = rows
            .stored(&memory_sql, &[tenant.to_string(), h.id.clone()])
            .await?;
        h.text = rows.reveal("memories", &h.id, st).await?;
    }
    // A summary's id is a number (PostgreSQL takes the parameter as text and converts it).
    let summary_sql = text_of(
        "cluster_summaries",
        &match d {
            Dialect::Sqlite => p(2),
            Dialect::Postgres => format!("{}::text::bigint", p(2)),
        },
    );
    for mut h in sums {
        let st = rows
            .stored(&summary_sql, &[tenant.to_string(), h.id.clone()])
            .await?;
        h.text = rows.reveal("cluster_summaries", &h.id, st).await?;
        hits.push(h);
    }
    Ok(hits)
}
