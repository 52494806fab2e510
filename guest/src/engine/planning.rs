//! Planning: what a summarize would do (nothing, one call, rolling or map-reduce) and what it would cost.

#[allow(unused_imports)]
use super::*;

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

/// Episodes `after+1..=upto` of a session, read from the host a page at a time: a caller that
/// walks a long session holds one page of text, not the session. A store error ends the walk;
/// [`check`](Self::check) reports it.
pub(super) struct Paged<'h, H: Host> {
    h: &'h mut H,
    session: &'h str,
    after: u64,
    upto: u64,
    page: std::collections::VecDeque<Episode>,
    done: bool,
    err: Option<Error>,
}

impl<'h, H: Host> Paged<'h, H> {
    pub(super) fn new(h: &'h mut H, session: &'h str, after: u64, upto: u64) -> Self {
        Paged {
            h,
            session,
            after,
            upto,
            page: Default::default(),
            done: false,
            err: None,
        }
    }

    /// The store error that ended the walk early, if any.
    pub(super) fn check(self) -> Result<(), Error> {
        self.err.map_or(Ok(()), Err)
    }
}

impl<H: Host> Iterator for Paged<'_, H> {
    type Item = Episode;

    fn next(&mut self) -> Option<Episode> {
        if self.page.is_empty() && !self.done {
            match self.h.episodes_after(self.session, self.after, PAGE) {
                Ok(page) if page.is_empty() => self.done = true,
                Ok(page) => self.page.extend(page),
                Err(e) => {
                    self.err = Some(e);
                    self.done = true;
                }
            }
        }
        let e = self.page.pop_front()?;
        if e.id > self.upto {
            self.page.clear();
            self.done = true;
            return None;
        }
        self.after = e.id;
        Some(e)
    }
}

/// The token counts of consecutive episodes from `first`: what planning needs, 4 bytes an
/// episode, read without keeping any text.
#[derive(Clone, Debug, Default)]
pub(super) struct Sizes {
    first: u64,
    tokens: Vec<u32>,
}

impl Sizes {
    /// Of episodes given as `(id, tokens)`, consecutive.
    pub(super) fn of(eps: impl IntoIterator<Item = (u64, u32)>) -> Sizes {
        let mut s = Sizes::default();
        for (id, t) in eps {
            if s.tokens.is_empty() {
                s.first = id;
            }
            debug_assert_eq!(id, s.first + s.tokens.len() as u64, "consecutive ids");
            s.tokens.push(t);
        }
        s
    }

    pub(super) fn len(&self) -> usize {
        self.tokens.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The first and last ids (`None` when empty).
    pub(super) fn range(&self) -> Option<(u64, u64)> {
        (!self.is_empty()).then(|| (self.first, self.first + self.len() as u64 - 1))
    }

    /// `(id, tokens)` in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        (self.first..).zip(self.tokens.iter().copied())
    }

    /// Their tokens, message costs included.
    pub(super) fn backlog(&self) -> u64 {
        self.tokens
            .iter()
            .map(|&t| u64::from(t) + u64::from(plan::MESSAGE_COST))
            .sum()
    }
}

/// The sizes of episodes `after+1..=upto`, read a page at a time without keeping any text.
pub(super) fn sizes_after(
    h: &mut impl Host,
    session: &str,
    after: u64,
    upto: u64,
) -> Result<Sizes, Error> {
    let mut it = Paged::new(h, session, after, upto);
    let sizes = Sizes::of((&mut it).map(|e| (e.id, e.tokens)));
    it.check()?;
    Ok(sizes)
}

/// One episode's text (planning splits an episode larger than a chunk exactly as execution
/// will).
pub(super) fn content_of(h: &mut impl Host, session: &str, id: u64) -> Result<String, Error> {
    match h.episodes_after(session, id.saturating_sub(1), 1)?.pop() {
        Some(e) if e.id == id => Ok(e.content),
        _ => Err(Error::Storage(format!(
            "episode {id} of session {session} is missing"
        ))),
    }
}

