//! What share of the identifiers a coding agent's start shows is noise (`abridge bench agents`).
//!
//! The definition is the measurement's own, from the transcript, not the ledger's rules: an
//! identifier shown under the ledger's heading is noise when it is
//! - a tool the transcript calls (`[action] Bash: …` names `Bash`),
//! - a timing: a number with a unit of time (`1.3s`, `250 ms`),
//! - ordinary words in capitals: every word of it a plain capitalised word that the
//!   transcript also writes in lower case at least twice (`Exit`, `Bug Fixed`),
//! - or shown twice: the same text twice in the start, or a path its digest already lists.

use std::collections::{BTreeMap, BTreeSet};

/// The heading the ledger's identifiers are shown under (the guest's `ledger::HEADING`).
const HEADING: &str = "Identifiers mentioned (verbatim; episode last seen):";

/// Units of time a timing ends in.
const TIME: &[&str] = &[
    "ms", "s", "sec", "secs", "second", "seconds", "min", "mins", "minute", "minutes", "h", "hr",
    "hrs", "hour", "hours",
];

/// What the transcript says of its words and tools, for [`noise`].
pub struct Vocabulary {
    lower: BTreeMap<String, u32>,
    tools: BTreeSet<String>,
}

impl Vocabulary {
    /// The vocabulary of a transcript's episodes (`(is a tool's, text)` as abridge parses
    /// them): the tools its actions call, and the words its user and assistant write in
    /// lower case (whole words of prose: not inside a path, a command or a code span).
    pub fn of<'a>(episodes: impl IntoIterator<Item = (bool, &'a str)>) -> Vocabulary {
        let mut lower: BTreeMap<String, u32> = BTreeMap::new();
        let mut tools = BTreeSet::new();
        for (tool, text) in episodes {
            if let Some(rest) = text.strip_prefix("[action] ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    tools.insert(name);
                }
            }
            if tool {
                continue;
            }
            // Prose: outside fences and backtick spans.
            let mut fenced = false;
            for line in text.lines() {
                if line.trim_start().starts_with("```") {
                    fenced = !fenced;
                    continue;
                }
                if fenced {
                    continue;
                }
                for (i, part) in line.split('`').enumerate() {
                    if i % 2 == 1 {
                        continue;
                    }
                    for w in part.split_whitespace() {
                        let w = w.trim_matches(|c: char| ",.;:!?()\"'".contains(c));
                        if w.len() >= 2 && w.chars().all(char::is_lowercase) {
                            *lower.entry(w.to_string()).or_default() += 1;
                        }
                    }
                }
            }
        }
        Vocabulary { lower, tools }
    }
}

/// The identifiers a start shows: each ledger block's entries, in order.
pub fn shown(ctx: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = ctx.lines();
    while let Some(l) = lines.next() {
        if !l.trim_end().ends_with(HEADING) {
            continue;
        }
        let Some(body) = lines.next() else { break };
        for group in body.split(" · ") {
            // "a, b (#12)": the label is the episode the group was last seen in.
            let group = match group.rfind(" (#") {
                Some(at) if group.ends_with(')') => &group[..at],
                _ => group,
            };
            out.extend(split_top(group).into_iter().map(str::to_string));
        }
    }
    out
}

/// `s` split at ", " outside brackets and quotes (`f(a, b), c` is two entries).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut start) = (0i32, false, 0usize);
    let bytes = s.as_bytes();
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => depth -= 1,
            '"' => quoted = !quoted,
            ',' if depth <= 0 && !quoted && bytes.get(i + 1) == Some(&b' ') => {
                out.push(s[start..i].trim());
                start = i + 2;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.retain(|x| !x.is_empty());
    out
}

fn timing(e: &str) -> bool {
    let e = e.trim();
    let split = e
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(e.len());
    let (n, unit) = e.split_at(split);
    !n.is_empty()
        && n.chars().next().is_some_and(|c| c.is_ascii_digit())
        && TIME.contains(&unit.trim().to_lowercase().as_str())
}

fn ordinary(e: &str, v: &Vocabulary) -> bool {
    let words: Vec<&str> = e.split(' ').collect();
    words.iter().all(|w| {
        let mut cs = w.chars();
        cs.next().is_some_and(char::is_uppercase)
            && w.chars().count() >= 2
            && cs.all(char::is_lowercase)
            && v.lower.get(&w.to_lowercase()).is_some_and(|n| *n >= 2)
    })
}

/// The noise among the identifiers a start shows.
#[derive(Debug, Default)]
pub struct Noise {
    /// Each noisy entry, with why.
    pub noisy: Vec<(String, &'static str)>,
    /// How many entries it shows in all.
    pub shown: usize,
}

impl Noise {
    /// Another start's noise added to this one's.
    pub fn add(&mut self, other: &Noise) {
        self.noisy.extend(other.noisy.iter().cloned());
        self.shown += other.shown;
    }
}

/// The noise among the identifiers `ctx` shows.
pub fn noise(ctx: &str, v: &Vocabulary) -> Noise {
    let entries = shown(ctx);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for e in &entries {
        let why = if v.tools.contains(e.as_str()) {
            Some("tool")
        } else if timing(e) {
            Some("timing")
        } else if ordinary(e, v) {
            Some("ordinary words")
        } else if !seen.insert(e.clone())
            || (e.contains('/') && abridge_app::hook::names_file(&without(ctx, e), e))
        {
            Some("shown twice")
        } else {
            None
        };
        if let Some(why) = why {
            out.push((e.clone(), why));
        }
    }
    Noise {
        noisy: out,
        shown: entries.len(),
    }
}

/// `ctx` with the ledger's mention of `e` taken out (to ask whether the rest names it).
fn without(ctx: &str, e: &str) -> String {
    ctx.lines()
        .filter(|l| !l.contains(e) || l.contains("(under "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_counted_by_its_definition() {
        let v = Vocabulary::of([
            (true, "[action] Bash: cargo test"),
            (
                false,
                "please exit and update it, then exit again and update.",
            ),
            (true, "[action] Edit /p/src/a.rs"),
            (false, "see ~/.priya and `nair` and nair/x"),
        ]);
        let ctx = "Files edited (under /p/): src/a.rs (#3)\n\nIdentifiers mentioned (verbatim; episode last seen):\nBash, Exit, 1.3s (#2) · f(a, b), Priya Nair (#3) · /p/src/a.rs, TypeScript, Update Exit (#4) · Priya Nair (#5)\n";
        assert_eq!(
            shown(ctx),
            [
                "Bash",
                "Exit",
                "1.3s",
                "f(a, b)",
                "Priya Nair",
                "/p/src/a.rs",
                "TypeScript",
                "Update Exit",
                "Priya Nair"
            ]
        );
        let n = noise(ctx, &v);
        assert_eq!(n.shown, 9);
        let got: Vec<(&str, &str)> = n.noisy.iter().map(|(e, w)| (e.as_str(), *w)).collect();
        assert_eq!(
            got,
            [
                ("Bash", "tool"),
                ("Exit", "ordinary words"),
                ("1.3s", "timing"),
                ("/p/src/a.rs", "shown twice"),
                ("Update Exit", "ordinary words"),
                ("Priya Nair", "shown twice"),
            ]
        );
    }
}
