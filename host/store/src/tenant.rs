//! Tenants: every stored row belongs to one, and a tenant's view of the store cannot name
//! another's rows.
//!
//! A session of tenant `acme` is kept under the key `acme` + U+001F + the session id. A session
//! id cannot hold control characters ([`crate::text::check_session_id`]), so no id a caller
//! sends can reach into another tenant's keys. The local tenant (the CLI, and a server on
//! loopback with no tokens) keeps the bare session id, so databases written before tenants
//! existed keep working. A SQL store bound to a tenant ([`crate::AppStore::for_tenant`]) keys its
//! engine calls this way; the app layer hands only such bound stores to the engine, so no
//! request handler can forget the scope.

/// The separator between a tenant's name and a session id in a stored key.
const SEP: char = '\u{1f}';

/// A tenant's name: 1 to 64 characters of `a-z 0-9 . _ -`, starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tenant(String);

impl Tenant {
    /// The name of the tenant that owns unprefixed (pre-tenant, CLI) sessions.
    pub const LOCAL: &'static str = "local";

    /// The local tenant.
    pub fn local() -> Tenant {
        Tenant(Self::LOCAL.into())
    }

    /// A tenant by name, checked.
    pub fn new(name: &str) -> Result<Tenant, String> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric());
        if ok {
            Ok(Tenant(name.into()))
        } else {
            Err(format!(
                "tenant name '{}' is not valid: use 1 to 64 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
                crate::text::printable(name)
            ))
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Whether this is the local tenant.
    pub fn is_local(&self) -> bool {
        self.0 == Self::LOCAL
    }

    /// The stored key of one of this tenant's sessions. Only the store builds keys (through
    /// a bound [`crate::Sql`] and [`crate::EventRow::new`]): whatever sits above it
    /// names sessions by id and its tenant by value.
    pub(crate) fn key(&self, session: &str) -> String {
        if self.is_local() {
            session.to_string()
        } else {
            format!("{}{SEP}{session}", self.0)
        }
    }

    /// The session id of a stored key, if the key is this tenant's.
    pub fn session_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        if self.is_local() {
            (!key.contains(SEP)).then_some(key)
        } else {
            key.strip_prefix(self.0.as_str())?.strip_prefix(SEP)
        }
    }
}

/// Whether a stored key is keyed into a tenant's space (the local tenant's keys are the bare
/// ids, which cannot hold the separator).
pub(crate) fn is_keyed(key: &str) -> bool {
    key.contains(SEP)
}

/// The tenant's name of a `tenant` column ('' is the local tenant's).
pub(crate) fn name_of_column(column: &str) -> &str {
    if column.is_empty() {
        Tenant::LOCAL
    } else {
        column
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::types::{CachedAnswer, NewEpisode, Role};
    use crate::{AppStore, SqliteStore};
    use std::sync::Arc;

    fn ep(key: &str) -> NewEpisode {
        NewEpisode {
            role: Role::User,
            content: format!("message {key}"),
            source_key: key.into(),
            tokens: 3,
            ..Default::default()
        }
    }

    #[test]
    fn names() {
        assert!(Tenant::new("acme-1.eu_x").is_ok());
        for bad in ["", "Acme", "-x", "a b", "a\u{1f}b", &"x".repeat(65)] {
            assert!(Tenant::new(bad).is_err(), "{bad:?}");
        }
        let t = Tenant::new("acme").unwrap();
        assert_eq!(t.session_of(&t.key("s/1")), Some("s/1"));
        assert_eq!(Tenant::local().session_of(&t.key("s")), None);
        assert_eq!(t.session_of("s"), None);
        assert_eq!(Tenant::new("acm").unwrap().session_of(&t.key("s")), None);
    }

    #[tokio::test]
    async fn the_same_session_id_in_two_tenants_is_two_sessions() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let a = db.for_tenant(&Tenant::new("a").unwrap());
        let b = db.for_tenant(&Tenant::new("b").unwrap());
        let local = db.for_tenant(&Tenant::local());
        a.append_episodes("s", vec![ep("1"), ep("2")])
            .await
            .unwrap();
        b.append_episodes("s", vec![ep("1")]).await.unwrap();
        local.append_episodes("s", vec![ep("9")]).await.unwrap();
        assert_eq!(a.stats("s").await.unwrap().episodes, 2);
        assert_eq!(b.stats("s").await.unwrap().episodes, 1);
        assert_eq!(local.stats("s").await.unwrap().episodes, 1);
        assert_eq!(a.sessions().await.unwrap(), vec!["s".to_string()]);
        assert_eq!(local.sessions().await.unwrap(), vec!["s".to_string()]);
        b.reset_session("s").await.unwrap();
        assert_eq!(a.stats("s").await.unwrap().episodes, 2);
        let answer = CachedAnswer {
            text: "t".into(),
            prompt_tokens: 1,
            output_tokens: 1,
        };
        a.put_partial("k", &answer).await.unwrap();
        assert!(a.partial("k").await.unwrap().is_some());
        assert!(b.partial("k").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn the_whole_view_names_the_local_tenants_sessions_only() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let acme = db.for_tenant(&Tenant::new("acme").unwrap());
        acme.append_episodes("s", vec![ep("1")]).await.unwrap();
        let key = Tenant::new("acme").unwrap().key("s");
        let e = db.stats(&key).await.unwrap_err();
        assert!(e.to_string().contains("open that tenant's view"), "{e}");
        assert!(db.append_episodes(&key, vec![ep("2")]).await.is_err());
        assert!(db.session_focus(&key).await.is_err());
        assert_eq!(
            acme.stats("s").await.unwrap().episodes,
            1,
            "nothing was written"
        );
        // The local tenant's view and the whole view name the same sessions.
        db.append_episodes("mine", vec![ep("1")]).await.unwrap();
        let local = db.for_tenant(&Tenant::local());
        assert_eq!(local.stats("mine").await.unwrap().episodes, 1);
    }

    #[tokio::test]
    async fn a_tenant_lists_and_revokes_only_its_own_tokens() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let mine = db
            .insert_token("acme", "h1", "abr_1", false, None, 1)
            .await
            .unwrap();
        let theirs = db
            .insert_token("globex", "h2", "abr_2", false, None, 1)
            .await
            .unwrap();
        let acme = db.for_tenant(&Tenant::new("acme").unwrap());
        let ids: Vec<u64> = acme.tokens().await.unwrap().iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![mine]);
        assert_eq!(
            db.tokens().await.unwrap().len(),
            2,
            "the whole view lists every token"
        );
        assert!(!acme.revoke_token(theirs, 2).await.unwrap());
        assert!(db.live_token("h2").await.unwrap().is_some());
        assert!(acme.revoke_token(mine, 2).await.unwrap());
        assert!(!acme.revoke_token(mine, 3).await.unwrap());
        assert!(
            acme.insert_token("globex", "h3", "abr_3", false, None, 1)
                .await
                .is_err(),
            "a bound view makes no token for another tenant"
        );
    }

    #[tokio::test]
    async fn a_bound_view_refuses_another_tenants_memories() {
        let db: Arc<dyn AppStore> = Arc::new(SqliteStore::in_memory().unwrap());
        let acme = db.for_tenant(&Tenant::new("acme").unwrap());
        assert!(acme.get_memory("acme", "m").await.unwrap().is_none());
        let e = acme.get_memory("globex", "m").await.unwrap_err();
        assert!(e.to_string().contains("bound to tenant 'acme'"), "{e}");
        assert!(acme.forget_tenant("globex").await.is_err());
        assert!(acme.unsettled(Some("globex"), 10).await.is_err());
    }
}
