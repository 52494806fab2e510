//! Full-text search of messages, decided once for every store and host: what a message's words
//! are to the index, what a query's words are (a user's text never reaches a store's query
//! language: a store only ever sees a list of these terms), how the index's matches rank
//! (BM25, ties broken the one way), and how a hit shows its match. Pure.
//!
//! A store keeps each term as a keyed hash (see the store's `episode_terms`), so SQLite,
//! PostgreSQL and the JavaScript host index the same terms and rank the same candidates alike.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Most terms of one message the index keeps (its first ones): a long tool output is found by
/// its start, and an index row stays small.
pub const DOC_TERMS: usize = 1024;
/// Most distinct terms of a query looked up (its first ones).
pub const QUERY_TERMS: usize = 32;
/// Longest term kept, in characters: longer runs of letters and digits (hashes, base64) are
/// cut to it.
pub const TERM_CHARS: usize = 40;
/// Matches a search asks its store for (more only to reach a deeper page).
pub const CANDIDATES: u32 = 200;
/// Characters of a hit's excerpt, about.
pub const EXCERPT_CHARS: usize = 240;
/// BM25's term-frequency saturation.
const K1: f64 = 1.2;
/// BM25's length normalization.
const B: f64 = 0.75;

/// Words no query is about: English function words, and what an apostrophe leaves behind
/// ("it's" → "it", "s"). Sorted (looked up by binary search).
const STOP: &[&str] = &[
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
    "been", "before", "being", "but", "by", "can", "could", "d", "did", "do", "does", "doing",
    "for", "from", "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his",
    "how", "i", "if", "in", "into", "is", "it", "its", "just", "ll", "m", "me", "my", "of", "on",
    "or", "our", "ours", "re", "s", "she", "should", "so", "t", "than", "that", "the", "their",
    "theirs", "them", "then", "there", "these", "they", "this", "those", "to", "too", "us", "ve",
    "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why",
    "will", "with", "would", "you", "your", "yours",
];

/// The words of `text`: each maximal run of letters and digits, with its byte range.
pub fn words(text: &str) -> Vec<(Range<usize>, &str)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s..i, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s..text.len(), &text[s..]));
    }
    out
}

/// A word as the index keeps it: lower case, cut to [`TERM_CHARS`] characters, its English
/// stem (Snowball); `None` for a stop word.
pub fn term(word: &str) -> Option<String> {
    term_with(&english(), word)
}

fn english() -> rust_stemmers::Stemmer {
    rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English)
}

/// [`term`] with a stemmer made once for many words.
fn term_with(stemmer: &rust_stemmers::Stemmer, word: &str) -> Option<String> {
    let lower: String = if word.len() <= TERM_CHARS && word.bytes().all(|b| b.is_ascii()) {
        word.to_ascii_lowercase()
    } else {
        word.to_lowercase().chars().take(TERM_CHARS).collect()
    };
    if lower.is_empty() || STOP.binary_search(&lower.as_str()).is_ok() {
        return None;
    }
    if lower.bytes().all(|b| b.is_ascii_digit()) {
        return Some(lower);
    }
    let stem = stemmer.stem(&lower);
    Some(if stem.is_empty() {
        lower
    } else {
        stem.into_owned()
    })
}

/// The index's terms of `text`, in order, at most [`DOC_TERMS`].
pub fn terms(text: &str) -> Vec<String> {
    let stemmer = english();
    words(text)
        .into_iter()
        .filter_map(|(_, w)| term_with(&stemmer, w))
        .take(DOC_TERMS)
        .collect()
}

/// What the index holds for a message: the terms of its speaker's name and its text, space
/// separated.
pub fn doc(speaker: Option<&str>, content: &str) -> String {
    let text = match speaker {
        Some(s) if !s.trim().is_empty() => format!("{s}: {content}"),
        _ => content.to_string(),
    };
    terms(&text).join(" ")
}

/// A query's distinct terms, in order, at most [`QUERY_TERMS`]. Quotes, operators, column
/// filters and wildcards are punctuation: they separate words and are never searched for.
pub fn query(q: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    words(q)
        .into_iter()
        .filter_map(|(_, w)| term(w))
        .filter(|t| seen.insert(t.clone()))
        .take(QUERY_TERMS)
        .collect()
}

