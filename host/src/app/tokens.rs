//! API tokens: random bearer tokens, each tied to one tenant, stored only as a SHA-256 hash.

use std::sync::Arc;

use rusqlite::{OptionalExtension, params};
use sha2::{Digest, Sha256};

use super::error::{AppError, AppResult, ErrorKind};
use crate::store::SqliteStore;
use crate::tenant::Tenant;
use crate::types::Error;

/// What a token grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The token's row id.
    pub id: u64,
    /// Its tenant.
    pub tenant: Tenant,
    /// Whether it may only read.
    pub read_only: bool,
}

/// A token as listed (never the token itself).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TokenInfo {
    /// Row id (what `tokens revoke` takes).
    pub id: u64,
    /// Tenant.
    pub tenant: String,
    /// The token's first characters, to recognise it.
    pub prefix: String,
    /// Read-only.
    pub read_only: bool,
    /// A label given at creation.
    pub label: Option<String>,
    /// Created, ms since the epoch.
    pub created_ms: u64,
    /// Revoked, ms since the epoch.
    pub revoked_ms: Option<u64>,
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

fn hash(token: &str) -> String {
    crate::text::hex(&Sha256::digest(token.as_bytes()))
}

/// The `tokens` table.
#[derive(Clone)]
pub struct Tokens {
    db: Arc<SqliteStore>,
}

impl Tokens {
    /// Tokens kept in `db`.
    pub fn new(db: Arc<SqliteStore>) -> Self {
        Tokens { db }
    }

    /// Create a token for `tenant`; returns the token (shown once) and its row id.
    pub fn create(
        &self,
        tenant: &Tenant,
        read_only: bool,
        label: Option<&str>,
        now_ms: u64,
    ) -> AppResult<(String, u64)> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| {
            AppError::new(
                ErrorKind::Internal,
                format!("the system's random source failed: {e}"),
            )
        })?;
        let token = format!("abr_{}", crate::text::hex(&raw));
        let prefix: String = token.chars().take(10).collect();
        let id = self.db.with(|c| {
            c.execute(
                "INSERT INTO tokens (tenant, hash, prefix, read_only, label, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![tenant.name(), hash(&token), prefix, read_only as i64, label, now_ms as i64],
            )
            .map_err(db_err)?;
            Ok(c.last_insert_rowid() as u64)
        })?;
        Ok((token, id))
    }

    /// Every token, oldest first.
    pub fn list(&self) -> AppResult<Vec<TokenInfo>> {
        Ok(self.db.with(|c| {
            let mut st = c
                .prepare("SELECT id, tenant, prefix, read_only, label, created_ms, revoked_ms FROM tokens ORDER BY id")
                .map_err(db_err)?;
            st.query_map([], |r| {
                Ok(TokenInfo {
                    id: r.get::<_, i64>(0)? as u64,
                    tenant: r.get(1)?,
                    prefix: r.get(2)?,
                    read_only: r.get::<_, i64>(3)? != 0,
                    label: r.get(4)?,
                    created_ms: r.get::<_, i64>(5)? as u64,
                    revoked_ms: r.get::<_, Option<i64>>(6)?.map(|x| x as u64),
                })
            })
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })?)
    }

    /// Revoke token `id`; false when there is no such live token.
    pub fn revoke(&self, id: u64, now_ms: u64) -> AppResult<bool> {
        Ok(self.db.with(|c| {
            c.execute(
                "UPDATE tokens SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms IS NULL",
                params![id as i64, now_ms as i64],
            )
            .map(|n| n > 0)
            .map_err(db_err)
        })?)
    }

    /// Whether any live token exists.
    pub fn any_live(&self) -> AppResult<bool> {
        Ok(self.db.with(|c| {
            c.query_row(
                "SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_ms IS NULL)",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n != 0)
            .map_err(db_err)
        })?)
    }

    /// What a presented token grants, if it is live.
    pub fn check(&self, token: &str) -> AppResult<Option<Grant>> {
        let h = hash(token);
        let row = self.db.with(|c| {
            c.query_row(
                "SELECT id, tenant, read_only FROM tokens WHERE hash = ?1 AND revoked_ms IS NULL",
                [&h],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)? != 0,
                    ))
                },
            )
            .optional()
            .map_err(db_err)
        })?;
        Ok(row.and_then(|(id, t, read_only)| {
            Tenant::new(&t).ok().map(|tenant| Grant {
                id,
                tenant,
                read_only,
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_hash_is_stored_and_revoked_tokens_fail() {
        let db = Arc::new(SqliteStore::in_memory().unwrap());
        let t = Tokens::new(db.clone());
        let acme = Tenant::new("acme").unwrap();
        let (tok, id) = t.create(&acme, false, Some("ci"), 5).unwrap();
        assert!(tok.starts_with("abr_") && tok.len() == 68);
        let g = t.check(&tok).unwrap().unwrap();
        assert_eq!((g.tenant, g.read_only), (acme, false));
        assert_eq!(t.check("abr_nope").unwrap(), None);
        let stored: String = db
            .with(|c| {
                c.query_row("SELECT group_concat(hash || prefix) FROM tokens", [], |r| {
                    r.get(0)
                })
                .map_err(db_err)
            })
            .unwrap();
        assert!(!stored.contains(&tok[10..]));
        assert!(t.revoke(id, 6).unwrap());
        assert!(!t.revoke(id, 7).unwrap());
        assert_eq!(t.check(&tok).unwrap(), None);
        assert!(!t.any_live().unwrap());
    }
}
