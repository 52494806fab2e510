//! Planning map-reduce over a long session: token-budgeted chunks and reduce levels.
//!
//! Chunks break between episodes; an episode larger than a chunk is split (by
//! [`crate::chunk::split_to_fit`], at paragraph, line, sentence, word and only then character
//! boundaries) into parts that are chunks of their own. The plan is deterministic and records
//! which episodes, or which part of one, each chunk covers. Partial summaries are then merged
//! in order, in groups that fit one reduce prompt, level after level until one remains.

use crate::chunk::split_to_fit;
use crate::tokens::estimate_tokens;

/// Tokens a conversation message adds to a prompt beyond its text ("Role: " and separators).
pub const MESSAGE_COST: u32 = 3;

/// Tokens the "(part i of n of one long message)" marker adds to a split part.
pub const PART_MARKER: u32 = 16;

/// Tokens a partial summary's label ("Episodes 12-40:") adds to a reduce prompt.
pub const LABEL_COST: u32 = 12;

/// What one map chunk covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// First episode id (inclusive).
    pub first: u64,
    /// Last episode id (inclusive).
    pub last: u64,
    /// For a part of one split episode: (part index from 1, number of parts).
    pub part: Option<(u32, u32)>,
    /// Estimated tokens of the chunk's conversation text, message costs included.
    pub tokens: u32,
}

/// A full plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Map chunks, in order.
    pub chunks: Vec<Chunk>,
    /// Reduce levels: each level lists the groups (ranges of the previous level's outputs)
    /// merged by one call. Empty when one chunk needs no reduce.
    pub levels: Vec<Vec<std::ops::Range<usize>>>,
}

impl Plan {
    /// Model calls the plan makes.
    pub fn calls(&self) -> usize {
        self.chunks.len() + self.levels.iter().map(Vec::len).sum::<usize>()
    }
}

/// Split oversized text into parts for a chunk budget (the marker's cost is reserved).
pub fn split_parts(content: &str, budget: u32) -> Vec<&str> {
    split_to_fit(
        content,
        budget.saturating_sub(MESSAGE_COST + PART_MARKER).max(1),
    )
}

/// Plan map chunks over episodes given as `(id, tokens)` in order. `content(id)` is asked only
/// for episodes larger than a chunk, to split them exactly as execution will.
pub fn plan_chunks(
    episodes: impl IntoIterator<Item = (u64, u32)>,
    budget: u32,
    mut content: impl FnMut(u64) -> String,
) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut open: Option<Chunk> = None;
    for (id, tokens) in episodes {
        let cost = tokens.saturating_add(MESSAGE_COST);
        if cost > budget {
            chunks.extend(open.take());
            let text = content(id);
            let parts = split_parts(&text, budget);
            let n = parts.len() as u32;
            for (i, p) in parts.iter().enumerate() {
                let tokens = estimate_tokens(p) + MESSAGE_COST + PART_MARKER;
                chunks.push(Chunk {
                    first: id,
                    last: id,
                    part: Some((i as u32 + 1, n)),
                    tokens,
                });
            }
            continue;
        }
        match &mut open {
            Some(c) if c.tokens + cost <= budget => {
                c.last = id;
                c.tokens += cost;
            }
            _ => {
                chunks.extend(open.take());
                open = Some(Chunk {
                    first: id,
                    last: id,
                    part: None,
                    tokens: cost,
                });
            }
        }
    }
    chunks.extend(open);
    chunks
}

/// Group partial summaries of `sizes` tokens into reduce calls of at most `budget` tokens,
/// in order. Every group but a lone last one holds at least two partials, so each level
/// shrinks. `None` when two partials cannot share one prompt (the budget is too small).
pub fn plan_groups(sizes: &[u32], budget: u32) -> Option<Vec<std::ops::Range<usize>>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut used = 0u32;
    for (i, &s) in sizes.iter().enumerate() {
        let cost = s.saturating_add(LABEL_COST);
        if i > start && used + cost > budget {
            if i - start < 2 {
                return None;
            }
            groups.push(start..i);
            start = i;
            used = 0;
        }
        used += cost;
    }
    if start < sizes.len() {
        groups.push(start..sizes.len());
    }
    Some(groups)
}

