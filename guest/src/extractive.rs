//! The extractive engine: an honest summary that needs no model.
//!
//! It selects the most representative sentences of the conversation (word-frequency scoring
//! with a redundancy check) and lists them verbatim, in conversation order, each tagged with
//! its speaker. It never invents text. When it updates an earlier extractive summary, the
//! earlier lines compete with the new sentences on equal terms.

use std::collections::{BTreeMap, BTreeSet};

use crate::tokens::estimate_tokens;
use crate::types::{Message, Role};

/// Most sentences in a summary.
pub const MAX_SENTENCES: usize = 5;

/// Sentences to select from `candidates`: the square root, rounded up, between 2 and
/// [`MAX_SENTENCES`] — a summary that grows with the conversation but ever more slowly, a rule
/// chosen for that shape, not fitted to a data set. When updating, the summary may grow by one
/// sentence (up to the maximum) so that new exchanges can enter without displacing what is
/// already there.
pub fn sentence_budget(candidates: usize, previous_lines: usize) -> usize {
    let root = (candidates as f64).sqrt().ceil() as usize;
    root.max(previous_lines + usize::from(previous_lines > 0))
        .clamp(2, MAX_SENTENCES)
}

/// Words too common to say what a conversation is about.
const STOPWORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "and", "any", "are", "because", "been",
    "before", "being", "between", "both", "but", "can", "could", "did", "does", "doing", "down",
    "each", "few", "for", "from", "further", "had", "has", "have", "having", "her", "here", "hers",
    "him", "his", "how", "into", "its", "just", "let", "like", "more", "most", "much", "must",
    "not", "now", "off", "once", "only", "other", "our", "ours", "out", "over", "own", "same",
    "she", "should", "some", "such", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "those", "through", "too", "under", "until", "very", "was", "way",
    "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with",
    "would", "yes", "yet", "you", "your", "yours", "okay", "well", "really", "know", "think",
    "want", "get", "got", "going", "one", "see", "thing", "things", "sure", "thanks", "thank",
    "please", "hello", "hey", "right", "good", "great", "lot", "may",
];

#[derive(Debug)]
struct Candidate {
    /// Rendered line without the leading "- ".
    line: String,
    /// Content words.
    words: BTreeSet<String>,
    /// Word count of the sentence.
    len: usize,
    /// Order in the conversation (earlier summary lines come first).
    position: usize,
    /// Score multiplier.
    boost: f64,
    /// Always selected: the opening request of a fresh summary usually names the topic.
    pinned: bool,
}

fn content_words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|w| w.trim_matches('\'').to_lowercase())
        .filter(|w| w.chars().count() >= 3 && !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// Split text into sentences (at `.`, `!`, `?` followed by whitespace, and at line breaks).
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut cur = String::new();
        let chars: Vec<char> = line.chars().collect();
        for (i, &c) in chars.iter().enumerate() {
            cur.push(c);
            let ends =
                matches!(c, '.' | '!' | '?') && chars.get(i + 1).is_none_or(|n| n.is_whitespace());
            if ends {
                push_sentence(&mut out, &cur);
                cur.clear();
            }
        }
        push_sentence(&mut out, &cur);
    }
    out
}

