//! The context handed back: the chain, the backlog that fits, and a refresh when one is due.

#[allow(unused_imports)]
use super::*;

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
    /// What the next call is about: the earlier turns matching it are included.
    pub query: Option<String>,
}

impl Default for ContextRequest {
    /// The documented defaults: 2,000 tokens, the last 4 pairs verbatim, refresh first when
    /// more than 8 messages lie beyond the summary, no pins.
    fn default() -> Self {
        ContextRequest {
            budget: 2000,
            pairs: 4,
            refresh_after: 8,
            pins: Vec::new(),
            query: None,
        }
    }
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

/// What a context of `budget` tokens cannot carry beside the summary covering `covered`:
/// `None` while what lies beyond it (through `last`, message costs included) fits the tail's
/// high-water mark ([`crate::context::tail_high`] of the budget; the stable head has the
/// rest). Otherwise the newest episode a fold must cover: every one in eager and idle modes;
/// in window mode the first whose successors fit the low-water mark
/// ([`crate::context::TAIL_LOW`]), so the turns that follow append to an unchanged prefix
/// for a while (folding a batch, not one message per context), found by a binary search over
/// the running token totals (O(log n) reads). A newest message that alone exceeds the
/// low-water mark is folded too: the summary then carries it.
pub fn overflow_cut(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    (covered, coding): (u64, bool),
    last: u64,
    budget: u32,
) -> Result<Option<crate::freshness::Overflow>, Error> {
    if budget == 0 || last <= covered {
        return Ok(None);
    }
    // Context tokens of the episodes after `from` through `last`: a subtraction of running
    // token totals (one read each), whatever lies between.
    let through = |h: &mut _, id| -> Result<u64, Error> {
        Ok(episode_at(h, session, id)?.map_or(0, |e| e.tokens_through))
    };
    let newest = episode_at(h, session, last)?;
    let upto = newest.as_ref().map_or(0, |e| e.tokens_through);
    let cost = |before: u64, from: u64| {
        upto.saturating_sub(before) + u64::from(plan::MESSAGE_COST) * (last - from)
    };
    let tokens = cost(through(h, covered)?, covered);
    let oldest = episode_at(h, session, covered + 1)?;
    let marks = day_marks_within(oldest.as_ref(), newest.as_ref(), last - covered);
    let high = crate::context::tail_high(cfg.engine, coding);
    if tokens + marks <= u64::from(crate::context::share_of(budget, high)) {
        return Ok(None);
    }
    if cfg.mode != policy::Mode::Window {
        return Ok(Some(crate::freshness::Overflow {
            tokens,
            budget,
            high,
            upto: last,
            least: last,
        }));
    }
    // The smallest cut in (covered, last] whose successors fit `mark`; the cost of what
    // follows a cut only falls as the cut moves on.
    let smallest_cut = |h: &mut _, mark: u64| -> Result<u64, Error> {
        let (mut lo, mut hi) = (covered + 1, last);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if cost(through(h, mid)?, mid) <= mark {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    };
    let low = crate::context::share_of(budget, crate::context::TAIL_LOW);
    let upto = smallest_cut(h, u64::from(low))?;
    let least = smallest_cut(
        h,
        u64::from(crate::context::share_of(budget, high)).saturating_sub(marks),
    )?;
    Ok(Some(crate::freshness::Overflow {
        tokens,
        budget,
        high,
        upto,
        least: least.min(upto),
    }))
}

/// At most the tokens of the day marks a context adds to `n` turns running from `oldest` to
/// `newest` (one on each turn that opens a day, see [`crate::context::assemble`]): one per day
/// the turns span, and one more for the first; one per turn when their times do not run
/// forward; none when neither end has a time.
fn day_marks_within(oldest: Option<&Episode>, newest: Option<&Episode>, n: u64) -> u64 {
    let day = |e: Option<&Episode>| {
        crate::dates::known(e.and_then(|e| e.timestamp_ms))
            .map(|t| t.div_euclid(crate::dates::MS_PER_DAY))
    };
    let marks = match (day(oldest), day(newest)) {
        (None, None) => 0,
        (Some(a), Some(b)) if a <= b => u64::try_from(b - a).unwrap_or(u64::MAX).saturating_add(1),
        _ => n,
    };
    marks.min(n) * u64::from(crate::context::DAY_MARK_TOKENS)
}

/// The rows it folded, in order, when `r` is a compacted row whose sources `history` holds
/// whole (they cover exactly its range).
fn sources_of(r: &SummaryRow, history: &[SummaryRow]) -> Option<Vec<SummaryRow>> {
    let mut sources: Vec<SummaryRow> = history
        .iter()
        .filter(|x| x.compacted_into == Some(r.id))
        .cloned()
        .collect();
    sources.sort_by_key(|x| x.first_episode);
    let whole = r.level > 0
        && !sources.is_empty()
        && sources.first().map(|x| x.first_episode) == Some(r.first_episode)
        && sources.last().map(|x| x.last_episode) == Some(r.last_episode);
    whole.then_some(sources)
}

/// `rows` at the finest level that fits `share` tokens: compacted rows are replaced by the rows
/// they folded, the newest first, one level at a time, while the chain still fits. (A chain
/// that does not fit even as it is stays as it is.)
pub fn finer_rows_within(
    rows: &[SummaryRow],
    history: &[SummaryRow],
    share: u32,
) -> Vec<SummaryRow> {
    let mut out = rows.to_vec();
    'finer: loop {
        for i in (0..out.len()).rev() {
            let Some(sources) = sources_of(&out[i], history) else {
                continue;
            };
            let mut next = out[..i].to_vec();
            next.extend(sources);
            next.extend_from_slice(&out[i + 1..]);
            if chain_tokens(&next) <= share {
                out = next;
                continue 'finer;
            }
        }
        return out;
    }
}

/// `rows` (the active chain) with each compacted row replaced by the rows it folded, down
/// to level 0, from `history` (every row the session has, compacted ones included). A row
/// whose sources are not all there stays as it is.
pub fn finest_rows(rows: &[SummaryRow], history: &[SummaryRow]) -> Vec<SummaryRow> {
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        match sources_of(r, history) {
            Some(sources) => out.extend(finest_rows(&sources, history)),
            None => out.push(r.clone()),
        }
    }
    out
}

