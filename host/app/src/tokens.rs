//! API tokens: random bearer tokens, each tied to one tenant, stored only as a SHA-256 hash.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::error::{AppError, AppResult, ErrorKind};
use crate::store::{TokenRow, TokenStore};
use crate::tenant::Tenant;

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
pub type TokenInfo = TokenRow;

/// One of a tenant's API tokens as the API shows it: never the token itself.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TokenView {
    /// Its id (what revoking takes).
    pub id: u64,
    /// The token's first characters, to recognise it.
    pub prefix: String,
    /// Whether it may only read.
    pub read_only: bool,
    /// The label given at creation.
    pub label: Option<String>,
    /// Created, ms since the epoch.
    pub created_ms: u64,
    /// Revoked, ms since the epoch; none while it is live.
    pub revoked_ms: Option<u64>,
}

impl From<TokenRow> for TokenView {
    fn from(r: TokenRow) -> Self {
        TokenView {
            id: r.id,
            prefix: r.prefix,
            read_only: r.read_only,
            label: r.label,
            created_ms: r.created_ms,
            revoked_ms: r.revoked_ms,
        }
    }
}

/// A token just created: the only answer that holds the token itself.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    /// The bearer token. Shown once: only its hash is kept.
    pub token: String,
    /// Its id (what revoking takes).
    pub id: u64,
    /// The token's first characters, as listings show them.
    pub prefix: String,
    /// Whether it may only read.
    pub read_only: bool,
    /// The label given.
    pub label: Option<String>,
    /// Created, ms since the epoch.
    pub created_ms: u64,
}

/// The first characters of a token, kept in clear to recognise it by.
pub fn prefix_of(token: &str) -> String {
    token.chars().take(10).collect()
}

/// Check a token's label: at most 200 characters, no control characters.
pub fn check_label(label: &str) -> AppResult<()> {
    if label.chars().count() > 200 || label.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "a token label is at most 200 characters without control characters",
        ));
    }
    Ok(())
}

fn hash(token: &str) -> String {
    crate::text::hex(&Sha256::digest(token.as_bytes()))
}

/// The API tokens of a store.
#[derive(Clone)]
pub struct Tokens {
    db: Arc<dyn TokenStore>,
}

impl Tokens {
    /// The tokens of the database at `db` (created or migrated if need be), for administration
    /// outside a running app (`abridge tokens`).
    pub fn open(db: &std::path::Path) -> crate::AppResult<Self> {
        Ok(Self::new(crate::db::open(db, None)?))
    }

    /// Tokens kept in `db`.
    pub fn new(db: Arc<dyn TokenStore>) -> Self {
        Tokens { db }
    }

    /// Create a token for `tenant`; returns the token (shown once) and its row id.
    pub async fn create(
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
        let prefix = prefix_of(&token);
        let id = self
            .db
            .insert_token(
                tenant.name(),
                &hash(&token),
                &prefix,
                read_only,
                label,
                now_ms,
            )
            .await?;
        Ok((token, id))
    }

    /// Every token, oldest first.
    pub async fn list(&self) -> AppResult<Vec<TokenInfo>> {
        Ok(self.db.tokens().await?)
    }

    /// Revoke token `id`; false when there is no such live token.
    pub async fn revoke(&self, id: u64, now_ms: u64) -> AppResult<bool> {
        Ok(self.db.revoke_token(id, now_ms).await?)
    }

    /// Whether any live token exists.
    pub async fn any_live(&self) -> AppResult<bool> {
        Ok(self.db.any_live_token().await?)
    }

    /// What a presented token grants, if it is live.
    pub async fn check(&self, token: &str) -> AppResult<Option<Grant>> {
        let row = self.db.live_token(&hash(token)).await?;
        Ok(row.and_then(|r| {
            Tenant::new(&r.tenant).ok().map(|tenant| Grant {
                id: r.id,
                tenant,
                read_only: r.read_only,
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    #[tokio::test]
    async fn only_the_hash_is_stored_and_revoked_tokens_fail_in_every_store() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.db");
        let sqlite = Arc::new(SqliteStore::open(&file).unwrap());
        let stores: Vec<(&str, Arc<dyn TokenStore>)> = vec![("sqlite", sqlite.clone())];
        for (name, db) in stores {
            let t = Tokens::new(db.clone());
            let acme = Tenant::new("acme").unwrap();
            let (tok, id) = t.create(&acme, false, Some("ci"), 5).await.unwrap();
            assert!(tok.starts_with("abr_") && tok.len() == 68, "{name}");
            let g = t.check(&tok).await.unwrap().unwrap();
            assert_eq!((g.tenant, g.read_only), (acme, false), "{name}");
            assert_eq!(t.check("abr_nope").await.unwrap(), None, "{name}");
            let listed = t.list().await.unwrap();
            assert_eq!(listed[0].prefix, &tok[..10], "{name}");
            assert!(t.any_live().await.unwrap(), "{name}");
            assert!(t.revoke(id, 6).await.unwrap(), "{name}");
            assert!(!t.revoke(id, 7).await.unwrap(), "{name}");
            assert_eq!(t.check(&tok).await.unwrap(), None, "{name}");
            assert!(!t.any_live().await.unwrap(), "{name}");
        }
        // SQLite holds the hash and the prefix, never the rest of the token.
        let t = Tokens::new(sqlite.clone());
        let (tok, _) = t.create(&Tenant::local(), true, None, 9).await.unwrap();
        let stored: String = rusqlite::Connection::open(&file)
            .unwrap()
            .query_row("SELECT group_concat(hash || prefix) FROM tokens", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert!(!stored.contains(&tok[10..]));
    }
}
