//! The full-text index of every message, written once for both SQL stores: each episode's
//! terms (the guest's `text.index-terms`) are kept as keyed hashes in `episode_terms`, which
//! SQLite indexes with FTS5 and PostgreSQL with a GIN index over a `simple` tsvector; a
//! tenant's totals (episodes indexed, their terms) sit in `search_totals`.
//!
//! A term's hash is keyed by its tenant (with a master key, by the tenant's lexical key, so
//! the index holds no word in clear and says nothing without the key), and is written in
//! thirteen lower-case letters, which FTS5's `unicode61` and PostgreSQL's `simple`
//! configuration both take as one word as it stands. A query is only ever a list of such
//! hashes, so a user's text never reaches either query language. `js/src/stores.js` derives
//! the same hashes.

use crate::rules::Dialect;
use crate::sql::{Tx, Val};
use crate::types::{Error, TermMatch, TermMatches};

/// Episodes holding a term are counted up to this many: enough to rank a common term low,
/// and what PostgreSQL's capped count and SQLite's vocabulary agree on.
pub const DF_CAP: u64 = 10_000;

/// The key of a tenant's terms: from its lexical key (derived from its first data key, see
/// `RecallStore::lexical_key`) and its name, or from its name alone without a master key.
pub fn terms_key(tenant: &str, lexical: Option<&[u8]>) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::new()
        .chain_update(b"abridge episode terms v1\0")
        .chain_update(lexical.unwrap_or_default())
        .chain_update(b"\0")
        .chain_update(tenant.as_bytes())
        .finalize()
        .to_vec()
}

/// The sessions' `tenant` column of a tenant's name ('' for the local tenant, and for a
/// search of a store that is no tenant's view).
pub fn column_of(tenant: Option<&str>) -> String {
    match tenant {
        Some(t) if t != crate::tenant::Tenant::LOCAL => t.to_string(),
        _ => String::new(),
    }
}

/// One term as the index keeps it: the first 8 bytes of HMAC-SHA-256, as 13 letters a–z.
pub fn token(key: &[u8], term: &str) -> String {
    Hasher::new(key).token(term)
}

/// [`token`] for many terms under one key: the key's HMAC state is made once.
pub struct Hasher(hmac::Hmac<sha2::Sha256>);

impl Hasher {
    /// The hasher of `key`.
    pub fn new(key: &[u8]) -> Hasher {
        use hmac::Mac;
        Hasher(hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length"))
    }

    /// The token of `session` (see [`session_token`]).
    pub fn session(&self, session: &str) -> String {
        self.token(&format!("\0session\0{session}"))
    }

    /// The token of `term`.
    pub fn token(&self, term: &str) -> String {
        use hmac::Mac;
        let mut m = self.0.clone();
        m.update(term.as_bytes());
        letters(&m.finalize().into_bytes())
    }
}

/// The first 8 bytes of a digest as 13 letters a–z.
fn letters(d: &[u8]) -> String {
    let mut v = u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
    let mut out = [b'a'; 13];
    for c in out.iter_mut().rev() {
        *c = b'a' + (v % 26) as u8;
        v /= 26;
    }
    String::from_utf8(out.to_vec()).expect("letters")
}

/// The token that marks a session's episodes (a session's search asks for it beside the
/// terms); never equal to a term's, whose hash input has no NUL.
pub fn session_token(key: &[u8], session: &str) -> String {
    Hasher::new(key).session(session)
}

/// What `episode_terms` keeps for an episode of `session` whose terms are `terms` (space
/// separated): the session's token, then each term's; and the number of terms. `None` for an
/// episode without terms (nothing to index).
pub fn doc(key: &[u8], session: &str, terms: &str) -> Option<(String, u32)> {
    doc_with(&Hasher::new(key), session, terms)
}

/// [`doc`] with a hasher made once for many episodes (each distinct term hashed once).
pub fn doc_with(h: &Hasher, session: &str, terms: &str) -> Option<(String, u32)> {
    let mut out = h.session(session);
    let mut n = 0u32;
    let mut seen: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    for t in terms.split_whitespace() {
        out.push(' ');
        out.push_str(seen.entry(t).or_insert_with(|| h.token(t)));
        n += 1;
    }
    (n > 0).then_some((out, n))
}

/// The statement that indexes one episode: session, episode, tenant column, doc, length
/// (parameters 1–5); it adds nothing for an episode already indexed or no longer stored.
pub fn insert_sql(d: Dialect) -> String {
    let p = |n| d.param(n);
    format!(
        "INSERT INTO episode_terms (session, episode, tenant, terms, length) SELECT {}, {}, {}, {}, {} WHERE EXISTS (SELECT 1 FROM episodes WHERE session = {} AND id = {}) AND NOT EXISTS (SELECT 1 FROM episode_terms WHERE session = {} AND episode = {})",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(1),
        p(2),
        p(1),
        p(2)
    )
}

/// The statement that indexes a message as it is stored (the same parameters as
/// [`insert_sql`]): the episode row was written just before it in the same transaction.
pub fn append_sql(d: Dialect) -> String {
    let p = |n| d.param(n);
    format!(
        "INSERT INTO episode_terms (session, episode, tenant, terms, length) VALUES ({}, {}, {}, {}, {}) ON CONFLICT (session, episode) DO NOTHING",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5)
    )
}

