//! Full-text search of a session's or a tenant's messages, and the earlier turns a context's
//! query finds. The store's index answers which episodes hold the query's terms; what ranks
//! first, how many are shown and what stands beside them is decided here.

#[allow(unused_imports)]
use super::*;
use crate::search;
use std::collections::BTreeMap;

/// Most hits one search page holds.
pub const PAGE_MAX: u32 = 100;
/// Most earlier turns a query adds to a context (before the budget's share cuts them).
pub const FOUND_MAX: usize = 100;
/// A turn is found only when it scores at least this share (percent) of the best turn's
/// score: below it a turn matches the query's commonest words alone (a name said in every
/// other turn), and the room is the summary's.
pub const FOUND_FLOOR: u32 = 30;
/// A reply shown beside a found turn: at most this many tokens (a short answer, an
/// acknowledgement that dates it).
pub const REPLY_TOKENS: u32 = 60;

/// One episode a search found (mirrors the WIT `search-hit`).
#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    /// Its session.
    pub session: String,
    /// The episode.
    pub episode: Episode,
    /// Its BM25 score.
    pub score: f64,
    /// Its text around the matches, the matches marked.
    pub excerpt: String,
}

/// A page of hits (mirrors the WIT `search-page`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SearchPage {
    /// The hits, best first.
    pub hits: Vec<SearchHit>,
    /// Whether more follow.
    pub more: bool,
}

/// Full-text search of `session`'s messages, or of every session the store holds (see the
/// WIT `search`).
pub fn search(
    h: &mut impl Host,
    session: Option<&str>,
    q: &str,
    offset: u32,
    limit: u32,
) -> Result<SearchPage, Error> {
    if session.is_some_and(|s| s.trim().is_empty()) {
        return Err(Error::InvalidInput(
            "the session id is empty; pass a session id, or none to search every session".into(),
        ));
    }
    let terms = search::query(q);
    if terms.is_empty() {
        return Ok(SearchPage::default());
    }
    let limit = limit.clamp(1, PAGE_MAX);
    let want = (u64::from(offset) + u64::from(limit) + 1).min(u64::from(u32::MAX)) as u32;
    let m = h.search_episodes(session, &terms, search::CANDIDATES.max(want))?;
    let ranked = search::rank(&m);
    let more = ranked.len() > offset as usize + limit as usize;
    let page: Vec<(f64, usize)> = ranked
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    // The page's episodes, one read per session they are in.
    let mut read: BTreeMap<(String, u64), Episode> = BTreeMap::new();
    let mut by_session: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (_, i) in &page {
        let x = &m.matches[*i];
        by_session.entry(&x.session).or_default().push(x.episode);
    }
    for (s, mut ids) in by_session {
        ids.sort_unstable();
        ids.dedup();
        for e in h.episodes(s, &ids)? {
            read.insert((s.to_string(), e.id), e);
        }
    }
    let mut hits = Vec::new();
    for (score, i) in page {
        let x = &m.matches[i];
        // An episode popped since the index answered is gone: it is not a hit.
        let Some(e) = read.remove(&(x.session.clone(), x.episode)) else {
            continue;
        };
        hits.push(SearchHit {
            session: x.session.clone(),
            excerpt: search::excerpt(&e.content, &terms, search::EXCERPT_CHARS),
            episode: e,
            score,
        });
    }
    Ok(SearchPage { hits, more })
}

/// An earlier turn a context's query found, and the short reply to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// The turn.
    pub turn: Episode,
    /// The next turn, when it is the other side's and short.
    pub reply: Option<Episode>,
}

/// The session's turns that best match a query's `terms` ([`search::query`]), best first (at most [`FOUND_MAX`]), each with its
/// short reply: what a context with a query shows beside the summary, as far as its share of
/// the budget goes (`context::assemble`). Only dialogue is found (a context shows no tool
/// output verbatim).
pub fn found_turns(
    h: &mut impl Host,
    session: &str,
    terms: &[String],
) -> Result<Vec<Found>, Error> {
    if terms.is_empty() {
        return Ok(Vec::new());
    }
    let m = h.search_episodes(Some(session), terms, search::CANDIDATES)?;
    let dialogue = |e: &Episode| {
        matches!(
            e.role,
            crate::types::Role::User | crate::types::Role::Assistant
        )
    };
    let mut out: Vec<Found> = Vec::new();
    let ranked = search::rank(&m);
    let floor = ranked
        .first()
        .map_or(0.0, |(best, _)| best * f64::from(FOUND_FLOOR) / 100.0);
    let ranked: Vec<usize> = ranked
        .into_iter()
        .take_while(|(score, _)| *score >= floor)
        .map(|(_, i)| i)
        .collect();
    // The candidates still wanted are read in one call with the turn after each: one read
    // unless some are not dialogue (then the next ones, as many as are still wanted).
    let mut next = 0;
    while out.len() < FOUND_MAX && next < ranked.len() {
        let batch = &ranked[next..(next + FOUND_MAX - out.len()).min(ranked.len())];
        next += batch.len();
        let mut ids: Vec<u64> = batch
            .iter()
            .flat_map(|&i| [m.matches[i].episode, m.matches[i].episode + 1])
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let read: BTreeMap<u64, Episode> = h
            .episodes(session, &ids)?
            .into_iter()
            .map(|e| (e.id, e))
            .collect();
        for &i in batch {
            let Some(turn) = read.get(&m.matches[i].episode).filter(|e| dialogue(e)) else {
                continue;
            };
            let reply = read
                .get(&(turn.id + 1))
                .filter(|r| {
                    dialogue(r)
                        && (r.role != turn.role || r.speaker != turn.speaker)
                        && r.tokens <= REPLY_TOKENS
                })
                .cloned();
            out.push(Found {
                turn: turn.clone(),
                reply,
            });
        }
    }
    Ok(out)
}