/// The session's freshness as a context of `budget` tokens keeping at most `refresh_after`
/// messages beyond the summary sees it (see the WIT `context-freshness`).
pub fn context_freshness(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    refresh_after: u32,
    budget: u32,
) -> Result<Freshness, Error> {
    context_verdict(h, session, cfg, refresh_after, budget).map(|(f, _)| f)
}

/// [`context_freshness`], and the session's figures and newest row it read.
fn context_verdict(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    refresh_after: u32,
    budget: u32,
) -> Result<(Freshness, super::refresh::Read), Error> {
    let v = freshness_and_marker(h, session, cfg)?;
    let f = v.freshness;
    let at = (f.covered, super::refresh::coding_before(v.read.1.as_ref()));
    let overflow = overflow_cut(h, session, cfg, at, f.episodes, budget)?;
    let unshown = unshown_upto(h, session, cfg, at, f.episodes)?;
    let f = crate::freshness::for_context(f, cfg, refresh_after, overflow, unshown);
    Ok((f, v.read))
}

/// Window mode: the newest episode after `covered` (through `last`) that a context cannot
/// show: tool output or a stored system message (a context's messages are the dialogue). Walks what lies beyond the
/// summary a page at a time, which window mode keeps to the recent window and one batch.
pub fn unshown_upto(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    (covered, coding): (u64, bool),
    last: u64,
) -> Result<Option<u64>, Error> {
    if cfg.mode != policy::Mode::Window || last <= covered {
        return Ok(None);
    }
    // A coding session's context carries what its tool calls did in its digest, whether a
    // fold covers them or not: they need no fold of their own.
    if coding {
        return Ok(None);
    }
    let mut walk = Paged::new(h, session, covered, last);
    let newest = (&mut walk)
        .filter(|e| {
            !matches!(
                e.role,
                crate::types::Role::User | crate::types::Role::Assistant
            )
        })
        .map(|e| e.id)
        .last();
    walk.check()?;
    Ok(newest)
}