/// One episode the index matched (mirrors the WIT `term-match`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// Its session.
    pub session: String,
    /// Its id.
    pub episode: u64,
    /// Terms the index holds for it.
    pub length: u32,
    /// How often it holds each query term.
    pub counts: Vec<u32>,
}

/// What the index answered for a query's terms (mirrors the WIT `term-matches`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matches {
    /// Episodes indexed in the tenant.
    pub docs: u64,
    /// Their terms in all.
    pub length: u64,
    /// Episodes holding each query term.
    pub df: Vec<u64>,
    /// The episodes matched.
    pub matches: Vec<Match>,
}

/// The matches by BM25 (k1 1.2, b 0.75), best first: `(score, index into m.matches)`. Ties go
/// to the session, then the episode, in ascending order, so every store and host ranks alike.
/// Matches scoring 0 (none of the terms) are left out.
pub fn rank(m: &Matches) -> Vec<(f64, usize)> {
    let n = m.docs.max(m.matches.len() as u64) as f64;
    let avg = if m.docs == 0 {
        1.0
    } else {
        (m.length as f64 / m.docs as f64).max(1.0)
    };
    let idf: Vec<f64> =
        m.df.iter()
            .map(|&df| {
                let df = (df as f64).min(n);
                ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
            })
            .collect();
    let mut scored: Vec<(f64, usize)> = m
        .matches
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let norm = K1 * (1.0 - B + B * f64::from(x.length) / avg);
            let s = x
                .counts
                .iter()
                .zip(&idf)
                .filter(|(c, _)| **c > 0)
                .map(|(&c, idf)| {
                    let tf = f64::from(c);
                    idf * tf * (K1 + 1.0) / (tf + norm)
                })
                .sum();
            (s, i)
        })
        .filter(|(s, _)| *s > 0.0)
        .collect();
    scored.sort_by(|a, b| {
        let (x, y) = (&m.matches[a.1], &m.matches[b.1]);
        b.0.total_cmp(&a.0)
            .then_with(|| x.session.cmp(&y.session))
            .then(x.episode.cmp(&y.episode))
    });
    scored
}

