//! A tenant's API tokens: list, create, revoke.

use super::*;

impl Scoped {
    /// The tenant's API tokens, live and revoked, oldest first (never the tokens themselves).
    pub async fn tokens(&self) -> AppResult<Vec<tokens::TokenView>> {
        Ok(self
            .tables
            .tokens()
            .await?
            .into_iter()
            .map(tokens::TokenView::from)
            .collect())
    }

    /// Create an API token for this tenant (a read-only caller cannot); the answer is the only
    /// place the token is ever shown.
    pub async fn create_token(
        &self,
        read_only: bool,
        label: Option<&str>,
    ) -> AppResult<tokens::CreatedToken> {
        self.writing("create tokens")?;
        if let Some(l) = label {
            tokens::check_label(l)?;
        }
        let now = self.app.now_ms();
        let (token, id) = self
            .app
            .tokens()
            .create(&self.tenant, read_only, label, now)
            .await?;
        let prefix = tokens::prefix_of(&token);
        Ok(tokens::CreatedToken {
            token,
            id,
            prefix,
            read_only,
            label: label.map(str::to_string),
            created_ms: now,
        })
    }

    /// Revoke this tenant's live token `id`; another tenant's token, or one already revoked,
    /// is not found.
    pub async fn revoke_token(&self, id: u64) -> AppResult<tokens::TokenView> {
        self.writing("revoke tokens")?;
        let now = self.app.now_ms();
        let missing = || {
            AppError::not_found(format!("no live token {id}"))
                .hint("GET /v1/tokens lists this tenant's tokens")
        };
        // The bound store revokes the tenant's own token only.
        if !self.tables.revoke_token(id, now).await? {
            return Err(missing());
        }
        let row = self.tables.tokens().await?.into_iter().find(|r| r.id == id);
        row.map(tokens::TokenView::from).ok_or_else(missing)
    }
}