/// Plan the reduce levels for `n` partials, each assumed to be `partial_tokens` long (the
/// output limit: an upper bound). `None` when the budget cannot hold two partials.
pub fn plan_levels(
    n: usize,
    partial_tokens: u32,
    budget: u32,
) -> Option<Vec<Vec<std::ops::Range<usize>>>> {
    let mut levels = Vec::new();
    let mut count = n;
    while count > 1 {
        let groups = plan_groups(&vec![partial_tokens; count], budget)?;
        count = groups.len();
        levels.push(groups);
    }
    Some(levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_cover(chunks: &[Chunk], n: u64) {
        let mut next = 1;
        let mut i = 0;
        while i < chunks.len() {
            let c = &chunks[i];
            assert_eq!(c.first, next, "{chunks:?}");
            if let Some((1, parts)) = c.part {
                for k in 0..parts as usize {
                    assert_eq!(chunks[i + k].part, Some((k as u32 + 1, parts)));
                    assert_eq!(
                        (chunks[i + k].first, chunks[i + k].last),
                        (c.first, c.first)
                    );
                }
                i += parts as usize;
            } else {
                assert!(c.part.is_none());
                i += 1;
            }
            next = chunks[i - 1].last + 1;
        }
        assert_eq!(next, n + 1);
    }

    #[test]
    fn chunks_break_between_episodes_within_budget() {
        let eps: Vec<(u64, u32)> = (1..=100).map(|i| (i, 10 + (i as u32 % 7) * 5)).collect();
        let chunks = plan_chunks(eps.clone(), 200, |_| unreachable!("nothing is oversized"));
        check_cover(&chunks, 100);
        for c in &chunks {
            assert!(c.tokens <= 200);
        }
        // Greedy: a chunk only ends when the next episode would not fit.
        for w in chunks.windows(2) {
            let next = eps[(w[1].first - 1) as usize].1 + MESSAGE_COST;
            assert!(w[0].tokens + next > 200);
        }
        assert_eq!(
            chunks,
            plan_chunks(eps, 200, |_| unreachable!()),
            "deterministic"
        );
    }

    #[test]
    fn an_oversized_episode_becomes_parts_of_its_own() {
        let big = "A sentence of moderate length goes here. ".repeat(200);
        let big_tokens = estimate_tokens(&big);
        let eps = vec![(1, 20), (2, big_tokens), (3, 20)];
        let chunks = plan_chunks(eps, 300, |id| {
            assert_eq!(id, 2);
            big.clone()
        });
        check_cover(&chunks, 3);
        let parts: Vec<&Chunk> = chunks.iter().filter(|c| c.part.is_some()).collect();
        assert!(parts.len() >= 5, "{chunks:?}");
        for c in &chunks {
            assert!(c.tokens <= 300, "{c:?}");
        }
        assert_eq!(
            split_parts(&big, 300).concat(),
            big,
            "nothing dropped or cut mid-character"
        );
    }

    #[test]
    fn reduce_levels_shrink_to_one() {
        assert_eq!(plan_levels(1, 500, 2000), Some(vec![]));
        let levels = plan_levels(100, 500, 2000).unwrap();
        // 3 partials of 512 fit in 2000: 100 -> 34 -> 12 -> 4 -> 2 -> 1.
        let sizes: Vec<usize> = levels.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![34, 12, 4, 2, 1]);
        for (l, groups) in levels.iter().enumerate() {
            let prev = if l == 0 { 100 } else { levels[l - 1].len() };
            assert_eq!(groups.first().unwrap().start, 0);
            assert_eq!(groups.last().unwrap().end, prev);
        }
        assert_eq!(
            plan_levels(10, 500, 900),
            None,
            "two partials must fit one prompt"
        );
    }
}
