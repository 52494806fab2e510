//! Storage of sessions, episodes and summary chains behind one trait.

use std::sync::Arc;

use async_trait::async_trait;

use crate::types::{
    CachedAnswer, Calibration, Compaction, Episode, EpisodeRange, Error, FailureMarker,
    IdentifierKind, LedgerEntry, NewEpisode, SessionStats, SummaryRow, SummaryWrite,
};

pub(crate) mod keyring;
mod memory;
mod memory_tables;
pub mod pg;
pub mod recall;
mod sqlite;
mod sqlite_recall;
mod sqlite_tables;
pub mod tables;

pub use memory::MemoryStore;
pub use pg::PgStore;
pub use recall::{ClusterRow, RecallStore, Unsettled};
pub use sqlite::SqliteStore;
pub use tables::{
    AppStore, EventRow, EventStore, JobScope, JobStore, SlotStore, SourceStore, TenantCap,
    TokenRow, TokenStore,
};

/// The chain rule every store enforces before writing: rows of a session cover episodes
/// `1..=n` exactly once, in order. `episodes` is the session's episode count and `prev` its
/// latest row.
pub fn check_chain(
    session: &str,
    episodes: u64,
    prev: Option<&SummaryRow>,
    w: &SummaryWrite,
) -> Result<(), Error> {
    let conflict =
        |why: String| Error::Conflict(format!("summary chain rule for session '{session}': {why}"));
    if w.last_episode > episodes || w.last_episode < w.first_episode || w.first_episode == 0 {
        return Err(conflict(format!(
            "coverage {}-{} is outside episodes 1-{episodes}",
            w.first_episode, w.last_episode
        )));
    }
    match (w.replaces, prev) {
        (None, _) => {
            let expect = prev.map_or(1, |p| p.last_episode + 1);
            if w.first_episode != expect {
                return Err(conflict(format!(
                    "a new row must start at episode {expect}, not {}",
                    w.first_episode
                )));
            }
        }
        (Some(id), Some(p)) if p.id == id => {
            if w.first_episode != p.first_episode || w.last_episode <= p.last_episode {
                return Err(conflict(format!(
                    "an update of row {id} must keep its first episode {} and extend past {}",
                    p.first_episode, p.last_episode
                )));
            }
        }
        (Some(id), _) => {
            return Err(conflict(format!(
                "row {id} is not the session's latest row"
            )));
        }
    }
    Ok(())
}

/// The rule every store enforces before a compaction: the rows folded are the oldest rows of
/// the active chain (`active`, oldest first), at least two, in order. Returns the new row's
/// first and last episode and its level.
pub fn check_compaction(
    session: &str,
    active: &[SummaryRow],
    c: &Compaction,
) -> Result<(u64, u64, u32), Error> {
    let conflict = |why: String| {
        Error::Conflict(format!(
            "summary compaction rule for session '{session}': {why}"
        ))
    };
    if c.rows.len() < 2 {
        return Err(conflict("a compaction folds at least two rows".into()));
    }
    let head: Vec<u64> = active.iter().take(c.rows.len()).map(|r| r.id).collect();
    if head != c.rows {
        return Err(conflict(format!(
            "rows {:?} are not the oldest rows of the active chain ({:?})",
            c.rows, head
        )));
    }
    let folded = &active[..c.rows.len()];
    let level = folded.iter().map(|r| r.level).max().unwrap_or(0) + 1;
    Ok((
        folded[0].first_episode,
        folded[folded.len() - 1].last_episode,
        level,
    ))
}

/// Skipped ranges as stored: JSON `[[first, last], ...]` (the same in every store).
pub(crate) fn skipped_to_json(ranges: &[EpisodeRange]) -> String {
    serde_json::to_string(&ranges.iter().map(|r| [r.first, r.last]).collect::<Vec<_>>())
        .expect("ranges serialize")
}

/// Stored skipped ranges (see [`skipped_to_json`]); unreadable text reads as empty.
pub(crate) fn skipped_from_json(text: &str) -> Vec<EpisodeRange> {
    serde_json::from_str::<Vec<[u64; 2]>>(text)
        .unwrap_or_default()
        .into_iter()
        .map(|[first, last]| EpisodeRange { first, last })
        .collect()
}

fn kind_name(k: IdentifierKind) -> &'static str {
    match k {
        IdentifierKind::Path => "path",
        IdentifierKind::Url => "url",
        IdentifierKind::Command => "command",
        IdentifierKind::Code => "code",
        IdentifierKind::Number => "number",
        IdentifierKind::Version => "version",
        IdentifierKind::Date => "date",
        IdentifierKind::Email => "email",
        IdentifierKind::Ticket => "ticket",
        IdentifierKind::Name => "name",
    }
}

/// The kind an identifier-kind name stands for (`path`, `url`, …).
pub fn kind_of(name: &str) -> IdentifierKind {
    match name {
        "path" => IdentifierKind::Path,
        "url" => IdentifierKind::Url,
        "command" => IdentifierKind::Command,
        "number" => IdentifierKind::Number,
        "version" => IdentifierKind::Version,
        "date" => IdentifierKind::Date,
        "email" => IdentifierKind::Email,
        "ticket" => IdentifierKind::Ticket,
        "name" => IdentifierKind::Name,
        _ => IdentifierKind::Code,
    }
}

