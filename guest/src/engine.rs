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

/// Episodes fetched from the store per read.
const PAGE: u32 = 256;

/// Requests handed to the host per batch call. The host's sliding window drains at each batch
/// boundary, so batches are large, and a multiple of common concurrency settings (1-6, 8, 10,
/// 12, 15, 16, 20, 24) so full batches end on a full window. Progress is reported between
/// batches; the host caches each answer as it arrives (the request's cache key).
const BATCH: usize = 240;

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
    /// Rows written, in order.
    pub written: Vec<SummaryRow>,
    /// Episodes not yet covered.
    pub unsummarized: u64,
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
    guarded(h, session, cfg, marker, u64::MAX)
}

/// Run `catch_up`, keeping the failure marker in step: cleared on success, advanced (with the
/// next backoff) on a failure. A failure never touches the summary chain.
fn guarded(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    marker: Option<FailureMarker>,
    upto: u64,
) -> Result<Outcome, Error> {
    match catch_up(h, session, cfg, upto) {
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
                h.log(
                    Level::Warn,
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

/// The session's freshness under `cfg` (no model call).
pub fn freshness(h: &mut impl Host, session: &str, cfg: &Config) -> Result<Freshness, Error> {
    freshness_and_marker(h, session, cfg).map(|(f, _)| f)
}

/// The freshness verdict and the failure marker it was computed from (which a refresh then
/// advances or clears, without reading it again).
fn freshness_and_marker(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
) -> Result<(Freshness, Option<FailureMarker>), Error> {
    let stats = h.stats(session)?;
    let latest = h.latest_summary(session)?;
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    let last_activity_ms = timestamp_of(h, session, stats.last_episode)?;
    let covered_until_ms = timestamp_of(h, session, covered)?;
    let window = cfg.mode == policy::Mode::Window;
    let edge = stats
        .last_episode
        .saturating_sub(u64::from(cfg.window_messages));
    let mut left = 0u64;
    let backlog_tokens = if covered == 0 && !window {
        stats.total_tokens
    } else {
        let mut sum = 0u64;
        let mut after = covered;
        loop {
            let page = h.episodes_after(session, after, PAGE)?;
            let Some(last) = page.last() else { break };
            after = last.id;
            sum += page.iter().map(|e| u64::from(e.tokens)).sum::<u64>();
            left += page
                .iter()
                .filter(|e| e.id <= edge)
                .map(|e| u64::from(e.tokens) + 3)
                .sum::<u64>();
        }
        sum
    };
    let window = if window {
        Some((left, u64::from(window_batch(h, cfg, latest.as_ref())?)))
    } else {
        None
    };
    let marker = h.failure(session)?;
    let now_ms = h.now_ms();
    let f = crate::freshness::verdict(
        crate::freshness::Inputs {
            stats,
            covered,
            backlog_tokens,
            last_activity_ms,
            covered_until_ms,
            now_ms,
            marker: marker.clone(),
            window,
        },
        cfg,
    );
    Ok((f, marker))
}

/// Window mode's fold size for a session whose newest row is `latest`: four times the fold
/// prompt's fixed part (instructions, the summary, its ledger, the focus), within one prompt.
fn window_batch(
    h: &mut impl Host,
    cfg: &Config,
    latest: Option<&SummaryRow>,
) -> Result<u32, Error> {
    let f = calibration_factor(h, cfg)?;
    let strategy = policy::strategy(latest, cfg);
    let previous = match &strategy {
        Strategy::Update(r) => Some(r.content.as_str()),
        _ => None,
    };
    let ledger_text = fold_ledger(&strategy);
    let extras = prompt::Extras {
        ledger: &ledger_text,
        focus: &cfg.focus,
    };
    let fixed = prompt::fixed_tokens_x(previous, &extras);
    let budget = policy::input_budget_f(cfg, f, fixed).unwrap_or(fixed);
    Ok(policy::window_batch(fixed, budget))
}

/// The newest episode a refresh folds: in window mode, the last one outside the recent
/// window; otherwise all of them.
fn refresh_upto(cfg: &Config, last_episode: u64) -> u64 {
    if cfg.mode == policy::Mode::Window {
        last_episode.saturating_sub(u64::from(cfg.window_messages))
    } else {
        u64::MAX
    }
}

/// The timestamp of episode `id` (none for id 0 or an episode without one).
fn timestamp_of(h: &mut impl Host, session: &str, id: u64) -> Result<Option<i64>, Error> {
    if id == 0 {
        return Ok(None);
    }
    Ok(h.episodes_after(session, id - 1, 1)?
        .first()
        .and_then(|e| e.timestamp_ms))
}

/// Refresh the session if it is due under `cfg.mode`; a failure records a marker with a
/// backoff and keeps the previous summary.
pub fn refresh(h: &mut impl Host, session: &str, cfg: &Config) -> Result<Outcome, Error> {
    validate(session, cfg)?;
    let (f, marker) = freshness_and_marker(h, session, cfg)?;
    if f.state != FreshState::Due {
        if f.state != FreshState::Fresh && f.state != FreshState::Empty {
            h.log(
                Level::Debug,
                &format!("session {session}: not refreshed: {}", f.reason),
            );
        }
        return Ok(Outcome {
            unsummarized: f.episodes - f.covered,
            ..Outcome::default()
        });
    }
    h.log(
        Level::Info,
        &format!("session {session}: refreshing: {}", f.reason),
    );
    guarded(h, session, cfg, marker, refresh_upto(cfg, f.episodes))
}

/// What `context` should assemble (mirrors the WIT `context-request`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextRequest {
    /// Token budget.
    pub budget: u32,
    /// Recent pairs.
    pub pairs: u32,
    /// Refresh first beyond this many messages.
    pub refresh_after: u32,
    /// Pinned episodes, always included verbatim within the budget.
    pub pins: Vec<u64>,
}

/// The assembled context (mirrors the WIT `context-window`).
#[derive(Clone, Debug, PartialEq)]
pub struct ContextWindow {
    /// The window.
    pub window: crate::context::Window,
    /// Tokens of the whole history.
    pub full_tokens: u64,
    /// Refreshed for this call.
    pub refreshed: bool,
    /// A refresh is due but was not run.
    pub refresh_due: bool,
}

/// Most unsummarized episodes `context` reads to decide whether they fit its budget; more
/// than this never fit a context.
const CONTEXT_SCAN: u64 = 4 * PAGE as u64;

/// Estimated context tokens of the unsummarized episodes after `covered` (message costs
/// included), read up to [`CONTEXT_SCAN`] episodes; `u64::MAX` beyond that.
fn backlog_cost(h: &mut impl Host, session: &str, covered: u64, last: u64) -> Result<u64, Error> {
    if last.saturating_sub(covered) > CONTEXT_SCAN {
        return Ok(u64::MAX);
    }
    let mut sum = 0u64;
    let mut after = covered;
    loop {
        let page = h.episodes_after(session, after, PAGE)?;
        let Some(l) = page.last() else { break };
        after = l.id;
        sum += page
            .iter()
            .map(|e| u64::from(e.tokens) + u64::from(plan::MESSAGE_COST))
            .sum::<u64>();
    }
    Ok(sum)
}

/// The context for the next model call (see the WIT `context`).
pub fn context(
    h: &mut impl Host,
    session: &str,
    req: ContextRequest,
    cfg: &Config,
) -> Result<ContextWindow, Error> {
    if session.trim().is_empty() {
        return Err(Error::InvalidInput(
            "the session id is empty; pass a session id".into(),
        ));
    }
    let stats = h.stats(session)?;
    let covered = h.latest_summary(session)?.map_or(0, |r| r.last_episode);
    let beyond = stats.last_episode - covered;
    let (mut refreshed, mut refresh_due) = (false, false);
    let window_mode = cfg.mode == policy::Mode::Window;
    // `refresh-after` at its maximum: the caller runs refreshes itself (as jobs), so nothing
    // here calls the model (nor reads the backlog to decide whether to).
    let inline = req.refresh_after != u32::MAX;
    // Unsummarized episodes that would not fit beside the summary are due whatever their
    // count: a context must not silently lose the middle of the conversation.
    let overflow = inline
        && beyond > 0
        && backlog_cost(h, session, covered, stats.last_episode)? > u64::from(req.budget / 2);
    let wants = inline
        && if window_mode {
            beyond > 0
        } else {
            beyond > u64::from(req.refresh_after) || overflow
        };
    if wants {
        let (f, marker) = freshness_and_marker(h, session, cfg)?;
        let may = matches!(f.state, FreshState::Due | FreshState::Waiting);
        let run = match cfg.mode {
            policy::Mode::Eager => may,
            // The window is folded when a batch has left it, or when it no longer fits.
            policy::Mode::Window => f.state == FreshState::Due || (may && overflow),
            policy::Mode::Idle => false,
        };
        if run {
            validate(session, cfg)?;
            let upto = if overflow {
                u64::MAX
            } else {
                refresh_upto(cfg, stats.last_episode)
            };
            match guarded(h, session, cfg, marker, upto) {
                Ok(out) => refreshed = out.passes > 0,
                // The previous summary serves; the caller sees that a refresh is due.
                Err(e) => {
                    h.log(
                        Level::Warn,
                        &format!(
                            "session {session}: context uses the previous summary: {}",
                            error_text(&e)
                        ),
                    );
                    refresh_due = true;
                }
            }
        } else if !window_mode || f.state != FreshState::Waiting {
            refresh_due = true;
        }
    }
    // Pinned episodes, in order, each once.
    let mut pin_ids: Vec<u64> = req
        .pins
        .iter()
        .copied()
        .filter(|&p| p >= 1 && p <= stats.last_episode)
        .collect();
    pin_ids.sort_unstable();
    pin_ids.dedup();
    let mut pinned = Vec::with_capacity(pin_ids.len());
    for id in pin_ids {
        pinned.extend(h.episodes_after(session, id - 1, 1)?);
    }
    let mut rows = h.summaries(session)?;
    // Where the chain ends now (a refresh above may have moved it).
    let covered = rows.last().map_or(0, |r| r.last_episode);
    let (from, pairs) = if window_mode {
        // Every unsummarized message, and at least the usual recent pairs.
        let from = covered.min(
            stats
                .last_episode
                .saturating_sub(u64::from(req.pairs.max(1)) * 2),
        );
        (from, (stats.last_episode - from).div_ceil(2) as u32 + 1)
    } else {
        let want = u64::from(req.pairs.max(1)) * 4 + 8;
        (stats.last_episode.saturating_sub(want), req.pairs)
    };
    let tail = h.episodes_after(
        session,
        from,
        (stats.last_episode - from).min(u64::from(u32::MAX)) as u32,
    )?;
    // The second level on demand: a chain that cannot fit this budget beside the newest
    // message and the pins is compacted further (when the mode lets the model be called).
    let newest = tail.last().map_or(0, |e| crate::context::cost(&e.content));
    let pins_cost: u32 = pinned
        .iter()
        .map(|e| crate::context::cost(&e.content))
        .sum();
    let share = req
        .budget
        .saturating_sub(newest)
        .saturating_sub(pins_cost)
        .saturating_sub(cfg.ledger_tokens.min(req.budget / 4))
        .saturating_sub(crate::context::cost(crate::context::SUMMARY_HEADER));
    if inline && rows.len() >= 2 && chain_tokens(&rows) > share && cfg.mode != policy::Mode::Idle {
        match compact_chain(h, session, cfg, share.min(cfg.summary_budget_tokens)) {
            Ok(written) if !written.is_empty() => rows = h.summaries(session)?,
            Ok(_) => {}
            Err(e) => h.log(
                Level::Warn,
                &format!(
                    "session {session}: the chain does not fit the context and compacting it failed: {}",
                    error_text(&e)
                ),
            ),
        }
    }
    let window = crate::context::assemble(&crate::context::Parts {
        rows: &rows,
        tail: &tail,
        pinned: &pinned,
        last_episode: stats.last_episode,
        budget: req.budget,
        pairs,
        ledger_budget: cfg.ledger_tokens,
    });
    Ok(ContextWindow {
        window,
        full_tokens: stats.total_tokens + u64::from(plan::MESSAGE_COST) * stats.episodes,
        refreshed,
        refresh_due,
    })
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

/// What `expand` returns (mirrors the WIT `expansion`).
#[derive(Clone, Debug, PartialEq)]
pub struct Expansion {
    /// The row.
    pub row: SummaryRow,
    /// The covered episodes (or the identifier's episode), one page.
    pub episodes: Vec<Episode>,
    /// The rows it compacted, oldest first.
    pub compacted: Vec<SummaryRow>,
    /// Where the next page starts, if the page was cut.
    pub next_after: Option<u64>,
}

/// Provenance: row `row_id` of the session and exactly the episodes it covers (a page of
/// `limit` after `after`), or with `identifier` the episode that ledger entry was last seen in.
pub fn expand(
    h: &mut impl Host,
    session: &str,
    row_id: u64,
    identifier: Option<&str>,
    after: u64,
    limit: u32,
) -> Result<Expansion, Error> {
    let history = h.summary_history(session)?;
    let Some(row) = history.iter().find(|r| r.id == row_id).cloned() else {
        return Err(Error::InvalidInput(format!(
            "session '{session}' has no summary row {row_id}; list its rows with 'abridge summaries {session} --all'"
        )));
    };
    let compacted: Vec<SummaryRow> = history
        .iter()
        .filter(|r| r.compacted_into == Some(row_id))
        .cloned()
        .collect();
    if let Some(id) = identifier {
        let Some(entry) = row.ledger.entries.iter().find(|e| e.text == id) else {
            return Err(Error::InvalidInput(format!(
                "summary row {row_id} has no ledger entry '{id}'; 'abridge expand {session} {row_id}' lists its ledger"
            )));
        };
        let episodes = h.episodes_after(session, entry.episode.saturating_sub(1), 1)?;
        return Ok(Expansion {
            row,
            episodes,
            compacted,
            next_after: None,
        });
    }
    let start = after.max(row.first_episode - 1);
    let limit = limit.clamp(1, 10_000);
    let mut episodes = Vec::new();
    if start < row.last_episode {
        let want = (row.last_episode - start).min(u64::from(limit)) as u32;
        episodes = h.episodes_after(session, start, want)?;
        episodes.retain(|e| e.id <= row.last_episode);
    }
    let next_after = episodes
        .last()
        .map(|e| e.id)
        .filter(|&l| l < row.last_episode);
    Ok(Expansion {
        row,
        episodes,
        compacted,
        next_after,
    })
}

/// How often one call re-plans after the model refused a prompt as longer than its context
/// (each refusal recalibrates the estimator first).
const MAX_OVERFLOW_REPLANS: u32 = 3;

/// The seed of the one re-ask of an answer that failed the quality gate.
const RETRY_SEED: u32 = 7919;

/// How often one call starts a pass again after a concurrent writer changed the chain first.
const MAX_CONFLICT_RETRIES: u32 = 5;

/// A call's view of the host in which ordinary calibration measurements wait for the call to
/// succeed. A failed map-reduce keeps the answers it received in the partial cache, keyed by
/// the exact request; had its measurements moved the calibration, the rerun would cut other
/// chunk boundaries, miss every cached answer and ask the model for all of it again. Refusals
/// (over-long prompts) count at once: the call re-plans on them, and the rerun must plan as the
/// last re-plan did.
struct Deferred<'a, H: Host> {
    inner: &'a mut H,
    /// Measurements `(model, estimated, reported)` not yet recorded.
    pending: Vec<(String, u32, u32)>,
}

impl<H: Host> Host for Deferred<'_, H> {
    fn stats(&mut self, session: &str) -> Result<Stats, Error> {
        self.inner.stats(session)
    }
    fn episodes_after(&mut self, s: &str, after: u64, limit: u32) -> Result<Vec<Episode>, Error> {
        self.inner.episodes_after(s, after, limit)
    }
    fn latest_summary(&mut self, session: &str) -> Result<Option<SummaryRow>, Error> {
        self.inner.latest_summary(session)
    }
    fn write_summary(&mut self, session: &str, w: SummaryWrite) -> Result<SummaryRow, Error> {
        self.inner.write_summary(session, w)
    }
    fn generate(&mut self, req: Request) -> Result<Response, Error> {
        self.inner.generate(req)
    }
    fn generate_batch(&mut self, reqs: Vec<Request>) -> Vec<Result<Response, Error>> {
        self.inner.generate_batch(reqs)
    }
    fn partial(&mut self, key: &str) -> Result<Option<Cached>, Error> {
        self.inner.partial(key)
    }
    fn progress(&mut self, level: u32, done: u32, total: u32) {
        self.inner.progress(level, done, total)
    }
    fn calibration(&mut self, model: &str) -> Result<Option<(u64, u64)>, Error> {
        // Within the call the measurements count as before.
        let (mut e, mut r) = self.inner.calibration(model)?.unwrap_or((0, 0));
        let mut any = e > 0 || r > 0;
        for (m, pe, pr) in &self.pending {
            if m == model {
                e += u64::from(*pe);
                r += u64::from(*pr);
                any = true;
            }
        }
        Ok(any.then_some((e, r)))
    }
    fn record_calibration(
        &mut self,
        model: &str,
        estimated: u32,
        reported: u32,
    ) -> Result<(), Error> {
        self.pending.push((model.to_string(), estimated, reported));
        Ok(())
    }
    fn record_refusal(&mut self, model: &str, estimated: u32, reported: u32) -> Result<(), Error> {
        self.inner.record_refusal(model, estimated, reported)
    }
    fn summaries(&mut self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        self.inner.summaries(session)
    }
    fn summary_history(&mut self, session: &str) -> Result<Vec<SummaryRow>, Error> {
        self.inner.summary_history(session)
    }
    fn compact_summaries(&mut self, session: &str, c: Compaction) -> Result<SummaryRow, Error> {
        self.inner.compact_summaries(session, c)
    }
    fn failure(&mut self, session: &str) -> Result<Option<FailureMarker>, Error> {
        self.inner.failure(session)
    }
    fn set_failure(&mut self, session: &str, marker: Option<FailureMarker>) -> Result<(), Error> {
        self.inner.set_failure(session, marker)
    }
    fn reset_session(&mut self, session: &str) -> Result<(), Error> {
        self.inner.reset_session(session)
    }
    fn now_ms(&mut self) -> u64 {
        self.inner.now_ms()
    }
    fn log(&mut self, level: Level, msg: &str) {
        self.inner.log(level, msg)
    }
}

fn catch_up(h: &mut impl Host, session: &str, cfg: &Config, upto: u64) -> Result<Outcome, Error> {
    let mut d = Deferred {
        inner: h,
        pending: Vec::new(),
    };
    let mut out = catch_up_now(&mut d, session, cfg, upto)?;
    // The second level: keep the active chain within its budget.
    match compact_chain(&mut d, session, cfg, cfg.summary_budget_tokens) {
        Ok(rows) => out.written.extend(rows),
        Err(e) => d.log(
            Level::Warn,
            &format!(
                "session {session}: compacting the oldest summary rows failed; they stay as they are: {}",
                error_text(&e)
            ),
        ),
    }
    // Only a call that succeeded teaches the estimator (see `Deferred`).
    for (model, e, r) in std::mem::take(&mut d.pending) {
        d.inner.record_calibration(&model, e, r)?;
    }
    Ok(out)
}

fn catch_up_now(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    upto: u64,
) -> Result<Outcome, Error> {
    let start = h.stats(session)?;
    let end = start.last_episode.min(upto);
    let mut out = Outcome::default();
    let mut overflows = 0;
    let mut conflicts = 0;
    let mut long_path_done = false;
    loop {
        let step = if long_path_done {
            pass(h, session, cfg, end)
        } else {
            map_reduce_if_long(h, session, cfg, &start, end)
        };
        let row = match step {
            Err(Error::ContextOverflow(m)) if overflows < MAX_OVERFLOW_REPLANS => {
                overflows += 1;
                h.log(
                    Level::Warn,
                    &format!(
                        "session {session}: re-planning with the recalibrated estimator ({m})"
                    ),
                );
                continue;
            }
            // Another process wrote a row for this session first (two ingests of one
            // session): re-read where the chain stands and go on from there.
            Err(Error::Conflict(m)) if conflicts < MAX_CONFLICT_RETRIES => {
                conflicts += 1;
                h.log(
                    Level::Info,
                    &format!("session {session}: another writer summarized first; continuing from its row ({m})"),
                );
                continue;
            }
            Err(e) => return Err(e),
            Ok(None) if !long_path_done => {
                long_path_done = true;
                continue;
            }
            Ok(None) => break,
            Ok(Some(row)) => row,
        };
        long_path_done = true;
        out.triggered = true;
        out.passes += 1;
        let reached = row.last_episode;
        out.written.push(row);
        // Episodes that arrive while this call runs (a chat app keeps posting) are the next
        // call's work: a call covers what the session held when it started, and ends.
        if reached >= end {
            break;
        }
        // Each pass covers at least one episode, so this bound is never reached by a correct
        // store; it turns a misbehaving one into an error instead of a loop.
        if u64::from(out.passes) > start.episodes + 1 {
            return Err(Error::Storage(
                "the store did not record summary coverage; stopping".into(),
            ));
        }
    }
    let stats = h.stats(session)?;
    let latest = h.latest_summary(session)?;
    out.unsummarized = policy::unsummarized(&stats, latest.as_ref());
    Ok(out)
}

/// The ledger a row carries: `base` (the row it updates, if any) merged with the identifiers
/// of `episodes`, within the ledger budget (empty when the ledger is off).
fn row_ledger<'a>(
    cfg: &Config,
    base: Option<&Ledger>,
    episodes: impl IntoIterator<Item = (u64, &'a str)>,
) -> Ledger {
    if cfg.ledger_tokens == 0 {
        return Ledger::default();
    }
    let new = ledger::of_episodes(episodes);
    let merged = match base {
        Some(b) => ledger::merge(b, &new),
        None => new,
    };
    ledger::budgeted(&merged, cfg.ledger_tokens)
}

/// The prompt extras of a fold into `strategy`'s row: that row's ledger (as facts to keep)
/// and the session's focus.
fn fold_ledger(strategy: &Strategy) -> String {
    match strategy {
        Strategy::Update(r) => ledger::render(&r.ledger),
        _ => String::new(),
    }
}

/// One summary pass over the oldest unsummarized episodes (up to episode `upto`) that fit the
/// budget. `None` when the session is caught up to `upto`.
fn pass(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    upto: u64,
) -> Result<Option<SummaryRow>, Error> {
    let f = calibration_factor(h, cfg)?;
    let latest = h.latest_summary(session)?;
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    if covered >= upto {
        return Ok(None);
    }
    let strategy = policy::strategy(latest.as_ref(), cfg);
    let previous = match &strategy {
        Strategy::Update(r) => Some(r.content.clone()),
        _ => None,
    };
    let ledger_text = fold_ledger(&strategy);
    let extras = prompt::Extras {
        ledger: &ledger_text,
        focus: &cfg.focus,
    };
    let budget =
        policy::input_budget_f(cfg, f, prompt::fixed_tokens_x(previous.as_deref(), &extras))
            .map_err(Error::InvalidInput)?;

    let mut selected: Vec<Episode> = Vec::new();
    let mut used = 0u32;
    let mut after = covered;
    'fill: loop {
        let page = h.episodes_after(session, after, PAGE)?;
        if page.is_empty() {
            break;
        }
        for ep in page {
            let cost = ep.tokens.saturating_add(3);
            if ep.id > upto || used.saturating_add(cost) > budget {
                break 'fill;
            }
            used += cost;
            after = ep.id;
            selected.push(ep);
        }
    }
    if selected.is_empty() {
        return match h.episodes_after(session, covered, 1)?.into_iter().next() {
            Some(big) if big.id <= upto => {
                oversized(h, session, cfg, &strategy, previous, big).map(Some)
            }
            _ => Ok(None),
        };
    }

    let first = selected[0].id;
    let last = selected[selected.len() - 1].id;
    h.log(
        Level::Info,
        &format!(
            "session {session}: {} episodes {first}-{last} (~{used} tokens) as {}",
            selected.len(),
            describe(&strategy)
        ),
    );
    let base = match &strategy {
        Strategy::Update(r) => Some(&r.ledger),
        _ => None,
    };
    let ledger = row_ledger(
        cfg,
        base,
        selected.iter().map(|e| (e.id, e.content.as_str())),
    );
    let conversation: Vec<Message> = selected
        .into_iter()
        .map(|e| Message::new(e.role, e.content).by(e.speaker))
        .collect();
    let generated = generate(h, cfg, &conversation, previous.as_deref(), &extras)?;
    write(h, session, cfg, &strategy, covered, last, generated, ledger).map(Some)
}