/// `<tag>`, `</tag>` and `<tag/>` markup removed (their text stays); other `<` stay.
fn strip_tags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(lt) = rest.find('<') {
        out.push_str(&rest[..lt]);
        let after = &rest[lt + 1..];
        let name_end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_')))
            .unwrap_or(after.len());
        let name = after[..name_end].trim_matches('/');
        if !name.is_empty()
            && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && after[name_end..].starts_with('>')
        {
            rest = &after[name_end + 1..];
        } else {
            out.push('<');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Markdown debris removed from a sentence: emphasis and code marks (their text stays),
/// heading and list markers, link targets.
fn demarkdown(s: &str) -> String {
    let mut t = strip_tags(&s.replace("**", "").replace("__", "").replace('`', ""));
    // [text](target) → text
    while let Some(open) = t.find("](") {
        let Some(close) = t[open..].find(')') else {
            break;
        };
        let Some(lb) = t[..open].rfind('[') else {
            break;
        };
        let text = t[lb + 1..open].to_string();
        t.replace_range(lb..open + close + 1, &text);
    }
    let t = t.trim_start_matches(['-', '*', '#', '>', '+', ' ']);
    // A numbered list marker ("3. ", "2) ").
    let t = match t.split_once(' ') {
        Some((n, rest))
            if n.len() <= 4
                && n.ends_with(['.', ')'])
                && n[..n.len() - 1].chars().all(|c| c.is_ascii_digit())
                && !n[..n.len() - 1].is_empty() =>
        {
            rest
        }
        _ => t,
    };
    t.trim().to_string()
}

fn push_sentence(out: &mut Vec<String>, s: &str) {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let s = demarkdown(&s);
    let s = s.as_str();
    // A quote opened in an earlier sentence or closed in a later one is noise here.
    let s = if s.matches('"').count() % 2 == 1 {
        s.trim_matches('"').trim()
    } else {
        s
    };
    if s.chars().any(char::is_alphanumeric) {
        out.push(s.to_string());
    }
}

/// Text of logs, errors and tools rather than of people.
const NOISE: &[&str] = &[
    "npm err",
    "npm error",
    "npm warn",
    "error:",
    "error[",
    "warning:",
    "exit code",
    "exit status",
    "traceback",
    "exception",
    "panicked at",
    "stack trace",
    "failed to solve",
    "command not found",
    "no such file",
    "segmentation fault",
];

/// Prose rather than code, markup, paths, headings or log and tool noise.
fn is_prose(s: &str) -> bool {
    let code_like = ["<", "{", "[", "//", "$ ", "#!"]
        .iter()
        .any(|p| s.starts_with(p))
        || s.contains("```")
        || [
            "{", "}", "=>", "==", "();", "::", "</", "/>", "\\", "&&", "||", "=\"",
        ]
        .iter()
        .any(|p| s.contains(p));
    // A lead-in ("Here's how:") introduces content it does not carry.
    if code_like || s.ends_with(':') {
        return false;
    }
    let lower = s.to_lowercase();
    if NOISE.iter().any(|n| lower.contains(n)) {
        return false;
    }
    let words: Vec<&str> = s.split_whitespace().collect();
    // Paths and file references (src/a/b.ts, app.ts:178, /bin/sh, a/b/c).
    if words.iter().any(|w| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '/');
        w.starts_with('/') && w.len() > 1
            || w.matches('/').count() >= 2
            || (w.contains('/') || w.contains(':'))
                && w.rsplit('.').next().is_some_and(|ext| {
                    (1..=4).contains(&ext.len()) && ext.chars().all(|c| c.is_ascii_alphanumeric())
                } && w.contains('.'))
    }) {
        return false;
    }
    // A heading in title case ("Critical Issue 3 Add Buffer Overflow Protection").
    let alpha: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| w.chars().next().is_some_and(char::is_alphabetic))
        .collect();
    if alpha.len() >= 3 {
        let capital = alpha
            .iter()
            .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
            .count();
        if capital * 10 >= alpha.len() * 7 {
            return false;
        }
    }
    let total = s.chars().count().max(1);
    let wordish = s.chars().filter(|c| c.is_alphabetic() || *c == ' ').count();
    wordish * 10 >= total * 8
}

/// Summarize `conversation` (optionally folding in an earlier extractive summary) in at most
/// `max_tokens` estimated tokens. Returns an empty string when there is nothing to select.
pub fn summarize(conversation: &[Message], previous: Option<&str>, max_tokens: u32) -> String {
    let mut cands = Vec::new();
    let mut position = 0;
    if let Some(prev) = previous {
        for line in prev.lines() {
            let line = line.trim().trim_start_matches("- ").trim();
            if line.is_empty() {
                continue;
            }
            let words = content_words(line);
            let len = line.split_whitespace().count();
            cands.push(Candidate {
                line: line.to_string(),
                words: words.into_iter().collect(),
                len,
                position,
                boost: 1.2,
                pinned: false,
            });
            position += 1;
        }
    }
    for strict in [true, false] {
        let before = cands.len();
        let mut first_user = true;
        let mut pos = position;
        for m in conversation {
            if matches!(m.role, Role::System | Role::Tool) {
                continue;
            }
            for s in sentences(&m.content) {
                pos += 1;
                let len = s.split_whitespace().count();
                if strict && (!(4..=50).contains(&len) || !is_prose(&s)) {
                    continue;
                }
                let pinned = m.role == Role::User && first_user && previous.is_none();
                if m.role == Role::User {
                    first_user = false;
                }
                let words = content_words(&s);
                cands.push(Candidate {
                    line: format!("{}: {}", m.who(), s),
                    words: words.into_iter().collect(),
                    len,
                    position: pos,
                    boost: 1.0,
                    pinned,
                });
            }
        }
        if cands.len() > before {
            break;
        }
    }
    select(cands, position, max_tokens)
}