/// A context and, with `verdict_after`, the refresh verdict of a context that keeps at most
/// that many messages beyond the summary ([`context_freshness`], read first, as a host that
/// queues the refresh it names would have read it) and whether the window is behind it (more
/// messages beyond its summary than that, due or not): one call for a host that runs
/// refreshes as jobs.
pub fn context_judged(
    h: &mut impl Host,
    session: &str,
    req: ContextRequest,
    cfg: &Config,
    verdict_after: Option<u32>,
) -> Result<(ContextWindow, Option<(Freshness, bool)>), Error> {
    let (verdict, read) = match verdict_after {
        Some(after) => {
            let (f, read) = context_verdict(h, session, cfg, after, req.budget)?;
            (Some((f, after)), Some(read))
        }
        None => (None, None),
    };
    // The context starts from what the verdict read (nothing is written in between).
    let c = context_read(h, session, req, cfg, read)?;
    let verdict = verdict.map(|(f, after)| {
        let behind = f.episodes.saturating_sub(c.window.covered) > u64::from(after);
        (f, behind)
    });
    Ok((c, verdict))
}

/// How far back, in budgets, a context reads what no fold has covered yet for its identifiers,
/// digest and on-read sentences: what lies further back than this many budgets of tokens
/// cannot win a place beside the newer turns, and reading it would make a read's cost grow
/// with an unfolded backlog.
pub const UNFOLDED_READ_BUDGETS: u64 = 16;

