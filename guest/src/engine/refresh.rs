//! Refresh and backoff: the freshness verdict, the failure marker, catching a session up pass by pass, and writing rows.

#[allow(unused_imports)]
use super::*;

/// The session's freshness under `cfg` (no model call).
pub fn freshness(h: &mut impl Host, session: &str, cfg: &Config) -> Result<Freshness, Error> {
    freshness_and_marker(h, session, cfg).map(|v| v.freshness)
}

/// A verdict with what it was computed from that a refresh goes on to use.
pub(super) struct Verdict {
    pub(super) freshness: Freshness,
    /// The failure marker (which a refresh then advances or clears, without reading it again).
    pub(super) marker: Option<FailureMarker>,
    /// Window mode's fold size (`None` in the other modes).
    pub(super) batch: Option<u32>,
    /// The session's figures and newest row as the verdict read them.
    pub(super) read: Read,
}

/// A session's figures and its newest summary row, read together (a call that has them need
/// not read them again).
pub(super) type Read = (crate::types::Stats, Option<SummaryRow>);

impl Verdict {
    /// How far a refresh of this verdict goes, the newest episode being `last`: window mode
    /// folds what has left the recent window (and at least through `aim`) in whole prompts,
    /// never a further call for less than a batch (that would cost the whole fixed part for a
    /// few messages; they wait for the next batch), covering at least `must`; the other modes
    /// fold everything.
    pub(super) fn reach(&self, cfg: &Config, last: u64, must: u64, aim: u64) -> Reach {
        let upto = refresh_upto(cfg, last).max(must).max(aim);
        match self.batch {
            Some(batch) => Reach {
                upto,
                must,
                leave: u64::from(batch),
            },
            None => Reach::to(upto),
        }
    }
}

/// The freshness verdict, with the failure marker and the window batch it was computed from.
pub(super) fn freshness_and_marker(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
) -> Result<Verdict, Error> {
    let stats = h.stats(session)?;
    let latest = h.latest_summary(session)?;
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    let newest = episode_at(h, session, stats.last_episode)?;
    let last_activity_ms = newest.as_ref().and_then(|e| e.timestamp_ms);
    let covered_ep = episode_at(h, session, covered)?;
    let covered_until_ms = covered_ep.as_ref().and_then(|e| e.timestamp_ms);
    let through = |e: &Option<Episode>| e.as_ref().map_or(0, |e| e.tokens_through);
    let window = cfg.mode == policy::Mode::Window;
    let edge = stats
        .last_episode
        .saturating_sub(u64::from(cfg.window_messages));
    // The store keeps each episode's running token total, so what lies after the summary is
    // a subtraction, whatever the backlog's length (never a read of the backlog).
    let backlog_tokens = stats.total_tokens.saturating_sub(through(&covered_ep));
    // Window mode: what has left the recent window and is not yet summarized, each episode
    // with its message overhead (ids are dense, so the count is a difference too).
    let left = if window && edge > covered {
        let at_edge = episode_at(h, session, edge)?;
        through(&at_edge).saturating_sub(through(&covered_ep)) + 3 * (edge - covered)
    } else {
        0
    };
    let batch = if window {
        Some(window_batch(h, cfg, latest.as_ref())?)
    } else {
        None
    };
    let window = batch.map(|b| (left, u64::from(b)));
    let marker = h.failure(session)?;
    let now_ms = h.now_ms();
    let fallback_rows = if cfg.engine == Engine::Llm {
        fallback_rows(&h.summaries(session)?, cfg)
    } else {
        0
    };
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
            fallback_rows,
        },
        cfg,
    );
    Ok(Verdict {
        freshness: f,
        marker,
        batch,
        read: (stats, latest),
    })
}