/// The statement that adds to a tenant's totals: tenant column, episodes, terms.
pub fn totals_sql(d: Dialect) -> String {
    let p = |n| d.param(n);
    format!(
        "INSERT INTO search_totals (tenant, docs, length) VALUES ({}, {}, {}) ON CONFLICT (tenant) DO UPDATE SET docs = search_totals.docs + excluded.docs, length = search_totals.length + excluded.length",
        p(1),
        p(2),
        p(3)
    )
}

/// Index episodes of one session (`(episode, terms)`), skipping those indexed already (and,
/// unless `fresh`: the episodes were written just now in this transaction, those no longer
/// stored), and add them to the tenant's totals: in the caller's transaction.
pub(crate) async fn index(
    rows: &mut impl Tx,
    key: &[u8],
    session: &crate::once::SessionKey,
    docs: &[(u64, String)],
    fresh: bool,
) -> Result<u32, Error> {
    let d = rows.dialect();
    let tenant = session.column();
    let sql = if fresh { append_sql(d) } else { insert_sql(d) };
    let hasher = Hasher::new(key);
    let (mut added, mut length) = (0u32, 0u64);
    for (episode, terms) in docs {
        let Some((text, n)) = doc_with(&hasher, session.key(), terms) else {
            continue;
        };
        let args: [Val; 5] = [
            session.into(),
            (*episode).into(),
            tenant.into(),
            text.into(),
            n.into(),
        ];
        if rows.exec(&sql, &args).await? == 1 {
            added += 1;
            length += u64::from(n);
        }
    }
    if added > 0 {
        rows.exec(
            &totals_sql(d),
            &[tenant.into(), added.into(), length.into()],
        )
        .await?;
    }
    Ok(added)
}