/// The part of `text` around its matches of `q` (terms of [`query`]), about `chars`
/// characters, each matching word between `**`; `…` marks an elided start or end.
pub fn excerpt(text: &str, q: &[String], chars: usize) -> String {
    let ws = words(text);
    let hits: Vec<(usize, Range<usize>, String)> = ws
        .iter()
        .enumerate()
        .filter_map(|(i, (r, w))| term(w).filter(|t| q.contains(t)).map(|t| (i, r.clone(), t)))
        .collect();
    // The window: starting a little before the match whose next `chars` hold the most
    // distinct terms (the first such).
    let budget = chars.max(40);
    let start_at = |r: &Range<usize>| -> usize {
        let back = budget / 5;
        let mut s = r.start.saturating_sub(back);
        while !text.is_char_boundary(s) {
            s -= 1;
        }
        // From a word's start, not its middle.
        ws.iter()
            .find(|(w, _)| w.start >= s)
            .map_or(s, |(w, _)| w.start.min(r.start))
    };
    let best = hits
        .iter()
        .map(|(_, r, _)| {
            let from = start_at(r);
            let distinct: BTreeSet<&String> = hits
                .iter()
                .filter(|(_, h, _)| h.start >= from && h.end <= from + budget * 4)
                .filter(|(_, h, _)| text[from..h.end].chars().count() <= budget)
                .map(|(_, _, t)| t)
                .collect();
            (distinct.len(), from)
        })
        .fold(None::<(usize, usize)>, |acc, x| match acc {
            Some(a) if a.0 >= x.0 => Some(a),
            _ => Some(x),
        });
    let from = best.map_or(0, |(_, f)| f);
    // The end: `budget` characters on, back to a word's end when one is near.
    let mut end = text[from..]
        .char_indices()
        .nth(budget)
        .map_or(text.len(), |(i, _)| from + i);
    if end < text.len()
        && let Some((r, _)) = ws
            .iter()
            .rev()
            .find(|(r, _)| r.end <= end && r.start >= from)
        && end - r.end < 24
    {
        end = r.end;
    }
    let marks: BTreeMap<usize, usize> = hits
        .iter()
        .filter(|(_, r, _)| r.start >= from && r.end <= end)
        .map(|(_, r, _)| (r.start, r.end))
        .collect();
    let mut out = String::with_capacity(end - from + 16);
    if from > 0 {
        out.push('…');
    }
    let mut at = from;
    for (s, e) in marks {
        out.push_str(&text[at..s]);
        out.push_str("**");
        out.push_str(&text[s..e]);
        out.push_str("**");
        at = e;
    }
    out.push_str(&text[at..end]);
    if end < text.len() {
        out.push('…');
    }
    // One line: a hit is shown in a list.
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_words_are_sorted() {
        assert!(STOP.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn words_become_stems_without_stop_words() {
        assert_eq!(
            terms("I painted the sunsets; she's PAINTING 2 lakes!"),
            ["paint", "sunset", "paint", "2", "lake"]
        );
        assert_eq!(
            doc(Some("Melanie"), "Painted it"),
            "melani paint",
            "the speaker's name is searchable"
        );
        assert!(terms(&"word ".repeat(5000)).len() == DOC_TERMS);
        let long = "x".repeat(500);
        assert_eq!(terms(&long)[0].chars().count(), TERM_CHARS);
        assert_eq!(terms("Überraschung café"), ["überraschung", "café"]);
    }

    #[test]
    fn hostile_queries_are_words() {
        // FTS5 and tsquery syntax: quotes, NEAR, *, -, column filters, parentheses, ^, :.
        for (q, want) in [
            ("\"deploy key\"", vec!["deploy", "key"]),
            ("NEAR(deploy key, 3)", vec!["near", "deploy", "key", "3"]),
            ("deplo*", vec!["deplo"]),
            ("-secret", vec!["secret"]),
            (
                "content:deploy OR body:key",
                vec!["content", "deploy", "bodi", "key"],
            ),
            (
                "deploy & !key | (x <-> y):*",
                vec!["deploy", "key", "x", "y"],
            ),
            ("^start", vec!["start"]),
            ("'; DROP TABLE episodes; --", vec!["drop", "tabl", "episod"]),
            ("", vec![]),
            ("*** --- \"\" ()", vec![]),
        ] {
            assert_eq!(query(q), want, "{q}");
        }
        // "or" is a stop word; "OR" the same word.
        assert!(!query("a OR b AND c").iter().any(|t| t == "or"));
        // A very long query keeps its first distinct terms.
        let long: String = (0..5000).map(|i| format!("w{i} ")).collect();
        assert_eq!(query(&long).len(), QUERY_TERMS);
    }

    fn m(session: &str, episode: u64, length: u32, counts: &[u32]) -> Match {
        Match {
            session: session.into(),
            episode,
            length,
            counts: counts.to_vec(),
        }
    }

    #[test]
    fn bm25_prefers_rare_terms_and_breaks_ties_by_place() {
        let found = Matches {
            docs: 100,
            length: 1000,
            df: vec![2, 50],
            matches: vec![
                m("b", 1, 10, &[0, 1]),
                m("b", 2, 10, &[1, 0]),
                m("a", 9, 10, &[1, 0]),
                m("a", 3, 10, &[1, 1]),
                m("a", 4, 10, &[0, 0]),
            ],
        };
        let order: Vec<usize> = rank(&found).into_iter().map(|(_, i)| i).collect();
        // Both terms; then the rare term alone (tied: session a before b); then the common one.
        assert_eq!(order, [3, 2, 1, 0]);
        // A shorter message with the same counts ranks higher.
        let found = Matches {
            docs: 10,
            length: 100,
            df: vec![3],
            matches: vec![m("s", 1, 40, &[1]), m("s", 2, 5, &[1])],
        };
        assert_eq!(rank(&found)[0].1, 1);
        assert!(rank(&Matches::default()).is_empty());
    }

    #[test]
    fn an_excerpt_marks_the_matches_around_the_best_run() {
        let q = query("painting lake");
        let text = format!(
            "{} Yesterday I painted a lake at dawn. {}",
            "Filler words here. ".repeat(30),
            "More filler after. ".repeat(30)
        );
        let e = excerpt(&text, &q, 120);
        assert!(e.contains("**painted** a **lake**"), "{e}");
        assert!(e.starts_with('…') && e.ends_with('…'), "{e}");
        assert!(e.chars().count() <= 130, "{e}");
        // A short text is whole; no match: its start.
        assert_eq!(excerpt("Paint it", &q, 120), "**Paint** it");
        assert_eq!(excerpt("nothing here", &q, 5), "nothing here");
        assert!(excerpt(&"é".repeat(600), &q, 100).ends_with('…'));
    }
}
