//! Importing one conversation, the one flow every front end uses: `summarize`, `ingest`,
//! `backfill`, `watch` and `POST /v1/transcripts` (and the messages API) all append through
//! [`Scoped::import_conversation`], which stores the episodes, marks how far into its file the
//! session now reaches, and brings the summary up to date the way the caller asks. The rule
//! for messages without an id of their own is here too ([`Scoped::keyed`]): one spelling of a
//! source key, whoever appends.

use super::{AppError, AppResult, Scoped};
use crate::jobs::Job;
use crate::transcript;
use crate::types::{Config, NewEpisode};

/// The file a conversation was read from, so a summary can say how far into it it reaches.
#[derive(Clone, Copy, Debug)]
pub struct SourceFile<'a> {
    /// The file's path (canonical where it could be resolved) or key.
    pub path: &'a str,
    /// How many of its bytes are read so far.
    pub bytes: u64,
}

/// How an import brings the summary up to date.
#[derive(Clone, Copy, Debug)]
pub enum Bring<'a> {
    /// Here and now, through the session's job (run here, or waited for when a live worker
    /// holds it), with this configuration: the command line's `summarize` and `backfill`.
    Now(&'a Config),
    /// Queue the session's job when anything is left to summarize (a service's import).
    Queue,
    /// Leave it to the caller's own schedule (`watch` refreshes its pending sessions when
    /// their mode says so).
    Later,
}

/// What an import did to one session.
#[derive(Debug)]
pub struct ConversationImport {
    /// The session.
    pub session: String,
    /// Episodes new to the session (the rest were stored already).
    pub added: u32,
    /// The session's episode count now.
    pub episodes: u64,
    /// The job that brought it up to date ([`Bring::Now`]) or will ([`Bring::Queue`]); none
    /// when everything was covered already.
    pub job: Option<Job>,
    /// Why bringing it up to date failed ([`Bring::Now`]): the episodes are stored all the
    /// same, and the previous summary is kept.
    pub failure: Option<AppError>,
}

/// The prefix of source keys given to messages without an id of their own.
const UNKEYED: &str = "msg:";

impl Scoped {
    /// Give every message without an id of its own (its source key is not `id:…`) a key of
    /// its own, so it is a new message even if its text repeats; the caller-visible ids of all
    /// of them, in order.
    pub fn keyed(&self, episodes: &mut [NewEpisode]) -> Vec<String> {
        episodes
            .iter_mut()
            .map(|ep| match ep.source_key.strip_prefix("id:") {
                Some(id) => id.to_string(),
                None => {
                    let id = self.app.unique_id();
                    ep.source_key = format!("{UNKEYED}{id}");
                    id
                }
            })
            .collect()
    }

    /// Import one conversation into `session`: append its episodes (those already stored are
    /// skipped by their source keys), record how far into `source` the session reaches, and
    /// bring the summary up to date as `bring` asks.
    pub async fn import_conversation(
        &self,
        session: &str,
        episodes: &[NewEpisode],
        source: Option<SourceFile<'_>>,
        bring: Bring<'_>,
    ) -> AppResult<ConversationImport> {
        super::check_session(session)?;
        let added = if episodes.is_empty() {
            0
        } else {
            self.engine().append(session, episodes).await?
        };
        self.finish_import(session, added, source, bring).await
    }

    /// Store the episodes of a [`scan`](transcript::scan)ned transcript, reading it a second
    /// time one read at a time: conversation `i` of `scanned` goes to `sessions[i]` (an
    /// empty name leaves it out). Returns
    /// the episodes new to each session. Memory holds one read's episodes, whatever the size
    /// of the input; each session is then finished with [`finish_import`](Self::finish_import).
    pub async fn store_scanned(
        &self,
        name: &str,
        input: &mut transcript::Input<'_>,
        scanned: &transcript::Scanned,
        sessions: &[String],
        opts: transcript::Options,
    ) -> AppResult<Vec<u32>> {
        // An empty name leaves its conversation out (see `transcript::store`).
        for s in sessions.iter().filter(|s| !s.is_empty()) {
            super::check_session(s)?;
        }
        transcript::store(self.engine(), name, input, scanned, sessions, opts).await
    }

    /// After a conversation's episodes are stored (`added` of them new): record how far into
    /// `source` the session reaches, and bring the summary up to date as `bring` asks.
    pub async fn finish_import(
        &self,
        session: &str,
        added: u32,
        source: Option<SourceFile<'_>>,
        bring: Bring<'_>,
    ) -> AppResult<ConversationImport> {
        let stats = self.store().stats(session).await?;
        if let Some(f) = source {
            self.mark_source(session, f.path, stats.last_episode, f.bytes)
                .await?;
        }
        let mut out = ConversationImport {
            session: session.to_string(),
            added,
            episodes: stats.episodes,
            job: None,
            failure: None,
        };
        match bring {
            Bring::Later => return Ok(out),
            Bring::Now(cfg) if !self.needs_summary(session, stats.last_episode, cfg).await? => {
                return Ok(out);
            }
            _ => {}
        }
        match bring {
            Bring::Now(cfg) => match self.run_or_join(session, stats.last_episode, cfg).await {
                Ok(job) => out.job = Some(job),
                Err(e) => out.failure = Some(e),
            },
            Bring::Queue => {
                let cfg = self.session_config(session).await?;
                if self
                    .needs_summary(session, stats.last_episode, &cfg)
                    .await?
                {
                    out.job = Some(self.enqueue(session, stats.last_episode, &cfg).await?);
                }
            }
            Bring::Later => {}
        }
        Ok(out)
    }
}
