//! Storage of sessions, episodes and summary chains behind one trait.

use async_trait::async_trait;

use crate::types::{
    CachedAnswer, Calibration, Episode, Error, FailureMarker, NewEpisode, SessionStats, SummaryRow,
    SummaryWrite,
};

mod keyring;
mod memory;
mod memory_tables;
pub mod recall;
mod sqlite;
mod sqlite_recall;
mod sqlite_tables;
pub mod tables;

pub use memory::MemoryStore;
pub use recall::{ClusterRow, RecallStore, Unsettled};
pub use sqlite::SqliteStore;
pub use tables::{
    AppStore, EventRow, EventStore, JobScope, JobStore, SourceStore, TokenRow, TokenStore,
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
    /// All summary rows, oldest first.
    async fn summaries(&self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Write a summary row and its coverage in one transaction.
    async fn write_summary(&self, session: &str, write: SummaryWrite) -> Result<SummaryRow, Error>;
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
