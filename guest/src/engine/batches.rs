//! Batches of requests handed to the host, with cached answers and merged ranges.

#[allow(unused_imports)]
use super::*;

/// Run requests through the host's batch import, `BATCH` at a time, and check each answer.
/// Progress of stage `level` is reported after each batch, counting `before` answers already
/// in hand out of `total`. The requests whose answers failed the quality gate are handed
/// back in `rejected` (by position), to be asked again.
pub(super) fn run_batch(
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
pub(super) fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
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

/// Answers for stage `level` (these requests are the ones after `before` of the stage's
/// `grand` in all, for its progress): cached partial summaries where present (checked again by the
/// quality gate); the rest go to the model with their cache key, so the host caches each
/// complete answer as it arrives and a retried, resumed or cancelled map-reduce asks only for
/// what is missing.
pub(super) fn cached_batch(
    h: &mut impl Host,
    cfg: &Config,
    reqs: Vec<Request>,
    (level, what): (u32, &str),
    (before, grand): (usize, usize),
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
    h.progress(level, (before + reused) as u32, grand as u32);
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
        (level, before + reused, grand),
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
        let answers = run_batch(
            h,
            cfg,
            reqs,
            what,
            spent,
            (level, before + total - n, grand),
            None,
        );
        for (i, r) in at.into_iter().zip(answers) {
            out[i] = Some(r);
        }
    }
    Ok(out
        .into_iter()
        .map(|r| r.expect("every request has an answer"))
        .collect())
}
