//! The second level: folding the oldest rows of a chain into an "earlier" row.

#[allow(unused_imports)]
use super::*;

/// Most compactions one call runs (each folds at least two rows, so the chain shrinks).
pub(super) const MAX_COMPACTIONS: usize = 32;

/// New rows a long catch-up writes between compactions: the chain it builds stays short, so
/// no compaction (and no read of the chain) ever holds more than a few dozen rows, however
/// long the backlog (a 400,000-message import writes over 3,000 rows).
pub(super) const COMPACT_EVERY_ROWS: u32 = 16;

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
            let all = rs
                .iter()
                .fold(Ledger::default(), |acc, r| ledger::merge(&acc, &r.ledger));
            ledger::stored(all)
        };
        // The merge prompt's room, with the largest ledger the group could carry.
        let widest = ledger::for_prompt(&merged_of(&rows[..end]), cfg.ledger_tokens);
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
        let ledger_text = ledger::for_prompt(&merged_ledger, cfg.ledger_tokens);
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
            Engine::Extractive if crate::digest::is_coding(&merged_ledger.entries) => {
                offline_digest(cfg, &merged_ledger).expect("an offline coding digest")
            }
            Engine::Extractive => {
                let joined = group
                    .iter()
                    .map(|r| r.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                let text = extractive::summarize(
                    &[],
                    Some(&joined),
                    cfg.max_output_tokens,
                    extractive::Aim::Summary,
                );
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
