//! `abridge:engine/store`: forwards to the embedder's [`crate::store::Store`].

use super::HostState;
use crate::bindings::abridge::engine::store::Host;
use crate::types::{
    CachedAnswer, Calibration, Compaction, Episode, Error, FailureMarker, NewEpisode, SessionStats,
    SummaryRow, SummaryWrite, TermMatches,
};

impl Host for HostState {
    async fn append_episodes(
        &mut self,
        session: String,
        episodes: Vec<NewEpisode>,
    ) -> Result<u32, Error> {
        self.store.append_episodes(&session, episodes).await
    }

    async fn stats(&mut self, session: String) -> Result<SessionStats, Error> {
        self.store.stats(&session).await
    }

    async fn episodes_after(
        &mut self,
        session: String,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error> {
        self.store.episodes_after(&session, after, limit).await
    }

    async fn episodes(&mut self, session: String, ids: Vec<u64>) -> Result<Vec<Episode>, Error> {
        if ids.len() > 1000 {
            return Err(Error::InvalidInput(format!(
                "{} episode ids in one read; at most 1000",
                ids.len()
            )));
        }
        self.store.episodes(&session, &ids).await
    }

    async fn latest_summary(&mut self, session: String) -> Result<Option<SummaryRow>, Error> {
        self.store.latest_summary(&session).await
    }

    async fn summaries(&mut self, session: String) -> Result<Vec<SummaryRow>, Error> {
        self.store.summaries(&session).await
    }

    async fn partial(&mut self, key: String) -> Result<Option<CachedAnswer>, Error> {
        self.store.partial(&key).await
    }

    async fn failure(&mut self, session: String) -> Result<Option<FailureMarker>, Error> {
        self.store.failure(&session).await
    }

    async fn set_failure(
        &mut self,
        session: String,
        marker: Option<FailureMarker>,
    ) -> Result<(), Error> {
        self.store.set_failure(&session, marker).await
    }

    async fn reset_session(&mut self, session: String) -> Result<(), Error> {
        self.store.reset_session(&session).await
    }

    async fn calibration(&mut self, model: String) -> Result<Option<Calibration>, Error> {
        self.store.calibration(&model).await
    }

    async fn record_calibration(
        &mut self,
        model: String,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error> {
        self.store
            .record_calibration(&model, estimated, reported)
            .await
    }

    async fn write_summary(
        &mut self,
        session: String,
        write: SummaryWrite,
    ) -> Result<SummaryRow, Error> {
        self.store.write_summary(&session, write).await
    }

    async fn search_episodes(
        &mut self,
        session: Option<String>,
        terms: Vec<String>,
        limit: u32,
    ) -> Result<TermMatches, Error> {
        self.store
            .search_episodes(None, session.as_deref(), &terms, limit)
            .await
    }

    async fn summary_history(&mut self, session: String) -> Result<Vec<SummaryRow>, Error> {
        self.store.summary_history(&session).await
    }

    async fn compact_summaries(
        &mut self,
        session: String,
        c: Compaction,
    ) -> Result<SummaryRow, Error> {
        self.store.compact_summaries(&session, c).await
    }
}
