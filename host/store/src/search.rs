//! Recall's search, written once for both databases: the candidates (through the store's
//! index, or an exact scan), the summaries of the candidates' clusters, and the texts of the
//! hits kept, with the SQL in the store's [`Dialect`]. A store supplies only its plumbing
//! ([`Tx`]): how it runs a statement, reads its index and opens a sealed text.

use std::collections::BTreeSet;

use crate::keyring::Stored;
use crate::rules::{Dialect, Ranking, SummaryHit, filter_sql};
use crate::sql::{SUMMARY_VECTOR, Tx, VECTOR, Val};
use crate::types::{Error, Hit, MemoryFilter};

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

/// The `limit` memories nearest `query` and the `limit` nearest summaries of their clusters
/// (of every cluster, when the search scanned), texts opened for the hits kept only; the
/// tenant's vectors of `model` are searched (the index's key), with `filter`.
pub(crate) async fn search(
    rows: &mut impl Tx,
    (tenant, model): (&str, &str),
    (query, filter, limit): (&[f32], &MemoryFilter, u32),
) -> Result<Vec<Hit>, Error> {
    let d = rows.dialect();
    let p = |n: usize| d.param(n);
    let vk = rows.vector_keys(tenant).await?;
    let mut ranking = Ranking::new(limit);
    let (fsql, args) = filter_sql(d, tenant, filter, "");
    let mut args: Vec<Val> = args.into_iter().map(Val::from).collect();
    args.push(model.into());
    let found = if filter.exact {
        None
    } else {
        rows.indexed(&vk, (tenant, model), query, filter, (&fsql, &args), limit)
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
            rows.each(&sql, &args, &mut |r| {
                let id = r.text(0)?;
                let v = vk.open(VECTOR, &id, r.blob(1)?)?;
                let (importance, cluster) = (r.real(2)? as f32, r.u64(3)?);
                ranking.memory(query, &v, || (id, String::new(), importance, cluster));
                Ok(())
            })
            .await?;
            None
        }
    };
    let (fsql, args) = filter_sql(d, tenant, filter, "c.");
    let mut args: Vec<Val> = args.into_iter().map(Val::from).collect();
    args.push(model.into());
    let model_at = args.len();
    // Each summary found by its cluster (a list in a subquery would read every summary of
    // the tenant).
    let (from, among) = match (&near, d) {
        (None, _) => ("cluster_summaries s".to_string(), String::new()),
        (Some(near), Dialect::Sqlite) => {
            args.push(serde_json::to_string(near).expect("ids serialize").into());
            let from = format!(
                "json_each({}) j CROSS JOIN cluster_summaries s ON s.tenant = {} AND s.cluster = j.value",
                p(args.len()),
                p(1)
            );
            (from, String::new())
        }
        (Some(near), Dialect::Postgres) => {
            let list: Vec<String> = near.iter().map(u64::to_string).collect();
            args.push(list.join(",").into());
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
    rows.each(&sql, &args, &mut |r| {
        let id = r.u64(0)?;
        let v = vk.open(SUMMARY_VECTOR, &id.to_string(), r.blob(1)?)?;
        let hit = SummaryHit {
            id,
            text: String::new(),
            importance: r.real(2)? as f32,
            cluster: r.u64(3)?,
            covered_seq: r.u64(4)?,
            covered: r.int(5)? as u32,
        };
        ranking.summary(query, &v, || hit);
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
    // A memory's text, and its successor when it was superseded.
    let memory_sql = format!(
        "SELECT text, sealed, superseded_by, superseded_ms FROM memories WHERE tenant = {} AND id = {}",
        p(1),
        p(2)
    );
    for h in &mut hits {
        let r = rows
            .row(&memory_sql, &[tenant.into(), h.id.as_str().into()])
            .await?
            .ok_or_else(|| Error::Storage("a hit's row vanished during the search".into()))?;
        let st = Stored {
            bytes: r.bytes(0)?,
            sealed: r.int(1)? as u32,
        };
        h.superseded_by = r.opt_text(2)?;
        h.superseded_ms = r.u64(3)?;
        h.text = rows.reveal(tenant, "memories", &h.id, st).await?;
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
        let st = stored(rows, &summary_sql, &[tenant.into(), h.id.as_str().into()]).await?;
        h.text = rows.reveal(tenant, "cluster_summaries", &h.id, st).await?;
        hits.push(h);
    }
    Ok(hits)
}

/// The stored text of the one row of `sql` (columns: text, sealed).
async fn stored(rows: &mut impl Tx, sql: &str, args: &[Val]) -> Result<Stored, Error> {
    let r = rows
        .row(sql, args)
        .await?
        .ok_or_else(|| Error::Storage("a hit's row vanished during the search".into()))?;
    Ok(Stored {
        bytes: r.bytes(0)?,
        sealed: r.int(1)? as u32,
    })
}
