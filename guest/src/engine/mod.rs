//! The rolling session summarizer: trigger, strategy, passes until caught up.
//!
//! Everything outside the guest is reached through [`Host`], which `lib.rs` implements with
//! the WIT imports and the tests implement in memory.

use crate::freshness::{Freshness, State as FreshState};
use crate::ledger::{self, Ledger};
use crate::policy::{self, Config, Engine, Rendering, Strategy};
use crate::prompt::Partial;
use crate::tokens::estimate_tokens;
use crate::types::{
    Cached, Compaction, Episode, Error, FailureMarker, Finish, Level, Message, Prompt, Request,
    Response, Stats, SummaryRow, SummaryWrite,
};
use crate::{chunk, extractive, plan, prompt, quality, strip};

mod batches;
mod calibration;
mod compaction;
mod context;
mod expand;
mod found;
mod long;
mod planning;
mod refresh;
mod upgrade;

pub use batches::*;
pub(crate) use calibration::*;
pub use compaction::*;
pub use context::*;
pub use expand::*;
pub use found::*;
use long::*;
pub use planning::*;
pub use refresh::*;
pub use upgrade::*;

/// Episodes fetched from the store per read.
const PAGE: u32 = 256;

/// Requests handed to the host per batch call. The host's sliding window drains at each batch
/// boundary, so batches are large, and a multiple of common concurrency settings (1-6, 8, 10,
/// 12, 15, 16, 20, 24) so full batches end on a full window. Progress is reported between
/// batches; the host caches each answer as it arrives (the request's cache key).
const BATCH: usize = 240;

/// Most ids one [`Host::episodes`] read takes (the WIT `store.episodes`).
pub const EPISODES_MAX: usize = 1000;