/// The episode before the oldest of the newest ones that `tokens` can hold (message costs
/// included), by the running token totals: a binary search of O(log n) reads. 0 when the
/// whole session fits.
fn reach_back(h: &mut impl Host, session: &str, last: u64, tokens: u64) -> Result<u64, Error> {
    let upto = episode_at(h, session, last)?.map_or(0, |e| e.tokens_through);
    let (mut lo, mut hi) = (0u64, last);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        let before = episode_at(h, session, mid)?.map_or(0, |e| e.tokens_through);
        let cost = upto.saturating_sub(before) + u64::from(plan::MESSAGE_COST) * (last - mid);
        if cost > tokens {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// The context for the next model call (see the WIT `context`).
pub fn context(
    h: &mut impl Host,
    session: &str,
    req: ContextRequest,
    cfg: &Config,
) -> Result<ContextWindow, Error> {
    context_read(h, session, req, cfg, None)
}

/// [`context`], from the session's figures and newest row when the caller has just read
/// them.
fn context_read(
    h: &mut impl Host,
    session: &str,
    req: ContextRequest,
    cfg: &Config,
    read: Option<super::refresh::Read>,
) -> Result<ContextWindow, Error> {
    if session.trim().is_empty() {
        return Err(Error::InvalidInput(
            "the session id is empty; pass a session id".into(),
        ));
    }
    let (stats, latest) = match read {
        Some(r) => r,
        None => (h.stats(session)?, h.latest_summary(session)?),
    };
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    let at = (covered, super::refresh::coding_before(latest.as_ref()));
    let beyond = stats.last_episode - covered;
    let (mut refreshed, mut refresh_due) = (false, false);
    let window_mode = cfg.mode == policy::Mode::Window;
    // `refresh-after` at its maximum: the caller runs refreshes itself (as jobs), so nothing
    // here calls the model (nor reads the backlog to decide whether to).
    let inline = req.refresh_after != u32::MAX;
    // Unsummarized episodes that would not fit beside the summary are due whatever their
    // count: a context must not silently lose the middle of the conversation.
    let cut = if inline {
        overflow_cut(h, session, cfg, at, stats.last_episode, req.budget)?
    } else {
        None
    };
    let overflow = cut.is_some();
    let unshown = if inline && window_mode {
        unshown_upto(h, session, cfg, at, stats.last_episode)?
    } else {
        None
    };
    let wants = inline
        && if window_mode {
            beyond > 0
        } else {
            beyond > u64::from(req.refresh_after) || overflow
        };
    if wants {
        let v = freshness_and_marker(h, session, cfg)?;
        let f = &v.freshness;
        let may = matches!(f.state, FreshState::Due | FreshState::Waiting);
        let run = match cfg.mode {
            policy::Mode::Eager => may,
            // The window is folded when a batch has left it, or when it no longer fits.
            policy::Mode::Window => {
                f.state == FreshState::Due || (may && (overflow || unshown.is_some()))
            }
            policy::Mode::Idle => false,
        };
        if run {
            validate(session, cfg)?;
            // Far enough that the rest fits the budget and what the context cannot show is
            // folded; window mode keeps its recent turns and folds in whole prompts.
            // A fold goes to the low-water mark, but one that has made the rest fit the
            // high-water mark in a whole prompt leaves what remains to the next fold (a
            // further call for a few messages would cost the whole fixed part again).
            let must = cut.map_or(0, |c| c.least).max(unshown.unwrap_or(0));
            let aim = cut.map_or(0, |c| c.upto);
            let reach = v.reach(cfg, stats.last_episode, must, aim);
            match guarded(h, session, cfg, v.marker, reach) {
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
    // When the whole history fits the budget, the history is the context, verbatim (read
    // whole: it fits the budget, so it is small), and nothing else need be read or built; so
    // a context never costs more than the history it stands for.
    let full_tokens = stats.total_tokens + u64::from(plan::MESSAGE_COST) * stats.episodes;
    if full_tokens <= u64::from(req.budget) {
        return Ok(ContextWindow {
            window: crate::context::whole_history(&episodes_after_all(h, session, 0)?, req.budget),
            full_tokens,
            refreshed,
            refresh_due,
        });
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
    // The turns shown verbatim: every one since the fold (window mode folds whole batches
    // and keeps its recent turns), and in the other modes the newest pairs the fold covered
    // too. Fixed until the next fold, so the turns only append.
    // The newest message is always among them, even when a fold covered it.
    let tail_from = if window_mode {
        covered
    } else {
        covered.saturating_sub(u64::from(req.pairs.max(1)) * 2)
    }
    .min(stats.last_episode.saturating_sub(1));
    // Read no further back than turns that fill the whole budget could reach: the first
    // episode whose successors pass the budget (running token totals, a binary search of
    // O(log n) reads).
    let from = reach_back(h, session, stats.last_episode, u64::from(req.budget))?;
    let tail = h.episodes_after(
        session,
        from,
        (stats.last_episode - from).min(u64::from(u32::MAX)) as u32,
    )?;
    let first_ms = h
        .episodes_after(session, 0, 1)?
        .first()
        .and_then(|e| crate::dates::known(e.timestamp_ms));
    let with_query = req.query.as_deref().is_some_and(|q| !q.trim().is_empty());
    // The second level on demand: a chain that cannot fit the stable head's share of this
    // budget beside the pins is compacted further (when the mode lets the model be called).
    let pins_cost: u32 = pinned
        .iter()
        .map(|e| crate::context::cost(&e.content))
        .sum();
    let share = crate::context::share_of(req.budget, crate::context::head_share(cfg.engine))
        .saturating_sub(pins_cost)
        .saturating_sub(cfg.ledger_tokens.min(req.budget / 4))
        .saturating_sub(crate::context::cost(crate::context::SUMMARY_HEADER));
    // The finest rows: an offline chain is read at level 0 whatever its compaction (its
    // context picks sentences within the budget); a model's chain where those rows fit.
    // (An offline chain's lines are parsed here, once.)
    let chain = if rows.iter().any(|r| r.level > 0) {
        let history = h.summary_history(session)?;
        let finest = finest_rows(&rows, &history);
        match crate::context::chain_lines(&finest) {
            Some(lines) => {
                rows = finest;
                Some(lines)
            }
            None => {
                rows = finer_rows_within(&rows, &history, share);
                None
            }
        }
    } else {
        crate::context::chain_lines(&rows)
    };
    let offline = chain.is_some();
    if inline
        && !offline
        && rows.len() >= 2
        && chain_tokens(&rows) > share
        && cfg.mode != policy::Mode::Idle
    {
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
    // The coding-session digest of the whole session: the rows' digests, and what the
    // episodes after the chain add (the latest request is usually among them).
    let mut digest = Ledger::default();
    for r in &rows {
        let own = Ledger {
            entries: r
                .ledger
                .entries
                .iter()
                .filter(|e| e.kind.is_digest())
                .cloned()
                .collect(),
            dropped: 0,
        };
        digest = ledger::merge(&digest, &own);
    }
    let fold_digest = digest.entries.clone();
    // What lies beyond the summary, walked a page at a time (its text is never held whole).
    let coding = crate::digest::is_coding(&digest.entries);
    // Only as far back as a context could ever draw on: a backlog no refresh has folded yet
    // (idle mode's quiet window) costs a read what its newest part costs, whatever its length.
    let chain_end = rows.last().map_or(0, |r| r.last_episode);
    let most = u64::from(req.budget) * UNFOLDED_READ_BUDGETS;
    let unfolded_tokens = stats
        .total_tokens
        .saturating_sub(episode_at(h, session, chain_end)?.map_or(0, |e| e.tokens_through))
        + u64::from(plan::MESSAGE_COST) * stats.last_episode.saturating_sub(chain_end);
    let walk_from = if unfolded_tokens > most {
        reach_back(h, session, stats.last_episode, most)?
    } else {
        0
    };
    let mut newer = Paged::new(h, session, chain_end.max(walk_from), u64::MAX);
    // Beside an offline chain (or none yet), the sentences of what no fold has covered are
    // taken on read by the offline summary's own rules, so a context that cannot show those
    // messages verbatim still carries what they say.
    let on_read = rows.is_empty() || offline;
    let mut pending: Vec<crate::extractive::Line> = Vec::new();
    // And the identifiers of every episode beyond the chain, by the ledger's own rules: those
    // of the episodes the window cannot show join its ledger.
    let mut unfolded = ledger::Ledger::default();
    let entries = crate::digest::entries(
        (&mut newer).map(|e| {
            if cfg.ledger_tokens > 0 {
                let text = crate::dates::resolve(&e.content, crate::dates::known(e.timestamp_ms));
                for (kind, t) in ledger::extract_for(e.role, &text) {
                    ledger::add(&mut unfolded.entries, kind, t, e.id, 1);
                }
                super::refresh::add_facts(&mut unfolded, &e);
            }
            if on_read {
                let m = Message::new(e.role, e.content.clone())
                    .by(e.speaker.clone())
                    .at(e.timestamp_ms);
                pending.extend(
                    crate::extractive::candidates(std::slice::from_ref(&m), true)
                        .into_iter()
                        .map(|l| l.of(e.id)),
                );
            }
            (e.id, e.role, e.content)
        }),
        coding,
    );
    newer.check()?;
    for e in entries {
        ledger::add(&mut digest.entries, e.kind, e.text, e.episode, e.count);
    }
    // The earlier turns the query finds, best first (the room policy decides how many show).
    let query = req
        .query
        .as_deref()
        .map(crate::search::query)
        .unwrap_or_default();
    let found = found_turns(h, session, &query)?;
    let window = crate::context::assemble(&crate::context::Parts {
        rows: &rows,
        tail: &tail,
        pinned: &pinned,
        last_episode: stats.last_episode,
        budget: req.budget,
        tail_from,
        ledger_budget: cfg.ledger_tokens,
        digest: &digest.entries,
        fold_digest: &fold_digest,
        first_ms,
        chain: chain.as_deref(),
        pending: &pending,
        unfolded: &unfolded.entries,
        found: &found,
        with_query,
        head_share: crate::context::head_share(cfg.engine),
        query: &query,
    });
    Ok(ContextWindow {
        window,
        full_tokens,
        refreshed,
        refresh_due,
    })
}