/// One episode larger than a whole prompt: fold its pieces into the summary one after the
/// other, so nothing is dropped, and record it as covered once all pieces are in.
fn oversized(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    strategy: &Strategy,
    previous: Option<String>,
    ep: Episode,
) -> Result<SummaryRow, Error> {
    let f = calibration_factor(h, cfg)?;
    let ledger_text = fold_ledger(strategy);
    let extras = prompt::Extras {
        ledger: &ledger_text,
        focus: &cfg.focus,
    };
    // Later pieces carry the running summary (at most one output long) as the previous one.
    let fixed = prompt::fixed_tokens_x(previous.as_deref(), &extras)
        .max(prompt::fixed_tokens_x(Some(""), &extras) + cfg.max_output_tokens);
    const MARKER: u32 = 16; // "(part i of n of one long message)"
    let budget = policy::input_budget_f(cfg, f, fixed)
        .map_err(Error::InvalidInput)?
        .saturating_sub(3 + MARKER)
        .max(1);
    let pieces = chunk::split_to_fit(&ep.content, budget);
    h.log(
        Level::Info,
        &format!(
            "session {session}: episode {} (~{} tokens) exceeds one prompt; folding it in {} parts",
            ep.id,
            ep.tokens,
            pieces.len()
        ),
    );
    let mut current = previous;
    let mut spent = Generated {
        text: String::new(),
        prompt_tokens: 0,
        output_tokens: 0,
        skipped: Vec::new(),
    };
    let n = pieces.len();
    for (i, piece) in pieces.iter().enumerate() {
        let content = format!("(part {} of {n} of one long message)\n{piece}", i + 1);
        let g = generate(
            h,
            cfg,
            &[Message::new(ep.role, content).by(ep.speaker.clone())],
            current.as_deref(),
            &extras,
        )?;
        spent.prompt_tokens = spent.prompt_tokens.saturating_add(g.prompt_tokens);
        spent.output_tokens = spent.output_tokens.saturating_add(g.output_tokens);
        current = Some(g.text);
    }
    spent.text = current.unwrap_or_default();
    let covered = ep.id - 1;
    let base = match strategy {
        Strategy::Update(r) => Some(&r.ledger),
        _ => None,
    };
    let ledger = row_ledger(cfg, base, [(ep.id, ep.content.as_str())]);
    write(h, session, cfg, strategy, covered, ep.id, spent, ledger)
}