fn select(cands: Vec<Candidate>, previous_lines: usize, max_tokens: u32) -> String {
    let mut tf: BTreeMap<&str, u32> = BTreeMap::new();
    for c in &cands {
        for w in &c.words {
            *tf.entry(w.as_str()).or_insert(0) += 1;
        }
    }
    let score = |c: &Candidate| {
        let sum: u32 = c.words.iter().map(|w| tf[w.as_str()]).sum();
        c.boost * f64::from(sum) / (c.len.max(1) as f64).sqrt()
    };
    let mut order: Vec<(bool, f64, usize)> = cands
        .iter()
        .enumerate()
        .map(|(i, c)| (c.pinned, score(c), i))
        .collect();
    // Pinned first, then highest score; ties go to the earlier sentence (deterministic).
    order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut chosen: Vec<usize> = Vec::new();
    let mut tokens = 0u32;
    for (_, _, i) in order {
        if chosen.len() >= sentence_budget(cands.len(), previous_lines) {
            break;
        }
        let c = &cands[i];
        let redundant = chosen.iter().any(|&j| {
            let o = &cands[j];
            // Overlap coefficient: a sentence mostly contained in a chosen one adds nothing.
            let inter = c.words.intersection(&o.words).count();
            let smaller = c.words.len().min(o.words.len());
            smaller > 0 && inter * 10 > smaller * 6
        });
        let cost = estimate_tokens(&c.line) + 2;
        if redundant || tokens + cost > max_tokens {
            continue;
        }
        tokens += cost;
        chosen.push(i);
    }
    chosen.sort_by_key(|&i| cands[i].position);
    chosen
        .iter()
        .map(|&i| format!("- {}", cands[i].line))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> Vec<Message> {
        vec![
            Message::new(
                Role::User,
                "I need to migrate our Postgres database to version 16 this weekend. What should I check first?",
            ),
            Message::new(
                Role::Assistant,
                "Check extension compatibility first. Then run pg_upgrade in check mode against a copy of the Postgres database. Hi!",
            ),
            Message::new(
                Role::User,
                "The extensions are PostGIS and pg_trgm. Both are installed on the old database.",
            ),
            Message::new(
                Role::Assistant,
                "PostGIS needs the matching package for version 16 before pg_upgrade runs. The pg_trgm extension ships with Postgres itself.",
            ),
            Message::new(Role::Tool, "exit code 0"),
        ]
    }

    #[test]
    fn selects_verbatim_sentences_in_order() {
        let s = summarize(&conv(), None, 500);
        let lines: Vec<&str> = s.lines().collect();
        assert!((2..=MAX_SENTENCES).contains(&lines.len()), "{s}");
        assert!(
            lines[0].starts_with("- User: I need to migrate our Postgres database"),
            "{s}"
        );
        let all: String = conv()
            .iter()
            .map(|m| m.content.clone())
            .collect::<Vec<_>>()
            .join(" ");
        for l in &lines {
            let sentence = l.split_once(": ").unwrap().1;
            assert!(all.contains(sentence), "not verbatim: {l}");
        }
        assert!(!s.contains("Hi!") && !s.contains("exit code"));
    }

    #[test]
    fn respects_the_token_budget_and_is_deterministic() {
        let s = summarize(&conv(), None, 40);
        assert!(estimate_tokens(&s) <= 40 + 2 * MAX_SENTENCES as u32, "{s}");
        assert_eq!(s, summarize(&conv(), None, 40));
    }

    #[test]
    fn update_keeps_earlier_lines_competing() {
        let first = summarize(&conv()[..2], None, 500);
        let more = vec![Message::new(
            Role::User,
            "After the upgrade the PostGIS functions fail with a version mismatch error on every query.",
        )];
        let updated = summarize(&more, Some(&first), 500);
        assert!(updated.contains("version mismatch"), "{updated}");
        assert!(
            updated.contains("migrate our Postgres database"),
            "{updated}"
        );
    }

    #[test]
    fn sentences_come_out_clean_and_noise_stays_out() {
        let conv = vec![
            Message::new(
                Role::User,
                "158.5 npm error Exit handler never called!\nError: unknown (2): failed to solve: process did not complete successfully: exit code: 1\nWe should rebuild the image without the dev dependencies before the release.",
            ),
            Message::new(
                Role::Assistant,
                "## Critical Issue #3: Add Buffer Overflow Protection\n- **Computer use tools** are more robust than `Playwright` for this agent, so we keep them.\n`src/computer-use/browser.ts` - Coordinate-based interaction layer\nthis.sendToSession(session, \"error\", { message: \"AI streaming error\" });\n<summary>The team agreed to ship the agent after the security review next week.</summary>",
            ),
        ];
        let s = summarize(&conv, None, 500);
        for debris in [
            "**",
            "`",
            "npm",
            "exit code",
            "src/",
            "sendToSession",
            "<summary>",
            "Critical Issue",
            "##",
        ] {
            assert!(!s.contains(debris), "{debris:?} in {s}");
        }
        assert!(s.contains("- User: We should rebuild the image"), "{s}");
        // Markdown marks go, their words stay.
        assert_eq!(
            demarkdown(
                "- **Computer use tools** are more robust than `Playwright`, see [the docs](https://x.y/z)."
            ),
            "Computer use tools are more robust than Playwright, see the docs."
        );
        assert!(s.contains("The team agreed to ship the agent"), "{s}");
    }

    #[test]
    fn sentences_are_attributed_to_named_speakers() {
        let conv = vec![
            Message::new(
                Role::User,
                "Could you book the meeting room for Thursday afternoon?",
            )
            .by(Some("#Person1#".into())),
            Message::new(
                Role::Assistant,
                "The meeting room is booked for Thursday at three.",
            )
            .by(Some("#Person2#".into())),
        ];
        let s = summarize(&conv, None, 500);
        assert!(s.contains("- #Person1#: Could you book"), "{s}");
        assert!(s.contains("- #Person2#: The meeting room is booked"), "{s}");
    }

    #[test]
    fn short_chat_falls_back_to_short_sentences() {
        let s = summarize(
            &[
                Message::new(Role::User, "hi"),
                Message::new(Role::Assistant, "Hello there"),
            ],
            None,
            100,
        );
        assert_eq!(s, "- User: hi\n- Assistant: Hello there");
    }
}
