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