impl IdentifierKind {
    /// The lower-case name (`path`, `url`, …).
    pub fn as_str(self) -> &'static str {
        kind_name(self)
    }
}

/// A ledger as stored: JSON `[{"t": text, "k": kind, "e": episode, "c": count}, ...]` (the
/// same in every store and in the JS host).
pub fn ledger_to_json(entries: &[LedgerEntry]) -> String {
    serde_json::to_string(
        &entries
            .iter()
            .map(|e| serde_json::json!({"t": e.text, "k": kind_name(e.kind), "e": e.episode, "c": e.count}))
            .collect::<Vec<_>>(),
    )
    .expect("a ledger serializes")
}

/// A stored ledger (see [`ledger_to_json`]); unreadable text reads as empty.
pub fn ledger_from_json(text: &str) -> Vec<LedgerEntry> {
    serde_json::from_str::<Vec<serde_json::Value>>(text)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| {
            Some(LedgerEntry {
                text: v["t"].as_str()?.to_string(),
                kind: kind_of(v["k"].as_str().unwrap_or("code")),
                episode: v["e"].as_u64().unwrap_or(0),
                count: v["c"].as_u64().unwrap_or(1) as u32,
            })
        })
        .collect()
}

/// Open `db`: a PostgreSQL URL connects (from inside a multi-threaded tokio runtime, as the
/// binary runs), anything else is a SQLite file.
pub fn open_store(
    db: &std::path::Path,
    master: Option<&crate::crypto::Secret>,
) -> Result<Arc<dyn AppStore>, Error> {
    let text = db.to_string_lossy();
    if pg::is_url(&text) {
        let handle = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
            .ok_or_else(|| {
                Error::Storage(
                    "a PostgreSQL store is opened from inside a multi-threaded tokio runtime"
                        .into(),
                )
            })?;
        let url = text.to_string();
        let store =
            tokio::task::block_in_place(move || handle.block_on(pg::PgStore::connect(&url)))?;
        let store = match master {
            Some(k) => store.with_master_key(k.clone()),
            None => store,
        };
        return Ok(Arc::new(store));
    }
    let mut s = SqliteStore::open(db)?;
    if let Some(k) = master {
        s = s.with_master_key(k.clone());
    }
    Ok(Arc::new(s))
}

/// Rotate the master key of the database `db` (a SQLite file or a PostgreSQL URL) from
/// `current` to `new`: see [`SqliteStore::rotate_master_key`]. Returns the tenants rotated.
pub async fn rotate_master_key(
    db: &std::path::Path,
    current: crate::crypto::Secret,
    new: &crate::crypto::Secret,
) -> Result<usize, Error> {
    let text = db.to_string_lossy();
    if pg::is_url(&text) {
        pg::PgStore::connect(&text)
            .await?
            .with_master_key(current)
            .rotate_master_key(new)
            .await
    } else {
        SqliteStore::open(db)?
            .with_master_key(current)
            .rotate_master_key(new)
    }
}

/// What the engine stores. Implementations must write each call atomically and enforce the
/// chain rule of [`SummaryWrite`]: rows of a session cover every episode exactly once, in
/// order.
#[async_trait]
pub trait Store: Send + Sync {
    /// Append episodes (skipping source keys already present); returns how many were new.
    async fn append_episodes(&self, session: &str, episodes: Vec<NewEpisode>)
    -> Result<u32, Error>;
    /// Session figures (zero for an unknown session).
    async fn stats(&self, session: &str) -> Result<SessionStats, Error>;
    /// Episodes with `id > after`, ascending, at most `limit`.
    async fn episodes_after(
        &self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error>;
    /// The newest summary row.
    async fn latest_summary(&self, session: &str) -> Result<Option<SummaryRow>, Error>;
    /// The active chain (rows not compacted), oldest first.
    async fn summaries(&self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Every row, compacted ones included: by first episode, then level, highest first.
    async fn summary_history(&self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Write a summary row and its coverage in one transaction.
    async fn write_summary(&self, session: &str, write: SummaryWrite) -> Result<SummaryRow, Error>;
    /// Fold the oldest active rows into one "earlier" row in one transaction (see
    /// [`check_compaction`]).
    async fn compact_summaries(&self, session: &str, c: Compaction) -> Result<SummaryRow, Error>;
    /// Known sessions, most recently changed first.
    async fn sessions(&self) -> Result<Vec<String>, Error>;
    /// The session's failure marker (see the WIT `store.failure`).
    async fn failure(&self, session: &str) -> Result<Option<FailureMarker>, Error>;
    /// Record or clear the session's failure marker.
    async fn set_failure(&self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error>;
    /// Delete the session's episodes, summaries and failure marker.
    async fn reset_session(&self, session: &str) -> Result<(), Error>;
    /// A cached partial summary by key, with what it cost (see the WIT `store.partial`).
    async fn partial(&self, key: &str) -> Result<Option<CachedAnswer>, Error>;
    /// Cache a partial summary and what it cost.
    async fn put_partial(&self, key: &str, answer: &CachedAnswer) -> Result<(), Error>;
    /// Calibration totals for a model (see the WIT `store.calibration`).
    async fn calibration(&self, model: &str) -> Result<Option<Calibration>, Error>;
    /// Add one measured prompt to a model's calibration totals.
    async fn record_calibration(
        &self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error>;
}