/// The world outside the guest.
pub trait Host {
    /// Session figures.
    fn stats(&mut self, session: &str) -> Result<Stats, Error>;
    /// Episodes after `after`, ascending, at most `limit`.
    fn episodes_after(
        &mut self,
        session: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Episode>, Error>;
    /// The episodes with these ids (at most [`EPISODES_MAX`]), ascending; an id the session
    /// does not hold is left out. One store call, whatever their number (a host without such
    /// a read answers it an episode at a time).
    fn episodes(&mut self, session: &str, ids: &[u64]) -> Result<Vec<Episode>, Error> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            if id > 0 {
                out.extend(
                    self.episodes_after(session, id - 1, 1)?
                        .into_iter()
                        .filter(|e| e.id == id),
                );
            }
        }
        out.sort_by_key(|e| e.id);
        out.dedup_by_key(|e| e.id);
        Ok(out)
    }
    /// Newest summary row.
    fn latest_summary(&mut self, session: &str) -> Result<Option<SummaryRow>, Error>;
    /// Write a summary row atomically.
    fn write_summary(&mut self, session: &str, w: SummaryWrite) -> Result<SummaryRow, Error>;
    /// One model call.
    fn generate(&mut self, req: Request) -> Result<Response, Error>;
    /// Several model calls, run concurrently by the host; answers in request order.
    fn generate_batch(&mut self, reqs: Vec<Request>) -> Vec<Result<Response, Error>>;
    /// A cached partial summary by request key (the host caches answers to requests that
    /// carry a key).
    fn partial(&mut self, key: &str) -> Result<Option<Cached>, Error>;
    /// Progress of a map-reduce stage: `done` of `total` answers at `level` (0: map).
    fn progress(&mut self, level: u32, done: u32, total: u32);
    /// What the call will do, before it does it (again after a re-plan within the call).
    fn planned(&mut self, report: &PlanReport);
    /// Calibration totals `(estimated, reported)` for a model.
    fn calibration(&mut self, model: &str) -> Result<Option<(u64, u64)>, Error>;
    /// Add one measured prompt to a model's calibration totals.
    fn record_calibration(
        &mut self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error>;
    /// Record a refusal of a prompt as over-long (the same totals; kept apart so a call can
    /// defer its ordinary measurements while a refusal counts at once).
    fn record_refusal(&mut self, model: &str, estimated: u32, reported: u32) -> Result<(), Error> {
        self.record_calibration(model, estimated, reported)
    }
    /// The active summary chain, oldest first.
    fn summaries(&mut self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Every row, compacted ones included (first episode, then level, highest first).
    fn summary_history(&mut self, session: &str) -> Result<Vec<SummaryRow>, Error>;
    /// Fold the oldest active rows into one "earlier" row atomically.
    fn compact_summaries(&mut self, session: &str, c: Compaction) -> Result<SummaryRow, Error>;
    /// The session's failure marker.
    fn failure(&mut self, session: &str) -> Result<Option<FailureMarker>, Error>;
    /// Record or clear the session's failure marker.
    fn set_failure(&mut self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error>;
    /// Delete the session's episodes, summaries and marker.
    fn reset_session(&mut self, session: &str) -> Result<(), Error>;
    /// The full-text index's episodes holding any of `terms` (see [`crate::search`]), in
    /// `session` or in every session of the store's tenant, at most `limit`.
    fn search_episodes(
        &mut self,
        session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<crate::search::Matches, Error>;
    /// Wall-clock ms.
    fn now_ms(&mut self) -> u64;
    /// A log line.
    fn log(&mut self, level: Level, msg: &str);
}

/// What a call did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Whether the trigger fired.
    pub triggered: bool,
    /// Passes that wrote a row.
    pub passes: u32,
    /// The newest rows written, in order (at most [`WRITTEN_KEPT`]).
    pub written: Vec<SummaryRow>,
    /// Episodes not yet covered.
    pub unsummarized: u64,
}

/// Most rows an [`Outcome`] hands back: a long backlog writes thousands, which the call
/// would otherwise hold (and copy to the host) whole; the host reads the chain for the rest.
pub const WRITTEN_KEPT: usize = 64;

/// `rows` without all but the newest [`WRITTEN_KEPT`].
pub(crate) fn newest_kept(rows: &mut Vec<SummaryRow>) {
    if rows.len() > WRITTEN_KEPT {
        rows.drain(..rows.len() - WRITTEN_KEPT);
    }
}

/// Summary text and what producing it cost.
struct Generated {
    text: String,
    prompt_tokens: u32,
    output_tokens: u32,
    /// Episode ranges the text does not reflect.
    skipped: Vec<(u64, u64)>,
}

fn validate(session: &str, cfg: &Config) -> Result<(), Error> {
    if session.trim().is_empty() {
        return Err(Error::InvalidInput(
            "the session id is empty; pass a session id".into(),
        ));
    }
    if cfg.engine == Engine::Llm && cfg.model.trim().is_empty() {
        return Err(Error::InvalidInput(
            "no model name configured; pass --model".into(),
        ));
    }
    if cfg.max_output_tokens == 0 {
        return Err(Error::InvalidInput(
            "max-output-tokens must be at least 1".into(),
        ));
    }
    Ok(())
}

/// After an episode write: the same as [`refresh`].
pub fn after_episode_written(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
) -> Result<Outcome, Error> {
    refresh(h, session, cfg)
}

/// Summarize now, ignoring the trigger, the mode and any backoff, until every episode is
/// covered. Success clears a failure marker; failure records one.
pub fn summarize_now(h: &mut impl Host, session: &str, cfg: &Config) -> Result<Outcome, Error> {
    validate(session, cfg)?;
    let marker = h.failure(session)?;
    guarded(h, session, cfg, marker, Reach::to(u64::MAX))
}

/// Summarize until episode `upto` is covered, ignoring the trigger, the mode and any backoff:
/// a job bringing the session up to its target. Success clears a failure marker; failure
/// records one.
pub fn catch_up_to(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    upto: u64,
) -> Result<Outcome, Error> {
    validate(session, cfg)?;
    let marker = h.failure(session)?;
    guarded(h, session, cfg, marker, Reach::to(upto))
}

/// Run `catch_up`, keeping the failure marker in step: cleared on success, advanced (with the
/// next backoff) on a failure. A failure never touches the summary chain.
fn guarded(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    marker: Option<FailureMarker>,
    reach: Reach,
) -> Result<Outcome, Error> {
    match catch_up(h, session, cfg, reach) {
        Ok(out) => {
            if marker.is_some() {
                h.set_failure(session, None)?;
            }
            Ok(out)
        }
        Err(e) => {
            // Bad input is the caller's to fix, not a reason to back off.
            if !matches!(e, Error::InvalidInput(_)) {
                let now = h.now_ms();
                let failures = marker.map_or(0, |m| m.failures) + 1;
                let next = FailureMarker {
                    failures,
                    last_error: error_text(&e).to_string(),
                    retry_after_ms: crate::freshness::retry_after(now, failures, cfg),
                    failed_ms: now,
                };
                // Info, not a warning: the error itself goes back to the caller, which says
                // it (a command's message, a job's failed event); this only counts it.
                h.log(
                    Level::Info,
                    &format!(
                        "session {session}: refresh failed ({failures} in a row); the previous summary is kept"
                    ),
                );
                h.set_failure(session, Some(next))?;
            }
            Err(e)
        }
    }
}

/// Delete the session's episodes, summaries and failure marker.
pub fn reset(h: &mut impl Host, session: &str) -> Result<(), Error> {
    if session.trim().is_empty() {
        return Err(Error::InvalidInput(
            "the session id is empty; pass a session id".into(),
        ));
    }
    h.log(Level::Info, &format!("session {session}: reset"));
    h.reset_session(session)
}

/// The message inside an error.
fn error_text(e: &Error) -> &str {
    match e {
        Error::Unreachable(m)
        | Error::ModelNotFound(m)
        | Error::Timeout(m)
        | Error::ContextOverflow(m)
        | Error::Server(m)
        | Error::RejectedOutput(m)
        | Error::Storage(m)
        | Error::Conflict(m)
        | Error::InvalidInput(m) => m,
    }
}

/// The same kind of error with another message.
fn with_message(e: Error, m: String) -> Error {
    match e {
        Error::Unreachable(_) => Error::Unreachable(m),
        Error::ModelNotFound(_) => Error::ModelNotFound(m),
        Error::Timeout(_) => Error::Timeout(m),
        Error::ContextOverflow(_) => Error::ContextOverflow(m),
        Error::Server(_) => Error::Server(m),
        Error::RejectedOutput(_) => Error::RejectedOutput(m),
        Error::Storage(_) => Error::Storage(m),
        Error::Conflict(_) => Error::Conflict(m),
        Error::InvalidInput(_) => Error::InvalidInput(m),
    }
}

/// The prompt extras of fold, map and reduce prompts: the focus only. A fold prompt carries
/// no ledger: the guest merges each row's ledger, and what the previous summary mentions is in
/// it verbatim (re-sending those identifiers made every fold's fixed part longer for nothing
/// the model did not already have; window mode's fold spend, `--drift-only`).
fn focus_only(cfg: &Config) -> prompt::Extras<'_> {
    prompt::Extras {
        ledger: "",
        focus: &cfg.focus,
    }
}

#[cfg(test)]
#[path = "../engine_tests.rs"]
mod tests;
