//! Upgrading what the fallback wrote: rows the offline (extractive) summarizer wrote while no
//! model was reachable are rewritten by the model once one is configured, each keeping its
//! exact range (the store's rewrite rule), oldest first. A refresh does this before it folds
//! new episodes, so new episodes fold into the model's prose, not into sentence fragments.

#[allow(unused_imports)]
use super::*;

/// The `model` a row written by the offline summarizer records.
pub const FALLBACK_MODEL: &str = "extractive";

/// Whether `cfg` can rewrite `row`: the row was written by the offline summarizer and `cfg`
/// names a model.
pub fn upgradable(row: &SummaryRow, cfg: &Config) -> bool {
    cfg.engine == Engine::Llm && row.model == FALLBACK_MODEL
}

/// Active rows of `rows` that `cfg` would rewrite.
pub fn fallback_rows(rows: &[SummaryRow], cfg: &Config) -> u32 {
    rows.iter().filter(|r| upgradable(r, cfg)).count() as u32
}

/// Rewrite every active row of `session` that the offline summarizer wrote, with the model,
/// oldest first, each over exactly its range. A row that another writer changed meanwhile is
/// left to the next refresh. A row whose episodes cannot all be summarized (a chunk failing
/// after retries) is kept as it is: an upgrade never loses what the fallback reflected.
pub(super) fn upgrade_fallback_rows(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
) -> Result<Vec<SummaryRow>, Error> {
    if cfg.engine != Engine::Llm {
        return Ok(Vec::new());
    }
    let rows: Vec<SummaryRow> = h
        .summaries(session)?
        .into_iter()
        .filter(|r| upgradable(r, cfg))
        .collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    h.log(
        Level::Info,
        &format!(
            "session {session}: {} summary row(s) were written by the offline summarizer; {} rewrites them",
            rows.len(),
            cfg.model
        ),
    );
    let strict = Config {
        max_skipped_percent: 0,
        ..cfg.clone()
    };
    let f = calibration_factor(h, cfg)?;
    let budget = policy::input_budget_f(cfg, f, prompt::fixed_tokens_x(None, &focus_only(cfg)))
        .map_err(Error::InvalidInput)?;
    let mut written = Vec::new();
    for r in rows {
        let span = r.last_episode - r.first_episode + 1;
        let mut eps = Vec::new();
        while (eps.len() as u64) < span {
            let after = eps.last().map_or(r.first_episode - 1, |e: &Episode| e.id);
            let want = (span - eps.len() as u64).min(u64::from(PAGE)) as u32;
            let page = h.episodes_after(session, after, want)?;
            if page.is_empty() {
                break;
            }
            eps.extend(page.into_iter().filter(|e| e.id <= r.last_episode));
        }
        if eps.len() as u64 != span {
            return Err(Error::Storage(format!(
                "row {} covers episodes {}-{}, but the store returned {} of them",
                r.id,
                r.first_episode,
                r.last_episode,
                eps.len()
            )));
        }
        let sizes = Sizes::of(eps.iter().map(|e| (e.id, e.tokens)));
        let g = map_reduce(h, session, &strict, f, &sizes, budget)?;
        let ledger = row_ledger(cfg, None, crate::digest::is_coding(&r.ledger.entries), &eps);
        let now_ms = h.now_ms();
        let w = SummaryWrite {
            replaces: Some(r.id),
            first_episode: r.first_episode,
            last_episode: r.last_episode,
            tokens: estimate_tokens(&g.text),
            content: g.text,
            prompt_tokens: g.prompt_tokens,
            output_tokens: g.output_tokens,
            model: cfg.model.clone(),
            now_ms,
            skipped: g.skipped,
            ledger,
        };
        match h.write_summary(session, w) {
            Ok(row) => {
                written.push(row);
                newest_kept(&mut written);
            }
            Err(Error::Conflict(m)) => {
                h.log(
                    Level::Info,
                    &format!(
                        "session {session}: row {} changed while it was rewritten; the next refresh takes it up ({m})",
                        r.id
                    ),
                );
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}
