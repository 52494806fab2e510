//! Storage of sessions, episodes and summary chains behind one trait.

use async_trait::async_trait;

use crate::types::{Episode, Error, NewEpisode, SessionStats, SummaryRow, SummaryWrite};

mod sqlite;

pub use sqlite::SqliteStore;

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
}