fn describe(s: &Strategy) -> String {
    match s {
        Strategy::Fresh => "a fresh summary".into(),
        Strategy::Update(r) => format!("an update of summary {}", r.id),
        Strategy::NewRow => "a new summary row".into(),
    }
}

#[allow(clippy::too_many_arguments)]
fn write(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    strategy: &Strategy,
    covered: u64,
    last: u64,
    g: Generated,
    ledger: Ledger,
) -> Result<SummaryRow, Error> {
    let (replaces, first) = match strategy {
        Strategy::Update(r) => (Some(r.id), r.first_episode),
        _ => (None, covered + 1),
    };
    let model = match cfg.engine {
        Engine::Llm => cfg.model.clone(),
        Engine::Extractive => "extractive".to_string(),
    };
    let now_ms = h.now_ms();
    h.write_summary(
        session,
        SummaryWrite {
            replaces,
            first_episode: first,
            last_episode: last,
            tokens: crate::tokens::estimate_tokens(&g.text),
            content: g.text,
            prompt_tokens: g.prompt_tokens,
            output_tokens: g.output_tokens,
            model,
            now_ms,
            skipped: g.skipped,
            ledger,
        },
    )
}

/// Most compactions one call runs (each folds at least two rows, so the chain shrinks).
const MAX_COMPACTIONS: usize = 32;