/// Plan map chunks over `sizes`, reading the text of an episode only when it is larger than
/// a chunk.
pub(super) fn chunks_of(
    h: &mut impl Host,
    session: &str,
    sizes: &Sizes,
    cap: u32,
) -> Result<Vec<plan::Chunk>, Error> {
    let mut failed = None;
    let chunks = plan::plan_chunks(sizes.iter(), cap, |id| {
        content_of(h, session, id).unwrap_or_else(|e| {
            failed.get_or_insert(e);
            String::new()
        })
    });
    failed.map_or(Ok(chunks), Err)
}

/// Every episode after `after`, read page by page.
pub(super) fn episodes_after_all(
    h: &mut impl Host,
    session: &str,
    after: u64,
) -> Result<Vec<Episode>, Error> {
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
pub(super) fn chunk_cap(cfg: &Config, budget: u32) -> u32 {
    if cfg.chunk_tokens > 0 {
        budget.min(cfg.chunk_tokens)
    } else {
        budget
    }
}

/// Tokens a partial summary is expected to take when planning reduce levels: a 3–5 sentence
/// summary is at most about 160 tokens, and never more than the output limit.
pub const EXPECTED_PARTIAL_TOKENS: u32 = 160;

pub(super) fn expected_partial(cfg: &Config) -> u32 {
    cfg.max_output_tokens.min(EXPECTED_PARTIAL_TOKENS)
}

/// Plan `summarize_now` without calling the model or writing anything.
pub fn plan_report(h: &mut impl Host, session: &str, cfg: &Config) -> Result<PlanReport, Error> {
    validate(session, cfg)?;
    plan_upto(h, session, cfg, u64::MAX).map(|p| p.report)
}

/// A plan for bringing a session up to an episode: the report the host sees and what
/// execution needs of it, so a call plans once (and again only when a refusal recalibrates
/// the estimator or another writer moved the chain).
pub(super) struct Plan {
    /// What the host is told.
    pub report: PlanReport,
    /// The calibration factor it was made with.
    pub f: f64,
    /// The newest row when it was made.
    pub latest: Option<SummaryRow>,
    /// Map-reduce: the map budget, the sizes of the episodes it covers and its chunks.
    pub map: Option<(u32, Sizes, Vec<plan::Chunk>)>,
}

/// Plan bringing the session up to episode `upto` (the newest, when beyond it). The backlog
/// comes from the running token totals (two reads); only a map-reduce reads the episodes'
/// sizes, to cut its chunks.
pub(super) fn plan_upto(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    upto: u64,
) -> Result<Plan, Error> {
    let f = calibration_factor(h, cfg)?;
    let latest = h.latest_summary(session)?;
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    let last = h.stats(session)?.last_episode.min(upto);
    let n = last.saturating_sub(covered);
    let backlog = if n == 0 {
        0
    } else {
        let mut through =
            |id| episode_at(h, session, id).map(|e| e.map_or(0, |e| e.tokens_through));
        through(last)?.saturating_sub(through(covered)?) + u64::from(plan::MESSAGE_COST) * n
    };
    let out = u64::from(cfg.max_output_tokens);
    let llm = cfg.engine == Engine::Llm;
    let mut report = PlanReport {
        path: PlanPath::Nothing,
        episodes: n,
        backlog_tokens: backlog,
        chunks: 0,
        levels: Vec::new(),
        calls: 0,
        input_tokens: 0,
        output_tokens: 0,
    };
    let mut plan = Plan {
        report: report.clone(),
        f,
        latest,
        map: None,
    };
    if n == 0 {
        return Ok(plan);
    }
    let latest = plan.latest.as_ref();
    let fixed = prompt::fixed_tokens_x(latest.map(|r| r.content.as_str()), &focus_only(cfg));
    let budget = policy::input_budget_f(cfg, f, fixed).map_err(Error::InvalidInput)?;
    if let Some(map_budget) = long_path(cfg, f, latest, backlog)? {
        // Sizes only: a long session's text is never held at once.
        let eps = sizes_after(h, session, covered, last)?;
        debug_assert_eq!(eps.backlog(), backlog, "running totals and sizes agree");
        let chunks = chunks_of(h, session, &eps, chunk_cap(cfg, map_budget))?;
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
        plan.report = report;
        plan.map = Some((map_budget, eps, chunks));
        return Ok(plan);
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
    plan.report = report;
    Ok(plan)
}