/// The index's episodes holding any of `terms`, in `session` (a stored key) or in every
/// session of `tenant` (the sessions' tenant column), at most `limit`: the postings of the
/// rarest terms first, newest first within a term (see the WIT `store.search-episodes`).
pub(crate) async fn search(
    rows: &mut impl Tx,
    key: &[u8],
    tenant: &str,
    session: Option<&str>,
    terms: &[String],
    limit: u32,
) -> Result<TermMatches, Error> {
    let d = rows.dialect();
    let p = |n: usize| d.param(n);
    let hashes: Vec<String> = terms.iter().map(|t| token(key, t)).collect();
    let totals = rows
        .row(
            &format!(
                "SELECT docs, length FROM search_totals WHERE tenant = {}",
                p(1)
            ),
            &[tenant.into()],
        )
        .await?;
    let (docs, length) = match totals {
        Some(r) => (r.u64(0)?, r.u64(1)?),
        None => (0, 0),
    };
    let mut df = Vec::with_capacity(hashes.len());
    for h in &hashes {
        let n = match d {
            Dialect::Sqlite => rows
                .row(
                    "SELECT doc FROM episode_vocab WHERE term = ?1",
                    &[h.as_str().into()],
                )
                .await?
                .map_or(Ok(0), |r| r.u64(0))?,
            Dialect::Postgres => rows
                .row(
                    &format!(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM episode_terms WHERE to_tsvector('simple', terms) @@ to_tsquery('simple', $1) LIMIT {DF_CAP}) AS x"
                    ),
                    &[h.as_str().into()],
                )
                .await?
                .map_or(Ok(0), |r| r.u64(0))?,
        };
        df.push(n.min(DF_CAP));
    }
    let mut order: Vec<usize> = (0..hashes.len()).filter(|&i| df[i] > 0).collect();
    order.sort_by_key(|&i| (df[i], i));
    let scope = session.map(|s| session_token(key, s));
    let mut found: Vec<(String, u64, String)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for i in order {
        if found.len() >= limit as usize {
            break;
        }
        let h = &hashes[i];
        let (sql, args): (String, Vec<Val>) = match d {
            Dialect::Sqlite => (
                "SELECT t.doc, t.session, t.episode, t.terms FROM episode_fts JOIN episode_terms t ON t.doc = episode_fts.rowid WHERE episode_fts MATCH ?1 AND t.tenant = ?2 ORDER BY episode_fts.rowid DESC LIMIT ?3".into(),
                vec![
                    match &scope {
                        Some(s) => format!("\"{s}\" AND \"{h}\""),
                        None => format!("\"{h}\""),
                    }
                    .into(),
                    tenant.into(),
                    limit.into(),
                ],
            ),
            Dialect::Postgres => (
                "SELECT doc, session, episode, terms FROM episode_terms WHERE to_tsvector('simple', terms) @@ to_tsquery('simple', $1) AND tenant = $2 ORDER BY doc DESC LIMIT $3".into(),
                vec![
                    match &scope {
                        Some(s) => format!("{s} & {h}"),
                        None => h.clone(),
                    }
                    .into(),
                    tenant.into(),
                    limit.into(),
                ],
            ),
        };
        rows.each(&sql, &args, &mut |r| {
            if found.len() < limit as usize && seen.insert(r.int(0)?) {
                found.push((r.text(1)?, r.u64(2)?, r.text(3)?));
            }
            Ok(())
        })
        .await?;
    }
    let matches = found
        .into_iter()
        .map(|(session, episode, text)| {
            let mut tokens = text.split(' ');
            tokens.next(); // the session's token
            let mut counts = vec![0u32; hashes.len()];
            let mut n = 0u32;
            for t in tokens {
                n += 1;
                for (c, h) in counts.iter_mut().zip(&hashes) {
                    if t == h {
                        *c += 1;
                    }
                }
            }
            TermMatch {
                session,
                episode,
                length: n,
                counts,
            }
        })
        .collect();
    Ok(TermMatches {
        docs,
        length,
        df,
        matches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_letters_keyed_by_tenant() {
        let a = terms_key("acme", None);
        let t = token(&a, "deploy");
        assert_eq!(t.len(), 13);
        assert!(t.bytes().all(|b| b.is_ascii_lowercase()), "{t}");
        assert_eq!(t, token(&a, "deploy"));
        assert_ne!(t, token(&terms_key("other", None), "deploy"));
        assert_ne!(t, token(&terms_key("acme", Some(b"key")), "deploy"));
        assert_ne!(session_token(&a, "deploy"), t);
        let (text, n) = doc(&a, "s", "deploy key deploy").unwrap();
        assert_eq!(n, 3);
        assert_eq!(text.split(' ').count(), 4);
        assert!(!text.contains("deploy"));
        assert!(doc(&a, "s", "  ").is_none());
    }

    #[test]
    fn the_index_statements_are_the_same_in_both_dialects() {
        let lite = insert_sql(Dialect::Sqlite);
        let pg = insert_sql(Dialect::Postgres);
        assert_eq!(lite.replace('?', "$"), pg);
        assert_eq!(
            totals_sql(Dialect::Sqlite).replace('?', "$"),
            totals_sql(Dialect::Postgres)
        );
        assert_eq!(
            append_sql(Dialect::Sqlite).replace('?', "$"),
            append_sql(Dialect::Postgres)
        );
    }
}