/// Estimated tokens the active chain takes in a context (each row's text and its label).
pub fn chain_tokens(rows: &[SummaryRow]) -> u32 {
    rows.iter()
        .map(|r| r.tokens.saturating_add(plan::LABEL_COST))
        .sum()
}

/// The second level: while the active chain takes more than `budget` tokens, fold its oldest
/// rows into one "earlier" row (a fold of summaries labelled with its whole range, its ledger
/// merged), recursively, so the chain keeps covering episode 1 to now. The folded rows stay
/// in the store (`summary-history`). Returns the rows written.
pub fn compact_chain(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    budget: u32,
) -> Result<Vec<SummaryRow>, Error> {
    let mut written = Vec::new();
    let mut conflicts = 0;
    while written.len() < MAX_COMPACTIONS {
        let rows = h.summaries(session)?;
        let total = chain_tokens(&rows);
        if total <= budget || rows.len() < 2 {
            break;
        }
        // Fold the oldest rows, all but the newest (which a fold may still update) unless
        // only two are left; just enough of them for the chain to fit, at least two, no
        // more than one merge prompt holds.
        let end = if rows.len() >= 3 {
            rows.len() - 1
        } else {
            rows.len()
        };
        let f = calibration_factor(h, cfg)?;
        let merged_of = |rs: &[SummaryRow]| {
            if cfg.ledger_tokens == 0 {
                return Ledger::default();
            }
            let all = rs
                .iter()
                .fold(Ledger::default(), |acc, r| ledger::merge(&acc, &r.ledger));
            ledger::budgeted(&all, cfg.ledger_tokens)
        };
        // The merge prompt's room, with the largest ledger the group could carry.
        let widest = ledger::render(&merged_of(&rows[..end]));
        let room = if cfg.engine == Engine::Llm {
            let extras = prompt::Extras {
                ledger: &widest,
                focus: &cfg.focus,
            };
            policy::input_budget_f(cfg, f, prompt::reduce_fixed_tokens_x(&extras))
                .map_err(Error::InvalidInput)?
        } else {
            u32::MAX
        };
        let out_cost = cfg.max_output_tokens.min(EXPECTED_PARTIAL_TOKENS * 2) + plan::LABEL_COST;
        let (mut take, mut used, mut folded) = (0usize, 0u32, 0u32);
        for r in &rows[..end] {
            let c = prompt::partial_cost(&r.content);
            if take >= 2 && (used.saturating_add(c) > room || total - folded + out_cost <= budget) {
                break;
            }
            used = used.saturating_add(c);
            folded += r.tokens.saturating_add(plan::LABEL_COST);
            take += 1;
        }
        if take < 2 {
            break;
        }
        let group = &rows[..take];
        let merged_ledger = merged_of(group);
        let ledger_text = ledger::render(&merged_ledger);
        let extras = prompt::Extras {
            ledger: &ledger_text,
            focus: &cfg.focus,
        };
        let (first, last) = (group[0].first_episode, group[take - 1].last_episode);
        h.log(
            Level::Info,
            &format!(
                "session {session}: the summary chain takes ~{total} tokens, over its {budget}; compacting rows {}-{} (episodes {first}-{last}) into one earlier row",
                group[0].id,
                group[take - 1].id
            ),
        );
        let g = match cfg.engine {
            Engine::Extractive => {
                let joined = group
                    .iter()
                    .map(|r| r.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                let text = extractive::summarize(&[], Some(&joined), cfg.max_output_tokens);
                Generated {
                    text,
                    prompt_tokens: 0,
                    output_tokens: 0,
                    skipped: Vec::new(),
                }
            }
            Engine::Llm => {
                let partials: Vec<Partial> = group
                    .iter()
                    .map(|r| Partial {
                        first: r.first_episode,
                        last: r.last_episode,
                        text: r.content.clone(),
                    })
                    .collect();
                let req = request(cfg, prompt::build_reduce_x(&partials, &extras));
                let estimated = prompt_estimate(&req);
                let source = source_text(&req);
                let resp = h.generate(req);
                calibrate(h, cfg, estimated, &resp)?;
                accept(h, cfg, resp?, estimated, &source)?
            }
        };
        let tokens = estimate_tokens(&g.text);
        let before: u32 = group.iter().map(|r| r.tokens).sum();
        if g.text.trim().is_empty() || tokens >= before {
            h.log(
                Level::Warn,
                &format!(
                    "session {session}: compacting rows {}-{} saved nothing ({tokens} of {before} tokens); left as they are",
                    group[0].id,
                    group[take - 1].id
                ),
            );
            break;
        }
        let model = match cfg.engine {
            Engine::Llm => cfg.model.clone(),
            Engine::Extractive => "extractive".to_string(),
        };
        let now_ms = h.now_ms();
        let skipped = merge_ranges(group.iter().flat_map(|r| r.skipped.clone()).collect());
        let c = Compaction {
            rows: group.iter().map(|r| r.id).collect(),
            content: g.text,
            tokens,
            prompt_tokens: g.prompt_tokens,
            output_tokens: g.output_tokens,
            model,
            now_ms,
            skipped,
            ledger: merged_ledger,
        };
        match h.compact_summaries(session, c) {
            Ok(row) => written.push(row),
            Err(Error::Conflict(m)) if conflicts < MAX_CONFLICT_RETRIES => {
                conflicts += 1;
                h.log(
                    Level::Info,
                    &format!(
                        "session {session}: the chain changed while compacting; re-reading ({m})"
                    ),
                );
            }
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// How a summarize call would proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanPath {
    /// Nothing to do.
    Nothing,
    /// One call.
    Single,
    /// Successive passes into an existing summary.
    Rolling,
    /// Map-reduce.
    MapReduce,
}

/// What `summarize_now` would do (mirrors the WIT `plan-report`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanReport {
    /// The path.
    pub path: PlanPath,
    /// Episodes not yet covered.
    pub episodes: u64,
    /// Their estimated tokens, message costs included.
    pub backlog_tokens: u64,
    /// Map chunks, or passes.
    pub chunks: u32,
    /// Reduce calls per level.
    pub levels: Vec<u32>,
    /// Model calls in all.
    pub calls: u32,
    /// Estimated prompt tokens.
    pub input_tokens: u64,
    /// Upper bound on generated tokens.
    pub output_tokens: u64,
}

/// Every episode after `after`, read page by page.
fn episodes_after_all(h: &mut impl Host, session: &str, after: u64) -> Result<Vec<Episode>, Error> {
    let mut eps: Vec<Episode> = Vec::new();
    loop {
        let page = h.episodes_after(session, eps.last().map_or(after, |e| e.id), PAGE)?;
        if page.is_empty() {
            return Ok(eps);
        }
        eps.extend(page);
    }
}

/// The map chunk budget: the derived one, capped by `chunk-tokens` when that is set.
fn chunk_cap(cfg: &Config, budget: u32) -> u32 {
    if cfg.chunk_tokens > 0 {
        budget.min(cfg.chunk_tokens)
    } else {
        budget
    }
}

/// Tokens a partial summary is expected to take when planning reduce levels: a 3–5 sentence
/// summary is at most about 160 tokens, and never more than the output limit.
pub const EXPECTED_PARTIAL_TOKENS: u32 = 160;

fn expected_partial(cfg: &Config) -> u32 {
    cfg.max_output_tokens.min(EXPECTED_PARTIAL_TOKENS)
}

/// Plan `summarize_now` without calling the model or writing anything.
pub fn plan_report(h: &mut impl Host, session: &str, cfg: &Config) -> Result<PlanReport, Error> {
    let f = calibration_factor(h, cfg)?;
    validate(session, cfg)?;
    let latest = h.latest_summary(session)?;
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    let eps = episodes_after_all(h, session, covered)?;
    let backlog: u64 = eps
        .iter()
        .map(|e| u64::from(e.tokens) + u64::from(plan::MESSAGE_COST))
        .sum();
    let out = u64::from(cfg.max_output_tokens);
    let llm = cfg.engine == Engine::Llm;
    let mut report = PlanReport {
        path: PlanPath::Nothing,
        episodes: eps.len() as u64,
        backlog_tokens: backlog,
        chunks: 0,
        levels: Vec::new(),
        calls: 0,
        input_tokens: 0,
        output_tokens: 0,
    };
    if eps.is_empty() {
        return Ok(report);
    }
    let fixed = prompt::fixed_tokens_x(
        latest.as_ref().map(|r| r.content.as_str()),
        &focus_only(cfg),
    );
    let budget = policy::input_budget_f(cfg, f, fixed).map_err(Error::InvalidInput)?;
    if let Some(map_budget) = long_path(cfg, f, latest.as_ref(), backlog)? {
        let budget = map_budget;
        let first = eps[0].id;
        let chunks = plan::plan_chunks(
            eps.iter().map(|e| (e.id, e.tokens)),
            chunk_cap(cfg, budget),
            |id| eps[(id - first) as usize].content.clone(),
        );
        let reduce_budget =
            policy::input_budget_f(cfg, f, prompt::reduce_fixed_tokens_x(&focus_only(cfg)))
                .map_err(Error::InvalidInput)?;
        // Estimate with the expected partial size; in a tight context, with smaller ones
        // (execution groups the real partials by their real size).
        let mut partial = expected_partial(cfg);
        let levels = loop {
            match plan::plan_levels(chunks.len(), partial, reduce_budget) {
                Some(levels) => break levels,
                None if partial > 16 => partial /= 2,
                None => {
                    return Err(Error::InvalidInput(format!(
                        "a {}-token context cannot merge two partial summaries; raise the context length or lower max-output-tokens",
                        cfg.context_length
                    )));
                }
            }
        };
        let map_in: u64 = chunks
            .iter()
            .map(|c| u64::from(c.tokens) + u64::from(fixed))
            .sum();
        let reduce_in: u64 = levels
            .iter()
            .flatten()
            .map(|g| {
                u64::from(prompt::reduce_fixed_tokens_x(&focus_only(cfg)))
                    + g.len() as u64 * u64::from(partial + plan::LABEL_COST)
            })
            .sum();
        let calls = chunks.len() + levels.iter().map(Vec::len).sum::<usize>();
        report.path = PlanPath::MapReduce;
        report.chunks = chunks.len() as u32;
        report.levels = levels.iter().map(|l| l.len() as u32).collect();
        report.calls = calls as u32;
        report.input_tokens = map_in + reduce_in;
        report.output_tokens = calls as u64 * out;
        return Ok(report);
    }
    let passes = backlog.div_ceil(u64::from(budget)).max(1);
    report.path = if latest.is_none() && passes == 1 {
        PlanPath::Single
    } else {
        PlanPath::Rolling
    };
    report.chunks = passes as u32;
    if llm {
        report.calls = passes as u32;
        report.input_tokens = backlog + passes * u64::from(fixed);
        report.output_tokens = passes * out;
    }
    Ok(report)
}

/// Produce summary text for `conversation` (folding into `previous` if given), with the
/// prompt's `extras` (the ledger to keep, the focus).
fn generate(
    h: &mut impl Host,
    cfg: &Config,
    conversation: &[Message],
    previous: Option<&str>,
    extras: &prompt::Extras,
) -> Result<Generated, Error> {
    match cfg.engine {
        Engine::Extractive => {
            let text = extractive::summarize(conversation, previous, cfg.max_output_tokens);
            if text.is_empty() {
                return Err(Error::RejectedOutput(
                    "the episodes contain no text to select from".into(),
                ));
            }
            Ok(Generated {
                text,
                prompt_tokens: 0,
                output_tokens: 0,
                skipped: Vec::new(),
            })
        }
        Engine::Llm => {
            let req = request(cfg, prompt::build_x(conversation, previous, extras));
            let estimated = prompt_estimate(&req);
            let source = source_text(&req);
            let resp = h.generate(req);
            calibrate(h, cfg, estimated, &resp)?;
            accept(h, cfg, resp?, estimated, &source)
        }
    }
}

/// The model's calibration factor (1.0 for the extractive engine).
fn calibration_factor(h: &mut impl Host, cfg: &Config) -> Result<f64, Error> {
    if cfg.engine != Engine::Llm {
        return Ok(1.0);
    }
    Ok(policy::factor(h.calibration(&cfg.model)?))
}

/// Our estimate of a request's prompt, counted the way budgets count it.
pub(crate) fn prompt_estimate(req: &Request) -> u32 {
    match &req.prompt {
        Prompt::Chat(ms) => {
            ms.iter()
                .map(|m| estimate_tokens(&m.content) + crate::tokens::MESSAGE_OVERHEAD)
                .sum::<u32>()
                + crate::tokens::MESSAGE_OVERHEAD
        }
        Prompt::Raw(s) => estimate_tokens(s),
    }
}

/// Learn from a model's answer: a reported prompt count calibrates the estimator; a refusal
/// as over-long records that the model counts at least a quarter more than the context.
fn calibrate(
    h: &mut impl Host,
    cfg: &Config,
    estimated: u32,
    resp: &Result<Response, Error>,
) -> Result<(), Error> {
    match resp {
        Ok(r) => match r.prompt_tokens {
            // A count at the context's size may be a silent truncation, and so is one far
            // below our estimate (a server that cut the prompt to a smaller window of its
            // own, as Ollama's /v1 does without num_ctx): neither is a measurement.
            Some(p) if p > 0 && p < cfg.context_length && !truncated(estimated, p) => {
                h.record_calibration(&cfg.model, estimated, p)
            }
            Some(p) if p > 0 && truncated(estimated, p) => {
                h.log(
                    Level::Warn,
                    &format!(
                        "the model counted {p} prompt tokens for a prompt estimated at {estimated}: \
                         the server probably truncated it; not used for calibration"
                    ),
                );
                Ok(())
            }
            _ => Ok(()),
        },
        Err(Error::ContextOverflow(_)) => {
            let over = cfg
                .context_length
                .saturating_add(cfg.context_length / 4)
                .max(estimated.saturating_add(estimated / 4));
            h.log(Level::Warn, &format!("the model refused a prompt we estimated at {estimated} tokens as longer than its {}-token context; recalibrating", cfg.context_length));
            h.record_refusal(&cfg.model, estimated, over)
        }
        Err(_) => Ok(()),
    }
}

/// Whether a reported prompt count is too far below our estimate to be the whole prompt. The
/// estimator over-counts BPE tokenizers by a fraction, never by half, on prompts large enough
/// to matter.
pub(crate) fn truncated(estimated: u32, reported: u32) -> bool {
    estimated >= 512 && u64::from(reported) * 2 < u64::from(estimated)
}

/// The model request for a built prompt, in the configured rendering.
pub(crate) fn request(cfg: &Config, built: prompt::Built) -> Request {
    let (prompt, stop) = match cfg.rendering {
        Rendering::Chat => (Prompt::Chat(built.messages), Vec::new()),
        Rendering::Chatml => (
            Prompt::Raw(built.chatml),
            prompt::CHATML_STOP.iter().map(|s| s.to_string()).collect(),
        ),
    };
    Request {
        model: cfg.model.clone(),
        prompt,
        temperature: cfg.temperature,
        max_output_tokens: cfg.max_output_tokens,
        context_length: cfg.context_length,
        stop,
        cache_key: None,
        seed: None,
    }
}

/// What a request gives the model to summarize: its non-system messages (the conversation,
/// the current summary, the ledger), or the whole raw prompt. A quotation in the answer must
/// occur here.
fn source_text(req: &Request) -> String {
    match &req.prompt {
        Prompt::Chat(ms) => ms
            .iter()
            .filter(|m| m.role != crate::types::Role::System)
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Prompt::Raw(s) => s.clone(),
    }
}

/// Clean a model answer and pass it through the quality gate, including the provenance check:
/// a quoted span must occur in `source` (see [`quality::unsupported_quote`]).
fn accept(
    h: &mut impl Host,
    cfg: &Config,
    resp: Response,
    estimated: u32,
    source: &str,
) -> Result<Generated, Error> {
    if let Some(p) = resp.prompt_tokens
        && p >= cfg.context_length.saturating_sub(cfg.max_output_tokens)
    {
        h.log(
            Level::Warn,
            &format!(
                "the model counted {p} prompt tokens against a context of {}: the server may have truncated the prompt",
                cfg.context_length
            ),
        );
    }
    let cleaned = strip::strip_template_tokens(&resp.text);
    quality::check(&cleaned, resp.finish, cfg.max_output_tokens, estimated)
        .and_then(|()| match quality::unsupported_quote(&cleaned, &[source]) {
            Some(q) => Err(format!(
                "the summary quotes \"{q}\", which does not occur in the text it summarizes (an invented quotation)"
            )),
            None => Ok(()),
        })
        .map_err(|why| {
            h.log(Level::Warn, &format!("summary rejected: {why}"));
            Error::RejectedOutput(why)
        })?;
    Ok(Generated {
        text: cleaned,
        prompt_tokens: resp.prompt_tokens.unwrap_or(0),
        output_tokens: resp.output_tokens.unwrap_or(0),
        skipped: Vec::new(),
    })
}

/// Run requests through the host's batch import, `BATCH` at a time, and check each answer.
/// Progress of stage `level` is reported after each batch, counting `before` answers already
/// in hand out of `total`. The requests whose answers failed the quality gate are handed
/// back in `rejected` (by position), to be asked again.
fn run_batch(
    h: &mut impl Host,
    cfg: &Config,
    reqs: Vec<Request>,
    what: &str,
    spent: &mut (u32, u32),
    (level, before, total): (u32, usize, usize),
    mut rejected: Option<&mut Vec<(usize, Request)>>,
) -> Vec<Result<String, Error>> {
    let mut out = Vec::with_capacity(reqs.len());
    let mut reqs = reqs.into_iter().peekable();
    while reqs.peek().is_some() {
        let batch: Vec<Request> = reqs.by_ref().take(BATCH).collect();
        let estimates: Vec<u32> = batch.iter().map(prompt_estimate).collect();
        let sources: Vec<String> = batch.iter().map(source_text).collect();
        // Kept (one batch at a time) only when a rejected answer may be asked again.
        let sent = rejected.as_ref().map(|_| batch.clone());
        for (j, (resp, estimated)) in h
            .generate_batch(batch)
            .into_iter()
            .zip(estimates)
            .enumerate()
        {
            if let Err(e) = calibrate(h, cfg, estimated, &resp) {
                out.push(Err(e));
                continue;
            }
            // Every answer's tokens were spent, accepted or not.
            if let Ok(r) = &resp {
                spent.0 = spent.0.saturating_add(r.prompt_tokens.unwrap_or(0));
                spent.1 = spent.1.saturating_add(r.output_tokens.unwrap_or(0));
            }
            let answer = resp
                .and_then(|r| accept(h, cfg, r, estimated, &sources[j]))
                .map(|g| g.text);
            if let (Err(Error::RejectedOutput(_)), Some(list), Some(sent)) =
                (&answer, rejected.as_deref_mut(), &sent)
            {
                list.push((out.len(), sent[j].clone()));
            }
            out.push(answer);
        }
        let done = before + out.len();
        h.progress(level, done as u32, total as u32);
        h.log(Level::Info, &format!("{what}: {done}/{total} done"));
    }
    out
}

/// Merge overlapping or adjacent ranges.
fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// A stable key for a request: 128 bits of two FNV-1a hashes over everything that shapes the
/// answer (model, prompt, temperature, limits, stop sequences), in hex. The same in every host.
pub fn request_key(req: &Request) -> String {
    fn feed(h: &mut [u64; 2], bytes: &[u8]) {
        for &b in bytes.iter().chain(&[0xFF]) {
            for (i, x) in h.iter_mut().enumerate() {
                *x ^= u64::from(b) ^ ((i as u64) << 8);
                *x = x.wrapping_mul(0x0000_0100_0000_01B3);
            }
        }
    }
    let mut h = [0xcbf2_9ce4_8422_2325u64, 0x8422_2325_cbf2_9ce4u64];
    feed(&mut h, req.model.as_bytes());
    match &req.prompt {
        Prompt::Chat(ms) => {
            for m in ms {
                feed(&mut h, m.role.wire().as_bytes());
                feed(&mut h, m.content.as_bytes());
            }
        }
        Prompt::Raw(s) => feed(&mut h, s.as_bytes()),
    }
    feed(&mut h, &req.temperature.to_bits().to_le_bytes());
    feed(&mut h, &req.max_output_tokens.to_le_bytes());
    feed(&mut h, &req.context_length.to_le_bytes());
    for s in &req.stop {
        feed(&mut h, s.as_bytes());
    }
    // Only a set seed counts, so keys of requests without one stay what they were.
    if let Some(seed) = req.seed {
        feed(&mut h, b"seed");
        feed(&mut h, &seed.to_le_bytes());
    }
    format!("{:016x}{:016x}", h[0], h[1])
}

/// Answers for stage `level`: cached partial summaries where present (checked again by the
/// quality gate); the rest go to the model with their cache key, so the host caches each
/// complete answer as it arrives and a retried, resumed or cancelled map-reduce asks only for
/// what is missing.
fn cached_batch(
    h: &mut impl Host,
    cfg: &Config,
    reqs: Vec<Request>,
    (level, what): (u32, &str),
    spent: &mut (u32, u32),
) -> Result<Vec<Result<String, Error>>, Error> {
    let total = reqs.len();
    let mut out: Vec<Option<Result<String, Error>>> = vec![None; total];
    let (mut todo, mut todo_at) = (Vec::new(), Vec::new());
    for (i, mut req) in reqs.into_iter().enumerate() {
        let key = request_key(&req);
        if let Some(hit) = h.partial(&key)? {
            // What that answer cost was spent, in this run or an earlier one.
            spent.0 = spent.0.saturating_add(hit.prompt_tokens);
            spent.1 = spent.1.saturating_add(hit.output_tokens);
            let cleaned = strip::strip_template_tokens(&hit.text);
            let checked = quality::check(
                &cleaned,
                Finish::Stop,
                cfg.max_output_tokens,
                prompt_estimate(&req),
            )
            .and_then(|()| {
                match quality::unsupported_quote(&cleaned, &[source_text(&req).as_str()]) {
                    Some(q) => Err(format!("it quotes \"{q}\", which its source lacks")),
                    None => Ok(()),
                }
            });
            match checked {
                Ok(()) => {
                    out[i] = Some(Ok(cleaned));
                    continue;
                }
                Err(why) => h.log(
                    Level::Debug,
                    &format!(
                        "{what}: cached answer {key} fails the quality gate ({why}); asking again"
                    ),
                ),
            }
        }
        req.cache_key = Some(key);
        todo.push(req);
        todo_at.push(i);
    }
    let reused = total - todo.len();
    h.progress(level, reused as u32, total as u32);
    if reused > 0 {
        h.log(
            Level::Info,
            &format!("{what}: reusing {reused} cached partial summaries"),
        );
    }
    // An answer that failed the quality gate (a transcript copy, chatter, a babble) is asked
    // for once more within the run, with another seed, before its chunk counts as failed.
    let mut rejected = Vec::new();
    let answers = run_batch(
        h,
        cfg,
        todo,
        what,
        spent,
        (level, reused, total),
        Some(&mut rejected),
    );
    let mut again = Vec::new();
    for (j, mut req) in rejected {
        req.seed = Some(RETRY_SEED);
        req.cache_key = Some(request_key(&req));
        again.push((todo_at[j], req));
    }
    for (i, r) in todo_at.into_iter().zip(answers) {
        out[i] = Some(r);
    }
    if !again.is_empty() {
        h.log(
            Level::Info,
            &format!(
                "{what}: asking again for {} rejected answer(s) with another seed",
                again.len()
            ),
        );
        let (at, reqs): (Vec<usize>, Vec<Request>) = again.into_iter().unzip();
        let n = reqs.len();
        let answers = run_batch(h, cfg, reqs, what, spent, (level, total - n, total), None);
        for (i, r) in at.into_iter().zip(answers) {
            out[i] = Some(r);
        }
    }
    Ok(out
        .into_iter()
        .map(|r| r.expect("every request has an answer"))
        .collect())
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

/// The prompt extras of map and reduce prompts: the focus only.
fn focus_only(cfg: &Config) -> prompt::Extras<'_> {
    prompt::Extras {
        ledger: "",
        focus: &cfg.focus,
    }
}

/// The map chunk budget when the backlog goes the map-reduce way, else `None`: a session
/// with no summary yet whose backlog exceeds one prompt, or a summarized session whose new
/// part would take more than two rolling passes (the new part is then map-reduced into a new
/// row, never regenerating what is already summarized).
fn long_path(
    cfg: &Config,
    f: f64,
    latest: Option<&SummaryRow>,
    backlog: u64,
) -> Result<Option<u32>, Error> {
    if cfg.engine != Engine::Llm {
        return Ok(None);
    }
    let map_budget = policy::input_budget_f(cfg, f, prompt::fixed_tokens_x(None, &focus_only(cfg)))
        .map_err(Error::InvalidInput)?;
    let limit = match latest {
        None => u64::from(map_budget),
        Some(r) => {
            let pass = policy::input_budget_f(
                cfg,
                f,
                prompt::fixed_tokens_x(Some(&r.content), &focus_only(cfg)),
            )
            .map_err(Error::InvalidInput)?;
            2 * u64::from(pass)
        }
    };
    Ok((backlog > limit).then_some(map_budget))
}

/// Map-reduce for a long backlog (see [`long_path`]): token-budgeted chunks summarized
/// concurrently, then merged in order, level by level, into one row covering every new
/// episode. `None` when the rolling path fits.
fn map_reduce_if_long(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    stats: &Stats,
    upto: u64,
) -> Result<Option<SummaryRow>, Error> {
    let f = calibration_factor(h, cfg)?;
    if cfg.engine != Engine::Llm || stats.episodes == 0 {
        return Ok(None);
    }
    let latest = h.latest_summary(session)?;
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    if covered >= stats.last_episode.min(upto) {
        return Ok(None);
    }
    let mut eps = episodes_after_all(h, session, covered)?;
    eps.retain(|e| e.id <= upto);
    let backlog: u64 = eps
        .iter()
        .map(|e| u64::from(e.tokens) + u64::from(plan::MESSAGE_COST))
        .sum();
    let Some(budget) = long_path(cfg, f, latest.as_ref(), backlog)? else {
        return Ok(None);
    };
    let at = |id: u64| &eps[(id - covered - 1) as usize];
    let chunks = plan::plan_chunks(
        eps.iter().map(|e| (e.id, e.tokens)),
        chunk_cap(cfg, budget),
        |id| at(id).content.clone(),
    );
    h.log(
        Level::Info,
        &format!("session {session}: {} new episodes (~{backlog} tokens) exceed one prompt; map-reduce over {} chunks", eps.len(), chunks.len()),
    );
    let mut parts_of: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    let mut reqs = Vec::with_capacity(chunks.len());
    for c in &chunks {
        let conversation: Vec<Message> = match c.part {
            None => (c.first..=c.last)
                .map(|id| {
                    Message::new(at(id).role, at(id).content.clone()).by(at(id).speaker.clone())
                })
                .collect(),
            Some((i, n)) => {
                let e = at(c.first);
                let parts = parts_of.entry(e.id).or_insert_with(|| {
                    plan::split_parts(&e.content, chunk_cap(cfg, budget))
                        .into_iter()
                        .map(str::to_string)
                        .collect()
                });
                vec![Message::new(
                    e.role,
                    format!(
                        "(part {i} of {n} of one long message)\n{}",
                        parts[(i - 1) as usize]
                    ),
                )]
            }
        };
        reqs.push(request(
            cfg,
            prompt::build_x(&conversation, None, &focus_only(cfg)),
        ));
    }
    let mut spent = (0u32, 0u32);
    let results = cached_batch(
        h,
        cfg,
        reqs,
        (0, &format!("session {session}: map")),
        &mut spent,
    )?;
    // A chunk that still fails after the host's retries is skipped and recorded, unless too
    // many fail: then the call fails rather than writing a thin summary.
    let mut partials: Vec<Partial> = Vec::new();
    let mut skipped = Vec::new();
    let mut last_error = None;
    // A chunk the model refused as over-long is not skipped: the estimator was recalibrated
    // and the whole session is re-planned with smaller chunks.
    if let Some(Err(e)) = results
        .iter()
        .find(|r| matches!(r, Err(Error::ContextOverflow(_))))
    {
        return Err(e.clone());
    }
    for (c, r) in chunks.iter().zip(results) {
        match r {
            Ok(text) => partials.push(Partial {
                first: c.first,
                last: c.last,
                text,
            }),
            Err(e) => {
                h.log(
                    Level::Warn,
                    &format!(
                        "session {session}: skipping episodes {}-{}: {}",
                        c.first,
                        c.last,
                        error_text(&e)
                    ),
                );
                skipped.push((c.first, c.last));
                last_error = Some(e);
            }
        }
    }
    if let Some(e) = last_error {
        let limit = u64::from(cfg.max_skipped_percent.min(100)) * chunks.len() as u64;
        if skipped.len() as u64 * 100 > limit || partials.is_empty() {
            let why = format!(
                "{} of {} chunks failed, over the {}% limit (max-skipped-percent); nothing was written. Last error: {}",
                skipped.len(),
                chunks.len(),
                cfg.max_skipped_percent,
                error_text(&e)
            );
            return Err(with_message(e, why));
        }
    }
    // Consecutive parts of one split episode cover the same episode; labels stay accurate.
    let reduce_budget =
        policy::input_budget_f(cfg, f, prompt::reduce_fixed_tokens_x(&focus_only(cfg)))
            .map_err(Error::InvalidInput)?;
    let mut level = 0;
    while partials.len() > 1 {
        level += 1;
        let sizes: Vec<u32> = partials.iter().map(|p| estimate_tokens(&p.text)).collect();
        let groups = plan::plan_groups(&sizes, reduce_budget).ok_or_else(|| {
            Error::InvalidInput(format!(
                "a {}-token context cannot merge two partial summaries of up to {} tokens; raise the context length or lower max-output-tokens",
                cfg.context_length, cfg.max_output_tokens
            ))
        })?;
        let reqs = groups
            .iter()
            .map(|g| {
                request(
                    cfg,
                    prompt::build_reduce_x(&partials[g.clone()], &focus_only(cfg)),
                )
            })
            .collect();
        // A failed merge cannot be skipped without losing several chunks: the call fails.
        let texts = cached_batch(
            h,
            cfg,
            reqs,
            (level, &format!("session {session}: reduce level {level}")),
            &mut spent,
        )?
        .into_iter()
        .collect::<Result<Vec<String>, Error>>()?;
        partials = groups
            .iter()
            .zip(texts)
            .map(|(g, text)| Partial {
                first: partials[g.start].first,
                last: partials[g.end - 1].last,
                text,
            })
            .collect();
    }
    let g = Generated {
        text: partials.remove(0).text,
        prompt_tokens: spent.0,
        output_tokens: spent.1,
        skipped: merge_ranges(skipped),
    };
    // A summarized session gets a new row for the new part; the old rows stay as they are.
    let strategy = if latest.is_some() {
        Strategy::NewRow
    } else {
        Strategy::Fresh
    };
    let last = covered + eps.len() as u64;
    let ledger = row_ledger(cfg, None, eps.iter().map(|e| (e.id, e.content.as_str())));
    write(h, session, cfg, &strategy, covered, last, g, ledger).map(Some)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