/// Window mode's fold size for a session whose newest row is `latest`: ten times the fold
/// prompt's fixed part (instructions, the summary, its ledger, the focus), within one prompt.
pub(super) fn window_batch(
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
    let extras = super::focus_only(cfg);
    let fixed = prompt::fixed_tokens_x(previous, &extras);
    let budget = policy::input_budget_f(cfg, f, fixed).unwrap_or(fixed);
    Ok(policy::window_batch(fixed, budget))
}

/// How far a catch-up goes: through episode `upto`, though it may stop at the end of a pass
/// once it has covered `must` and what is left before `upto` costs less than `leave` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reach {
    /// The newest episode to cover.
    pub upto: u64,
    /// The newest episode that must be covered.
    pub must: u64,
    /// Tokens left over that wait for a later call.
    pub leave: u64,
}

impl Reach {
    /// Through `upto`, whatever is left.
    pub fn to(upto: u64) -> Reach {
        Reach {
            upto,
            must: upto,
            leave: 0,
        }
    }
}

/// The newest episode a refresh folds: in window mode, the last one outside the recent
/// window; otherwise all of them.
pub(super) fn refresh_upto(cfg: &Config, last_episode: u64) -> u64 {
    if cfg.mode == policy::Mode::Window {
        crate::freshness::fold_upto(cfg, last_episode)
    } else {
        u64::MAX
    }
}

/// Episode `id` of the session (`None` for 0 or a missing one): one store read.
pub(super) fn episode_at(
    h: &mut impl Host,
    session: &str,
    id: u64,
) -> Result<Option<Episode>, Error> {
    if id == 0 {
        return Ok(None);
    }
    Ok(h.episodes_after(session, id - 1, 1)?
        .into_iter()
        .next()
        .filter(|e| e.id == id))
}

/// Refresh the session if it is due under `cfg.mode`; a failure records a marker with a
/// backoff and keeps the previous summary.
pub fn refresh(h: &mut impl Host, session: &str, cfg: &Config) -> Result<Outcome, Error> {
    validate(session, cfg)?;
    let v = freshness_and_marker(h, session, cfg)?;
    let f = &v.freshness;
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
    let reach = v.reach(cfg, f.episodes, 0, 0);
    guarded(h, session, cfg, v.marker, reach)
}

/// How often one call re-plans after the model refused a prompt as longer than its context
/// (each refusal recalibrates the estimator first).
pub(super) const MAX_OVERFLOW_REPLANS: u32 = 3;

/// The seed of the one re-ask of an answer that failed the quality gate.
pub(super) const RETRY_SEED: u32 = 7919;

/// How often one call starts a pass again after a concurrent writer changed the chain first.
pub(super) const MAX_CONFLICT_RETRIES: u32 = 5;

