//! Long transcripts: map-reduce when the backlog cannot be folded in one pass.

#[allow(unused_imports)]
use super::*;

/// The map chunk budget when the backlog goes the map-reduce way, else `None`: a session
/// with no summary yet whose backlog exceeds one prompt, or a summarized session whose new
/// part would take more than two rolling passes (the new part is then map-reduced into a new
/// row, never regenerating what is already summarized).
pub(super) fn long_path(
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

/// Map-reduce for a long backlog (see [`long_path`]), as `plan` laid it out: token-budgeted
/// chunks summarized concurrently, then merged in order, level by level, into one row
/// covering every new episode. `None` when the plan takes the rolling path.
pub(super) fn map_reduce_planned(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    plan: Plan,
) -> Result<Option<SummaryRow>, Error> {
    let Plan { f, latest, map, .. } = plan;
    let Some((budget, eps, chunks)) = map else {
        return Ok(None);
    };
    let covered = latest.as_ref().map_or(0, |r| r.last_episode);
    h.log(
        Level::Info,
        &format!(
            "session {session}: {} new episodes (~{} tokens) exceed one prompt; map-reduce",
            eps.len(),
            eps.backlog()
        ),
    );
    let g = map_reduce_chunks(h, session, cfg, f, (&eps, chunks), budget)?;
    let last = covered + eps.len() as u64;
    drop(eps);
    // A summarized session gets a new row for the new part; the old rows stay as they are.
    let strategy = if latest.is_some() {
        Strategy::NewRow
    } else {
        Strategy::Fresh
    };
    let ledger = row_ledger_paged(
        h,
        cfg,
        None,
        coding_before(latest.as_ref()),
        (session, covered, last),
    )?;
    write(h, session, cfg, &strategy, covered, last, g, ledger).map(Some)
}

/// Summarize the episodes whose `(id, tokens)` are `sizes` (consecutive episodes of one
/// session) from scratch: token-budgeted chunks of at most `budget` summarized concurrently,
/// then merged in order, level by level, into one text. One chunk is one fresh summary. A
/// chunk that fails after the host's retries is skipped and recorded, within
/// `max-skipped-percent`. The text is read from the store a wave of [`BATCH`] chunks at a
/// time, so memory holds one wave's prompts whatever the length of the range.
pub(super) fn map_reduce(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    f: f64,
    sizes: &Sizes,
    budget: u32,
) -> Result<Generated, Error> {
    let chunks = chunks_of(h, session, sizes, chunk_cap(cfg, budget))?;
    map_reduce_chunks(h, session, cfg, f, (sizes, chunks), budget)
}

/// [`map_reduce`] over chunks already planned.
pub(super) fn map_reduce_chunks(
    h: &mut impl Host,
    session: &str,
    cfg: &Config,
    f: f64,
    (sizes, chunks): (&Sizes, Vec<plan::Chunk>),
    budget: u32,
) -> Result<Generated, Error> {
    h.log(
        Level::Debug,
        &format!(
            "session {session}: episodes {}-{} in {} chunks",
            sizes.range().map_or(0, |r| r.0),
            sizes.range().map_or(0, |r| r.1),
            chunks.len()
        ),
    );
    let mut spent = (0u32, 0u32);
    let mut partials: Vec<Partial> = Vec::new();
    let mut skipped = Vec::new();
    let mut last_error = None;
    for (w, wave) in chunks.chunks(BATCH).enumerate() {
        let (first, last) = (wave[0].first, wave[wave.len() - 1].last);
        let mut it = Paged::new(h, session, first - 1, last);
        let eps: Vec<Episode> = (&mut it).collect();
        it.check()?;
        if eps.len() as u64 != last - first + 1 {
            return Err(Error::Storage(format!(
                "episodes {first}-{last} of session {session}: the store returned {} of them",
                eps.len()
            )));
        }
        let at = |id: u64| &eps[(id - first) as usize];
        let mut parts_of: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
        let mut reqs = Vec::with_capacity(wave.len());
        for c in wave {
            let conversation: Vec<Message> = match c.part {
                None => (c.first..=c.last)
                    .map(|id| {
                        Message::new(at(id).role, at(id).content.clone())
                            .by(at(id).speaker.clone())
                            .at(at(id).timestamp_ms)
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
        drop(parts_of);
        drop(eps);
        let results = cached_batch(
            h,
            cfg,
            reqs,
            (0, &format!("session {session}: map")),
            (w * BATCH, chunks.len()),
            &mut spent,
        )?;
        // A chunk the model refused as over-long is not skipped: the estimator was
        // recalibrated and the whole session is re-planned with smaller chunks.
        if let Some(Err(e)) = results
            .iter()
            .find(|r| matches!(r, Err(Error::ContextOverflow(_))))
        {
            return Err(e.clone());
        }
        // A chunk that still fails after the host's retries is skipped and recorded, unless
        // too many fail: then the call fails rather than writing a thin summary.
        for (c, r) in wave.iter().zip(results) {
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
            (0, groups.len()),
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
    Ok(Generated {
        text: partials.remove(0).text,
        prompt_tokens: spent.0,
        output_tokens: spent.1,
        skipped: merge_ranges(skipped),
    })
}
