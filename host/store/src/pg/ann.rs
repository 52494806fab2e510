//! Recall through pgvector, when the server has the extension: memories keep their vector a
//! second time as a pgvector `embedding`, and each embedding model gets an HNSW index (cosine
//! distance) over `embedding::vector(dim)` for its rows. A search asks the index for the
//! nearest memories of the tenant; when that fails, or finds fewer than asked for (the index
//! filters by tenant after its own search), the exact scan answers instead, so results never
//! get worse than without the extension.

use std::collections::BTreeSet;

use deadpool_postgres::GenericClient;
use sha2::{Digest, Sha256};

use super::{P, PgDb, g64};
use crate::types::Error;

/// A memory the index found: id, importance, cluster and cosine similarity.
pub(super) type AnnHit = (String, f32, u64, f32);

/// pgvector's text form of `v` (`[0.5,1,-2]`), or `None` when a value is not finite (pgvector
/// refuses those; such a memory is found by the exact scan only).
pub(super) fn vector_text(v: &[f32]) -> Option<String> {
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    Some(format!("[{}]", parts.join(",")))
}

/// `s` as an SQL string literal (the index predicate must name the model as a constant).
pub(super) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The index of one model's vectors.
fn index_name(model: &str, dim: usize) -> String {
    let h = Sha256::digest(format!("{model}\u{1f}{dim}").as_bytes());
    let hex: String = h.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("memories_ann_{hex}")
}

impl PgDb {
    /// Use pgvector when the server has it (and this user may create it): add the
    /// `embedding` column and fill it for rows written before. Returns whether it is on.
    pub(super) async fn enable_ann(&self) -> Result<bool, Error> {
        let c = self.client().await?;
        let available: bool = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')",
                &[],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        if !available {
            return Ok(false);
        }
        if let Err(e) = c
            .batch_execute(
                "CREATE EXTENSION IF NOT EXISTS vector; ALTER TABLE memories ADD COLUMN IF NOT EXISTS embedding vector",
            )
            .await
        {
            tracing::warn!(error = %self.err(e), "pgvector is installed but cannot be enabled here; recall uses the exact scan");
            return Ok(false);
        }
        // Rows stored before (or while the extension was missing) get their embedding.
        loop {
            let rows = c
                .query(
                    "SELECT tenant, id, vector FROM memories WHERE embedding IS NULL AND octet_length(vector) > 0 AND octet_length(vector) % 4 = 0 LIMIT 500",
                    &[],
                )
                .await
                .map_err(|e| self.err(e))?;
            let mut set = 0;
            for r in &rows {
                let v = crate::recall::vector_from(r.get::<_, &[u8]>(2));
                let (tenant, id): (String, String) = (r.get(0), r.get(1));
                if self.write_embedding(&c, (&tenant, &id), &v).await? {
                    set += 1;
                }
            }
            if set == 0 {
                return Ok(true);
            }
        }
    }

    /// Store `v` as the memory's pgvector embedding (when pgvector is on); whether it was.
    pub(super) async fn set_embedding<C: GenericClient + Sync>(
        &self,
        c: &C,
        tenant: &str,
        id: &str,
        v: &[f32],
    ) -> Result<bool, Error> {
        if !self.ann {
            return Ok(false);
        }
        if self.sealing.vectors {
            // A sealed vector has no clear copy: one left from before sealing goes.
            c.execute(
                "UPDATE memories SET embedding = NULL WHERE tenant = $1 AND id = $2",
                &[&tenant, &id],
            )
            .await
            .map_err(|e| self.err(e))?;
            return Ok(false);
        }
        self.write_embedding(c, (tenant, id), v).await
    }

    /// Write `v` as the embedding of the memory keyed `(tenant, id)`; whether it was.
    async fn write_embedding<C: GenericClient + Sync>(
        &self,
        c: &C,
        (tenant, id): (&str, &str),
        v: &[f32],
    ) -> Result<bool, Error> {
        let Some(text) = vector_text(v) else {
            return Ok(false);
        };
        c.execute(
            "UPDATE memories SET embedding = $3::text::vector WHERE tenant = $1 AND id = $2",
            &[&tenant, &id, &text],
        )
        .await
        .map_err(|e| self.err(e))?;
        Ok(true)
    }

    /// The tenant's `limit` memories nearest `query` by the model's index (made on first
    /// use), or `None` when the exact scan must answer.
    pub(super) async fn ann_search<C: GenericClient + Sync>(
        &self,
        c: &C,
        query: &[f32],
        model: &str,
        fsql: &str,
        args: &[crate::sql::Val],
        limit: u32,
    ) -> Option<Vec<AnnHit>> {
        if !self.ann {
            return None;
        }
        let q = vector_text(query)?;
        let dim = query.len();
        let index = index_name(model, dim);
        let known = self
            .ann_indexes
            .lock()
            .expect("index list lock")
            .contains(&index);
        if !known {
            let made = c
                .batch_execute(&format!(
                    "CREATE INDEX IF NOT EXISTS {index} ON memories USING hnsw ((embedding::vector({dim})) vector_cosine_ops) WHERE model = {}",
                    literal(model)
                ))
                .await;
            if let Err(e) = made {
                tracing::warn!(error = %self.err(e), "cannot index the memories' vectors; recall uses the exact scan");
                return None;
            }
            self.ann_indexes
                .lock()
                .expect("index list lock")
                .insert(index);
        }
        let n = args.len() + 1;
        let sql = format!(
            "SELECT id, importance, cluster, embedding::vector({dim}) <=> ${n}::text::vector({dim}) AS d FROM memories
             WHERE tenant = $1{fsql} AND model = {} AND embedding IS NOT NULL
             ORDER BY embedding::vector({dim}) <=> ${n}::text::vector({dim}) LIMIT {limit}",
            literal(model)
        );
        let mut params: Vec<P<'_>> = args.iter().map(|a| a as P<'_>).collect();
        params.push(&q);
        let rows = match c.query(&sql, &params).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %self.err(e), "the vector index failed; recall uses the exact scan");
                return None;
            }
        };
        // The index filters by tenant after its own search: too few means "ask exactly".
        if rows.len() < limit as usize {
            return None;
        }
        Some(
            rows.iter()
                .map(|r| {
                    (
                        r.get::<_, String>(0),
                        r.get::<_, f64>(1) as f32,
                        g64(r, 2),
                        1.0 - r.get::<_, f64>(3) as f32,
                    )
                })
                .collect(),
        )
    }
}

/// Indexes made by this store (each is made once per process; `IF NOT EXISTS` covers the
/// other instances).
pub(super) type Indexes = std::sync::Mutex<BTreeSet<String>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_and_model_names_are_written_as_pgvector_and_sql_read_them() {
        assert_eq!(
            vector_text(&[0.5, 1.0, -2.25]).as_deref(),
            Some("[0.5,1,-2.25]")
        );
        assert_eq!(vector_text(&[f32::NAN, 1.0]), None);
        assert_eq!(vector_text(&[]), None);
        assert_eq!(literal("o'brien:7b"), "'o''brien:7b'");
        assert_ne!(index_name("a", 3), index_name("a", 4));
        assert!(
            index_name("x'; DROP TABLE memories; --", 3)
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        );
    }
}