/// A call's view of the host in which ordinary calibration measurements wait for the call to
/// succeed. A failed map-reduce keeps the answers it received in the partial cache, keyed by
/// the exact request; had its measurements moved the calibration, the rerun would cut other
/// chunk boundaries, miss every cached answer and ask the model for all of it again. Refusals
/// (over-long prompts) count at once: the call re-plans on them, and the rerun must plan as the
/// last re-plan did.
pub(super) struct Deferred<'a, H: Host> {
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
    fn episodes(&mut self, s: &str, ids: &[u64]) -> Result<Vec<Episode>, Error> {
        self.inner.episodes(s, ids)
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
    fn planned(&mut self, report: &PlanReport) {
        self.inner.planned(report)
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
    fn search_episodes(
        &mut self,
        session: Option<&str>,
        terms: &[String],
        limit: u32,
    ) -> Result<crate::search::Matches, Error> {
        self.inner.search_episodes(session, terms, limit)
    }
    fn now_ms(&mut self) -> u64 {
        self.inner.now_ms()
    }
    fn log(&mut self, level: Level, msg: &str) {
        self.inner.log(level, msg)
    }
}

pub(super) fn catch_up(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    reach: Reach,
) -> Result<Outcome, Error> {
    let mut d = Deferred {
        inner: h,
        pending: Vec::new(),
    };
    // What the offline summarizer wrote is rewritten by the model first, so that new
    // episodes fold into the model's prose.
    let upgraded = upgrade_fallback_rows(&mut d, session, cfg)?;
    let mut out = catch_up_now(&mut d, session, cfg, reach)?;
    if !upgraded.is_empty() {
        out.triggered = true;
        out.passes += upgraded.len() as u32;
        let mut all = upgraded;
        all.append(&mut out.written);
        out.written = all;
    }
    // The second level: keep the active chain within its budget.
    compact_into(&mut d, session, cfg, &mut out);
    // Only a call that succeeded teaches the estimator (see `Deferred`).
    for (model, e, r) in std::mem::take(&mut d.pending) {
        d.inner.record_calibration(&model, e, r)?;
    }
    Ok(out)
}

/// Compact the session's chain to its budget (see [`compact_chain`]), adding the rows written
/// to `out`; a failure is logged and leaves the rows as they are.
fn compact_into(h: &mut impl Host, session: &str, cfg: &Config, out: &mut Outcome) {
    match compact_chain(h, session, cfg, cfg.summary_budget_tokens) {
        Ok(rows) => {
            out.written.extend(rows);
            newest_kept(&mut out.written);
        }
        Err(e) => h.log(
            Level::Warn,
            &format!(
                "session {session}: compacting the oldest summary rows failed; they stay as they are: {}",
                error_text(&e)
            ),
        ),
    }
}

pub(super) fn catch_up_now(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    reach: Reach,
) -> Result<Outcome, Error> {
    let start = h.stats(session)?;
    let end = start.last_episode.min(reach.upto);
    // What is left before `end` after a pass: a subtraction of running token totals.
    let end_through = if reach.leave > 0 {
        episode_at(h, session, end)?.map_or(0, |e| e.tokens_through)
    } else {
        0
    };
    let mut out = Outcome::default();
    let mut overflows = 0;
    let mut conflicts = 0;
    // New rows since the chain was last compacted.
    let mut grown = 0u32;
    // A window fold that must cover something, may stop once it has, and can cover it in one
    // prompt, goes pass by pass: planning the whole reach as a map-reduce would spend a call
    // (and a merge) on the few messages past one prompt that the next fold takes anyway.
    let mut long_path_done = false;
    if reach.leave > 0 && reach.must < end {
        let plan = plan_upto(h, session, cfg, reach.must)?;
        if plan.map.is_none() && plan.report.chunks == 1 {
            h.planned(&plan.report);
            long_path_done = true;
        }
    }
    // The call plans once, and tells the host what it will do; it plans again only after a
    // refusal recalibrated the estimator or another writer moved the chain.
    loop {
        let step = if long_path_done {
            pass(h, session, cfg, end)
        } else {
            let plan = plan_upto(h, session, cfg, end)?;
            h.planned(&plan.report);
            map_reduce_planned(h, session, cfg, plan)
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
        // A row updated by successive passes is reported once, as it stands (a long backlog
        // folds thousands of times into one row).
        match out.written.last_mut() {
            Some(last) if last.id == row.id => *last = row,
            _ => {
                out.written.push(row);
                newest_kept(&mut out.written);
                grown += 1;
            }
        }
        // A long backlog is compacted as it goes, so the chain (and what a compaction reads
        // and folds at once) stays short instead of growing with the backlog.
        if grown >= COMPACT_EVERY_ROWS && reached < end {
            compact_into(h, session, cfg, &mut out);
            grown = 0;
        }
        // Episodes that arrive while this call runs (a chat app keeps posting) are the next
        // call's work: a call covers what the session held when it started, and ends.
        if reached >= end {
            break;
        }
        if reach.leave > 0 && reached >= reach.must {
            let at = episode_at(h, session, reached)?.map_or(0, |e| e.tokens_through);
            let rest =
                end_through.saturating_sub(at) + u64::from(plan::MESSAGE_COST) * (end - reached);
            if rest < reach.leave {
                break;
            }
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
/// and the coding-session digest entries of `episodes`, whole (budgets apply when it is read).
/// Identifiers are left out when the ledger is off; the digest never is. `coding` says the
/// session's earlier rows hold a digest (so this range's requests are collected even without
/// an action of its own).
pub(super) fn row_ledger<'a>(
    cfg: &Config,
    base: Option<&Ledger>,
    coding: bool,
    episodes: impl IntoIterator<Item = &'a Episode>,
) -> Ledger {
    let eps: Vec<&Episode> = episodes.into_iter().collect();
    let ids = (cfg.ledger_tokens > 0).then(|| {
        let mut l = ledger::of_messages(eps.iter().map(|e| (e.id, e.role, e.content.as_str())));
        for e in &eps {
            add_facts(&mut l, e);
        }
        l
    });
    let coding = coding || base.is_some_and(|b| crate::digest::is_coding(&b.entries));
    let digest = crate::digest::entries(
        eps.iter().map(|e| (e.id, e.role, e.content.as_str())),
        coding,
    );
    ledger_of(base, ids, digest)
}

/// The facts' events `e` states, added to `l` (see [`crate::facts`]).
pub(super) fn add_facts(l: &mut Ledger, e: &Episode) {
    let who = crate::facts::who_of(e.speaker.as_deref(), e.role);
    let at = crate::dates::known(e.timestamp_ms);
    for ev in crate::facts::events(&who, &e.content, e.id, at) {
        ledger::add(
            &mut l.entries,
            ledger::Kind::Fact,
            crate::facts::encode(&ev),
            e.id,
            1,
        );
    }
}

/// [`row_ledger`] of episodes `after+1..=upto` of the session, read from the store a page at
/// a time (twice: identifiers, then the digest), so a long range's text is never held at once.
pub(super) fn row_ledger_paged(
    h: &mut impl Host,
    cfg: &Config,
    base: Option<&Ledger>,
    coding: bool,
    (session, after, upto): (&str, u64, u64),
) -> Result<Ledger, Error> {
    // The first walk: identifiers, and whether the range holds an action (a chat's requests
    // are then never gathered).
    let mut acts = false;
    let mut facts = Ledger::default();
    let mut it = Paged::new(h, session, after, upto);
    let mut l = ledger::of_messages((&mut it).map(|e| {
        acts = acts || crate::digest::is_action(e.role, &e.content);
        if cfg.ledger_tokens > 0 {
            add_facts(&mut facts, &e);
        }
        // Relative dates are resolved against the message's time, so the ledger holds the
        // day ("yesterday (= 7 May 2023)" gives 7 May 2023).
        let text = if cfg.ledger_tokens > 0 {
            crate::dates::resolve(&e.content, crate::dates::known(e.timestamp_ms))
        } else {
            String::new()
        };
        (e.id, e.role, text)
    }));
    it.check()?;
    l.entries.extend(facts.entries);
    let ids = (cfg.ledger_tokens > 0).then_some(l);
    let coding = coding || base.is_some_and(|b| crate::digest::is_coding(&b.entries));
    let mut it = Paged::new(h, session, after, upto);
    let digest = crate::digest::entries_with(
        (&mut it).map(|e| (e.id, e.role, e.content)),
        coding,
        coding || acts,
    );
    it.check()?;
    Ok(ledger_of(base, ids, digest))
}

fn ledger_of(base: Option<&Ledger>, ids: Option<Ledger>, digest: Vec<ledger::Entry>) -> Ledger {
    let mut new = ids.unwrap_or_default();
    for e in digest {
        ledger::add(&mut new.entries, e.kind, e.text, e.episode, e.count);
    }
    let merged = match base {
        Some(b) => ledger::merge(b, &new),
        None => new,
    };
    ledger::stored(merged)
}

/// Whether the session's chain so far (its newest row) holds a coding-session digest.
pub(super) fn coding_before(latest: Option<&SummaryRow>) -> bool {
    latest.is_some_and(|r| crate::digest::is_coding(&r.ledger.entries))
}

/// The offline summary of a coding session's row: its digest, as readable sections (see
/// [`crate::digest::render`]); `None` for a chat.
pub(super) fn offline_digest(cfg: &Config, ledger: &Ledger) -> Option<Generated> {
    if cfg.engine != Engine::Extractive || !crate::digest::is_coding(&ledger.entries) {
        return None;
    }
    let text = crate::digest::render(&ledger.entries, cfg.max_output_tokens.max(200));
    Some(Generated {
        text,
        prompt_tokens: 0,
        output_tokens: 0,
        skipped: Vec::new(),
    })
}

/// One summary pass over the oldest unsummarized episodes (up to episode `upto`) that fit the
/// budget. `None` when the session is caught up to `upto`.
pub(super) fn pass(
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
    let extras = super::focus_only(cfg);
    let budget =
        policy::input_budget_f(cfg, f, prompt::fixed_tokens_x(previous.as_deref(), &extras))
            .map_err(Error::InvalidInput)?;

    let mut selected: Vec<Episode> = Vec::new();
    let mut used = 0u32;
    let mut after = covered;
    // Whether the fold reaches the session's newest episode.
    let mut to_the_end = false;
    'fill: loop {
        let page = h.episodes_after(session, after, PAGE)?;
        if page.is_empty() {
            to_the_end = true;
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
            "session {session}: {} {first}-{last} (~{used} tokens) as {}",
            crate::freshness::count(selected.len() as u64, "episode", "episodes"),
            describe(&strategy)
        ),
    );
    let base = match &strategy {
        Strategy::Update(r) => Some(&r.ledger),
        _ => None,
    };
    let ledger = row_ledger(cfg, base, coding_before(latest.as_ref()), &selected);
    let conversation: Vec<Message> = selected
        .into_iter()
        .map(|e| {
            Message::new(e.role, e.content)
                .by(e.speaker)
                .at(e.timestamp_ms)
        })
        .collect();
    let generated = match offline_digest(cfg, &ledger) {
        Some(g) => g,
        // A fold of the whole conversation is its summary; a stretch of a longer one keeps the
        // lines a later question may ask about (a context picks among them).
        None => {
            let aim = if covered == 0 && to_the_end {
                crate::extractive::Aim::Summary
            } else {
                crate::extractive::Aim::Recall
            };
            generate(h, cfg, &conversation, previous.as_deref(), &extras, aim)?
        }
    };
    write(h, session, cfg, &strategy, covered, last, generated, ledger).map(Some)
}

/// One episode larger than a whole prompt: fold its pieces into the summary one after the
/// other, so nothing is dropped, and record it as covered once all pieces are in.
pub(super) fn oversized(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    strategy: &Strategy,
    previous: Option<String>,
    ep: Episode,
) -> Result<SummaryRow, Error> {
    let f = calibration_factor(h, cfg)?;
    let extras = super::focus_only(cfg);
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
            &[Message::new(ep.role, content)
                .by(ep.speaker.clone())
                .at(ep.timestamp_ms)],
            current.as_deref(),
            &extras,
            crate::extractive::Aim::Recall,
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
    let coding = base.is_some_and(|b| crate::digest::is_coding(&b.entries));
    let ledger = row_ledger(cfg, base, coding, [&ep]);
    write(h, session, cfg, strategy, covered, ep.id, spent, ledger)
}

pub(super) fn describe(s: &Strategy) -> String {
    match s {
        Strategy::Fresh => "a fresh summary".into(),
        Strategy::Update(r) => format!("an update of summary {}", r.id),
        Strategy::NewRow => "a new summary row".into(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn write(
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
