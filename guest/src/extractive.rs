//! The extractive engine: an honest summary that needs no model.
//!
//! It keeps sentences verbatim, in conversation order, each with its speaker, grouped under
//! the day they were said (`[8 May 2023]`), relative dates resolved against that time. It
//! never invents text. A fold adds the lines of the stretch it covers after the earlier
//! ones, in a share that follows the stretch's length ([`KEEP_RATE`]), so every stretch of a
//! long chat is represented; a context then picks among all of a chain's lines within its
//! room ([`pick`] with [`Aim::Recall`]). Small talk (greetings, thanks, praise, backchannel)
//! is never chosen.

use std::collections::{BTreeMap, BTreeSet};

use crate::tokens::estimate_tokens;
use crate::types::{Message, Role};

/// Words too common to say what a conversation is about (sorted: [`is_stopword`]).
const STOPWORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "and", "any", "are", "because", "been",
    "before", "being", "between", "both", "but", "can", "could", "did", "does", "doing", "down",
    "each", "few", "for", "from", "further", "get", "going", "good", "got", "great", "had", "has",
    "have", "having", "hello", "her", "here", "hers", "hey", "him", "his", "how", "into", "its",
    "just", "know", "let", "like", "lot", "may", "more", "most", "much", "must", "not", "now",
    "off", "okay", "once", "one", "only", "other", "our", "ours", "out", "over", "own", "please",
    "really", "right", "same", "see", "she", "should", "some", "such", "sure", "than", "thank",
    "thanks", "that", "the", "their", "them", "then", "there", "these", "they", "thing", "things",
    "think", "this", "those", "through", "too", "under", "until", "very", "want", "was", "way",
    "well", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will",
    "with", "would", "yes", "yet", "you", "your", "yours",
];

/// Whether `w` (lower case) is a stop word.
fn is_stopword(w: &str) -> bool {
    STOPWORDS.binary_search(&w).is_ok()
}

fn content_words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|w| w.trim_matches('\''))
        // Under three bytes is under three characters, lower-cased or not.
        .filter(|w| w.len() >= 3)
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 3 && !is_stopword(w))
        .collect()
}

/// Split text into sentences (at `.`, `!`, `?` followed by whitespace, and at line breaks).
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        // Slices of the line, not copies: a context reads every unfolded message's sentences
        // on each call.
        let mut start = 0;
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            let ends = matches!(c, '.' | '!' | '?')
                && chars.peek().is_none_or(|&(_, n)| n.is_whitespace());
            if ends {
                let end = i + c.len_utf8();
                push_sentence(&mut out, &line[start..end]);
                start = end;
            }
        }
        push_sentence(&mut out, &line[start..]);
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
    // (Most sentences hold none of these marks: nothing to replace.)
    let mut t = if s.contains(['*', '_', '`', '<']) {
        strip_tags(&s.replace("**", "").replace("__", "").replace('`', ""))
    } else {
        s.to_string()
    };
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

/// A heading in title case ("Critical Issue 3 Add Buffer Overflow Protection"): of three or
/// more words that start with a letter, at least seven in ten start with a capital.
pub(crate) fn is_title_case(words: &[&str]) -> bool {
    let alpha: Vec<&&str> = words
        .iter()
        .filter(|w| w.chars().next().is_some_and(char::is_alphabetic))
        .collect();
    let capital = alpha
        .iter()
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .count();
    alpha.len() >= 3 && capital * 10 >= alpha.len() * 7
}

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
    if is_title_case(&words) {
        return false;
    }
    let total = s.chars().count().max(1);
    let wordish = s.chars().filter(|c| c.is_alphabetic() || *c == ' ').count();
    wordish * 10 >= total * 8
}

/// Share of a fold's source tokens its new lines may take: what a row keeps of a stretch of
/// the conversation, so every stretch is represented in proportion to its length and a
/// context can choose among more lines than it shows.
pub const KEEP_RATE: f64 = 0.3;

/// Fewest tokens of new lines a fold may add (a short batch still gets its few best lines).
const MIN_NEW_TOKENS: u32 = 80;

/// Words of praise, thanks, greeting and backchannel: a sentence made only of these (and
/// stopwords) says nothing a later question could ask about. Sorted, for a binary search.
const SOCIAL: &[&str] = &[
    "absolutely",
    "adorable",
    "agree",
    "agreed",
    "amazing",
    "appreciate",
    "awesome",
    "beautiful",
    "bet",
    "brilliant",
    "bye",
    "care",
    "catch",
    "chat",
    "chatting",
    "cheers",
    "congrats",
    "congratulations",
    "cool",
    "cute",
    "definitely",
    "exactly",
    "excited",
    "exciting",
    "fantastic",
    "feel",
    "feels",
    "fun",
    "glad",
    "good",
    "gorgeous",
    "great",
    "haha",
    "happy",
    "hello",
    "hey",
    "hope",
    "impressive",
    "incredible",
    "inspiring",
    "it",
    "keep",
    "lol",
    "lots",
    "love",
    "lovely",
    "luck",
    "mean",
    "means",
    "nice",
    "omg",
    "proud",
    "share",
    "sharing",
    "soon",
    "sound",
    "sounds",
    "stunning",
    "super",
    "sweet",
    "talk",
    "thank",
    "thanks",
    "totally",
    "true",
    "wish",
    "wonderful",
    "wow",
    "yeah",
    "yes",
];

/// Greetings and sign-offs whose words are common on their own ("long", "time", "see").
const GREETINGS: &[&str] = &[
    "long time no talk",
    "long time no see",
    "long time no chat",
    "good to see you",
    "nice to see you",
    "great to see you",
    "nice to meet you",
    "how have you been",
    "how are you",
    "how's it going",
    "what's up",
    "see you later",
    "see you soon",
    "talk to you later",
    "take care",
    "have a good one",
];

/// A sentence worth keeping, with what its score needs.
#[derive(Debug, Clone)]
pub struct Line {
    /// "Speaker: sentence".
    pub text: String,
    /// The day it was said ("8 May 2023"), if known.
    pub day: Option<String>,
    /// Estimated tokens of the rendered line.
    pub cost: u32,
    /// Content words (no stopwords, no social words).
    words: BTreeSet<String>,
    /// Capitalised words past the first, and numbers.
    marks: u32,
    /// A question (its answer is usually the next turn's).
    question: bool,
    /// The episode it was taken from on read (0: a stored summary's line).
    pub episode: u64,
    /// The user's first sentence of a conversation: a fresh summary opens with it.
    lead: bool,
    /// Any sentence will do (a conversation of nothing but small talk): never small talk,
    /// and its social words count.
    loose: bool,
}

impl Line {
    /// A line of `speaker` saying `sentence` (already cleaned) on `day`.
    fn new(text: String, day: Option<String>) -> Line {
        let said = text.split_once(": ").map_or(text.as_str(), |(_, s)| s);
        // A greeting's words say nothing, whatever they are on their own.
        let lower = said.to_lowercase();
        let greeting: BTreeSet<&str> = GREETINGS
            .iter()
            .filter(|g| lower.contains(*g))
            .flat_map(|g| g.split(' '))
            .collect();
        let words: BTreeSet<String> = content_words(said)
            .into_iter()
            .filter(|w| {
                SOCIAL.binary_search(&w.as_str()).is_err() && !greeting.contains(w.as_str())
            })
            .collect();
        // Numbers, and capitalised words past the first (names, places, titles).
        let marks = said
            .split_whitespace()
            .enumerate()
            .filter(|(i, w)| {
                let w = w.trim_matches(|c: char| !c.is_alphanumeric());
                w.chars().any(|c| c.is_ascii_digit())
                    || (*i > 0
                        && w.chars().next().is_some_and(char::is_uppercase)
                        && !is_stopword(&w.to_lowercase())
                        && w != "I")
            })
            .count() as u32;
        Line {
            cost: estimate_tokens(&text) + 2,
            question: said.trim_end().ends_with('?'),
            text,
            day,
            words,
            marks,
            episode: 0,
            lead: false,
            loose: false,
        }
    }

    /// The same line, taken on read from episode `id`.
    pub fn of(mut self, id: u64) -> Line {
        self.episode = id;
        self.lead = false;
        self
    }

    /// The same line when any sentence will do: its social words count, and it always
    /// scores.
    fn loosened(mut self) -> Line {
        let said = self
            .text
            .split_once(": ")
            .map_or(self.text.as_str(), |(_, s)| s);
        self.words = content_words(said).into_iter().collect();
        self.loose = true;
        self
    }

    /// Small talk: fewer than two content words once praise, thanks and greetings are gone.
    pub fn is_small_talk(&self) -> bool {
        !self.loose && self.words.len() < 2
    }
}

/// Each line's score, per square root of its cost (so a long sentence must carry more to
/// win), plus its names and numbers. For a summary, its content words weigh by how often the
/// stretch uses them (1 + ln of the lines that do: what it is mostly about), a question at
/// 0.6; for a context, by their rarity (inverse document frequency over `lines`: what only
/// this sentence says, which a later question may ask about), a question at 0.3. Small talk
/// scores nothing.
fn scores(lines: &[Line], aim: Aim) -> Vec<f64> {
    let mut df: BTreeMap<&str, u32> = BTreeMap::new();
    for l in lines {
        for w in &l.words {
            *df.entry(w.as_str()).or_insert(0) += 1;
        }
    }
    let n = lines.len().max(1) as f64;
    lines
        .iter()
        .map(|l| {
            if l.is_small_talk() {
                return 0.0;
            }
            let info: f64 = l
                .words
                .iter()
                .map(|w| {
                    let d = f64::from(df[w.as_str()]);
                    match aim {
                        // What the stretch is about: its recurring words.
                        Aim::Summary => 1.0 + d.ln(),
                        // What only this sentence says.
                        Aim::Recall => (n / d).ln() + 0.5,
                    }
                })
                .sum::<f64>()
                + if l.loose { 1.0 } else { 0.0 };
            let q = match (l.question, aim) {
                (false, _) => 1.0,
                (true, Aim::Summary) => 0.6,
                (true, Aim::Recall) => 0.3,
            };
            q * (info + 1.5 * f64::from(l.marks)) / f64::from(l.cost.max(1)).sqrt()
        })
        .collect()
}

/// What a choice of lines is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aim {
    /// A summary of a stretch: what it is mostly about.
    Summary,
    /// A context: the specific facts a later question may ask about.
    Recall,
}

/// Day header line of a rendered summary.
fn header(day: &str) -> String {
    format!("[{day}]")
}

/// The lines of `lines` (in conversation order) that fit `room` tokens, rendered: every day
/// (each stretch a header names, or the whole when there are none) gets its best line first
/// when one line a day fits half the room, then a share of the room in proportion to its
/// lines' tokens, filled by score; what the shares leave goes to the best lines left anywhere. Never small talk; no line mostly contained in a chosen one. Day headers
/// are counted in the room. `after_day`: the day the text this continues ended on.
pub fn pick(lines: &[Line], room: u32, after_day: Option<&str>, aim: Aim) -> String {
    pick_for(lines, room, after_day, aim, &[])
}

/// How many of `terms` (the full-text index's terms of a query) a line holds.
pub fn holds(line: &Line, terms: &[String]) -> usize {
    holds_with(line, terms, &mut BTreeMap::new())
}

/// [`holds`] with the index terms of words already seen (`stems`), for many lines.
fn holds_with(
    line: &Line,
    terms: &[String],
    stems: &mut BTreeMap<String, Option<String>>,
) -> usize {
    if terms.is_empty() {
        return 0;
    }
    // The speaker's name (before ": ") and the line's content words.
    let speaker = line.text.split_once(": ").map(|(s, _)| s.to_lowercase());
    let mut held = BTreeSet::new();
    // A word's stem starts as the word does: only words that open like a term are stemmed.
    let opens = |w: &str, t: &str| w.chars().take(2).eq(t.chars().take(2));
    for w in line.words.iter().chain(speaker.iter()) {
        if !terms.iter().any(|t| opens(w, t)) {
            continue;
        }
        let t = stems
            .entry(w.clone())
            .or_insert_with(|| crate::search::term(w));
        if let Some(t) = t
            && terms.contains(t)
        {
            held.insert(t.clone());
        }
    }
    held.len()
}

/// [`pick`] for a context with a query: a line holding `k` of the query's `terms` scores
/// `1 + k` times as much (the lines a later question asks about first).
pub fn pick_for(
    lines: &[Line],
    room: u32,
    after_day: Option<&str>,
    aim: Aim,
    terms: &[String],
) -> String {
    let mut score = scores(lines, aim);
    if !terms.is_empty() {
        let mut stems = BTreeMap::new();
        for (s, l) in score.iter_mut().zip(lines) {
            *s *= 1.0 + holds_with(l, terms, &mut stems) as f64;
        }
    }
    // A line mostly contained in a chosen one (its share of content words in common, in
    // tenths): a summary tolerates less overlap than a context of facts.
    let overlap = match aim {
        Aim::Summary => 6,
        Aim::Recall => 7,
    };
    let mut days: Vec<(Option<&str>, u64)> = Vec::new();
    let mut group_of = Vec::with_capacity(lines.len());
    for l in lines {
        let d = l.day.as_deref();
        if days.last().is_none_or(|(x, _)| *x != d) {
            days.push((d, 0));
        }
        let last = days.len() - 1;
        days[last].1 += u64::from(l.cost);
        group_of.push(last);
    }
    let total: u64 = days.iter().map(|(_, t)| t).sum::<u64>().max(1);
    let header_cost = |g: usize| match days[g].0 {
        Some(d) if Some(d) != after_day || g > 0 => estimate_tokens(&header(d)) + 1,
        _ => 0,
    };
    let mut chosen = vec![false; lines.len()];
    let mut opened = vec![false; days.len()];
    let mut used = 0u32;
    // The lead line first (a fresh summary opens with the user's first request).
    let lead = lines.iter().position(|l| l.lead && !l.is_small_talk());
    let mut order: Vec<usize> = (0..lines.len()).filter(|&i| score[i] > 0.0).collect();
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
    let mut kept: Vec<usize> = Vec::new();
    // Line `i` if it fits `limit` (its day's header counted when it opens the day) and is not
    // mostly contained in a chosen line: its cost, else 0.
    let mut take = |i: usize, spent: u32, limit: u32, chosen: &mut [bool]| -> u32 {
        let g = group_of[i];
        let c = lines[i].cost + if opened[g] { 0 } else { header_cost(g) };
        if spent + c > limit {
            return 0;
        }
        let redundant = kept.iter().any(|&j| {
            let (a, b) = (&lines[i].words, &lines[j].words);
            let smaller = a.len().min(b.len());
            smaller > 0 && a.intersection(b).count() * 10 > smaller * overlap
        });
        if redundant {
            return 0;
        }
        opened[g] = true;
        chosen[i] = true;
        kept.push(i);
        c
    };
    let mut day_spent = vec![0u32; days.len()];
    if let Some(i) = lead {
        let c = take(i, 0, room, &mut chosen);
        used += c;
        day_spent[group_of[i]] += c;
    }
    // Every day its best line first, when one each fits half the room: no stretch of the
    // history goes unrepresented.
    if days.len() > 1 {
        let best: Vec<usize> = (0..days.len())
            .filter_map(|g| order.iter().copied().find(|&i| group_of[i] == g))
            .collect();
        let need: u32 = best
            .iter()
            .map(|&i| lines[i].cost + header_cost(group_of[i]))
            .sum();
        if used + need <= room / 2 {
            for i in best {
                if !chosen[i] {
                    let c = take(i, used, room, &mut chosen);
                    used += c;
                    day_spent[group_of[i]] += c;
                }
            }
        }
    }
    // Each day's share, filled by score.
    for (g, (_, tokens)) in days.iter().enumerate() {
        let share = (u64::from(room) * tokens / total) as u32;
        let mut spent = day_spent[g];
        for &i in order.iter().filter(|&&i| group_of[i] == g) {
            let c = take(i, spent, share, &mut chosen);
            spent += c;
            used += c;
        }
    }
    // The room the shares left, to the best lines anywhere.
    for &i in &order {
        if !chosen[i] {
            used += take(i, used, room, &mut chosen);
        }
    }
    render(lines, &chosen, after_day)
}

/// The chosen lines in order, each day's under its header.
fn render(lines: &[Line], chosen: &[bool], after_day: Option<&str>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut day = after_day.map(str::to_string);
    for (l, _) in lines.iter().zip(chosen).filter(|(_, c)| **c) {
        if let Some(d) = &l.day
            && day.as_deref() != Some(d.as_str())
        {
            out.push(header(d));
            day = Some(d.clone());
        }
        out.push(format!("- {}", l.text));
    }
    out.join("\n")
}

/// The lines of a summary this engine wrote (day headers give the lines after them their
/// day), or `None` when `text` is not made of such lines (a model's prose, a digest).
pub fn parse_lines(text: &str) -> Option<Vec<Line>> {
    let mut out = Vec::new();
    let mut day: Option<String> = None;
    for raw in text.lines() {
        let l = raw.trim();
        if l.is_empty() {
            continue;
        }
        if let Some(d) = l.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
            day = Some(d.to_string());
        } else if let Some(line) = l.strip_prefix("- ") {
            out.push(Line::new(line.to_string(), day.clone()));
        } else {
            return None;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The day the rendered `text` ends on (its last header).
fn last_day(text: &str) -> Option<String> {
    text.lines().rev().find_map(|l| {
        l.trim()
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .map(str::to_string)
    })
}

/// The candidate lines of `conversation`: each sentence of a user's or assistant's message
/// with its speaker, its relative dates resolved against the message's time, and its day.
/// Strict first (prose of 4–50 words, see [`is_prose`]); when that leaves nothing, any
/// sentence.
pub fn candidates(conversation: &[Message], strict: bool) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    let mut lead = true;
    // A time three or more messages share is the moment a batch without times of its own was
    // stored (an import stamps its arrival), not when they were said: no day, nothing
    // resolved against it.
    let mut shared: BTreeMap<i64, u32> = BTreeMap::new();
    for t in conversation.iter().filter_map(|m| m.timestamp_ms) {
        *shared.entry(t).or_insert(0) += 1;
    }
    for m in conversation {
        if matches!(m.role, Role::System | Role::Tool) {
            continue;
        }
        let said_at =
            crate::dates::known(m.timestamp_ms).filter(|t| shared.get(t).is_none_or(|&n| n < 3));
        let day = said_at.map(|t| crate::dates::Day::of_ms(t).render());
        for s in sentences(&m.content) {
            let len = s.split_whitespace().count();
            if strict && (!(4..=50).contains(&len) || !is_prose(&s)) {
                continue;
            }
            let said = crate::dates::resolve(&s, said_at);
            let mut line = Line::new(format!("{}: {said}", m.who()), day.clone());
            if m.role == Role::User && lead {
                line.lead = true;
                lead = false;
            }
            out.push(line);
        }
    }
    out
}

/// Summarize `conversation` after an earlier summary of this engine (`previous`), in
/// `max_tokens` for what it adds. The new part's lines take [`KEEP_RATE`] of the
/// conversation's tokens (at least [`MIN_NEW_TOKENS`], at most `max_tokens`), chosen by
/// [`pick`]; the earlier lines stay as they are, so each stretch of a long chat keeps its
/// share. With no conversation, `previous` itself is cut to `max_tokens` by [`pick`] (the
/// second level's merge). Returns an empty string when there is nothing to select.
pub fn summarize(
    conversation: &[Message],
    previous: Option<&str>,
    max_tokens: u32,
    aim: Aim,
) -> String {
    let previous = previous.map(str::trim).filter(|p| !p.is_empty());
    if conversation.is_empty() {
        let Some(prev) = previous else {
            return String::new();
        };
        return match parse_lines(prev) {
            Some(lines) => pick(&lines, max_tokens, None, aim),
            None => prev.to_string(),
        };
    }
    let source: u32 = conversation
        .iter()
        .filter(|m| !matches!(m.role, Role::System | Role::Tool))
        .map(|m| estimate_tokens(&m.content))
        .sum();
    let room = ((f64::from(source) * KEEP_RATE) as u32)
        .max(MIN_NEW_TOKENS)
        .min(max_tokens.max(1));
    let after = previous.and_then(last_day);
    let mut fresh = candidates(conversation, true);
    if previous.is_some() {
        fresh.iter_mut().for_each(|l| l.lead = false);
    }
    // The room is the lines': the header of the day they open with is not taken from it.
    let opening = fresh
        .first()
        .and_then(|l| l.day.as_deref())
        .filter(|d| Some(*d) != after.as_deref())
        .map_or(0, |d| estimate_tokens(&header(d)) + 1);
    let mut added = pick(&fresh, room + opening, after.as_deref(), aim);
    if added.is_empty() {
        // Nothing but small talk or debris: the best sentence there is, so the summary is
        // never empty while there was text.
        let all: Vec<Line> = candidates(conversation, false)
            .into_iter()
            .map(Line::loosened)
            .collect();
        // At least the best line, whatever its length.
        let widest = all.iter().map(|l| l.cost).max().unwrap_or(0);
        added = pick(&all, room.max(widest + 8), after.as_deref(), aim);
    }
    match previous {
        Some(prev) if !added.is_empty() => format!("{prev}\n{added}"),
        Some(prev) => prev.to_string(),
        None => added,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_word_lists_are_sorted_for_their_binary_searches() {
        for list in [super::STOPWORDS, super::SOCIAL] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
    }

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
    fn a_query_puts_the_lines_that_hold_its_words_first() {
        let lines = candidates(&conv(), true);
        let target = lines
            .iter()
            .find(|l| l.text.contains("matching package"))
            .unwrap();
        // Room for the opening request (a context's lines start with it) and one more line.
        let room = lines[0].cost + target.cost + 6;
        let terms = crate::search::query("Which package does PostGIS need?");
        let asked = pick_for(&lines, room, None, Aim::Recall, &terms);
        assert!(
            asked.contains("PostGIS needs the matching package"),
            "{asked}"
        );
        let plain = pick(&lines, room, None, Aim::Recall);
        assert!(
            !plain.contains("PostGIS needs the matching package"),
            "{plain}"
        );
        assert_eq!(
            pick_for(&lines, room, None, Aim::Recall, &[]),
            pick(&lines, room, None, Aim::Recall)
        );
        let line = lines
            .iter()
            .find(|l| l.text.contains("matching package"))
            .unwrap();
        assert_eq!(holds(line, &terms), 3, "postgi, need, packag");
    }

    #[test]
    fn selects_verbatim_sentences_in_order() {
        let s = summarize(&conv(), None, 500, Aim::Summary);
        let lines: Vec<&str> = s.lines().collect();
        assert!(!lines.is_empty(), "{s}");
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
        let s = summarize(&conv(), None, 40, Aim::Summary);
        assert!(estimate_tokens(&s) <= 40, "{s}");
        assert!(s.lines().count() >= 2, "{s}");
        assert_eq!(s, summarize(&conv(), None, 40, Aim::Summary));
    }

    #[test]
    fn update_keeps_earlier_lines_competing() {
        let first = summarize(&conv()[..2], None, 500, Aim::Summary);
        let more = vec![Message::new(
            Role::User,
            "After the upgrade the PostGIS functions fail with a version mismatch error on every query.",
        )];
        let updated = summarize(&more, Some(&first), 500, Aim::Summary);
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
        let s = summarize(&conv, None, 500, Aim::Summary);
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
        // Greetings are small talk, whatever their words.
        for greeting in ["Long time no talk.", "Hey, how have you been lately?"] {
            let l = candidates(&[Message::new(Role::User, greeting)], false);
            assert!(l.iter().all(Line::is_small_talk), "{greeting}");
        }
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
        let s = summarize(&conv, None, 500, Aim::Summary);
        assert!(s.contains("- #Person1#: Could you book"), "{s}");
        assert!(s.contains("- #Person2#: The meeting room is booked"), "{s}");
    }

    #[test]
    fn a_batch_stamped_at_once_has_no_day_but_messages_said_apart_do() {
        let said = |ms: [i64; 3]| {
            let texts = [
                "We moved the launch review to the big room yesterday afternoon.",
                "The launch review needs the new budget figures from finance.",
                "Finance sends the budget figures to the launch team on Friday.",
            ];
            texts
                .iter()
                .zip(ms)
                .map(|(t, at)| Message::new(Role::User, *t).at(Some(at)))
                .collect::<Vec<_>>()
        };
        // Stored together without times of their own: one arrival stamp for all.
        let s = summarize(&said([1_683_554_160_000; 3]), None, 500, Aim::Summary);
        assert!(!s.contains('[') && s.contains("yesterday afternoon"), "{s}");
        // Said a minute apart: dated, and "yesterday" resolved against the time said.
        let apart = [1_683_554_160_000, 1_683_554_220_000, 1_683_554_280_000];
        let s = summarize(&said(apart), None, 500, Aim::Summary);
        assert!(s.starts_with("[8 May 2023]\n"), "{s}");
        assert!(s.contains("yesterday (= 7 May 2023)"), "{s}");
    }

    #[test]
    fn a_summary_keeps_what_the_stretch_is_about_and_a_context_what_only_one_line_says() {
        let conv: Vec<Message> = [
            "The billing migration moves the billing tables to the new cluster.",
            "The billing tables need a migration window on the new cluster.",
            "After the migration the billing cluster serves the tables again.",
            "Priya adopted a parrot named Kiwi from the Elm shelter.",
        ]
        .iter()
        .map(|t| Message::new(Role::Assistant, *t))
        .collect();
        let lines = candidates(&conv, true);
        let one = lines.iter().map(|l| l.cost).max().unwrap();
        let summary = pick(&lines, one, None, Aim::Summary);
        let recall = pick(&lines, one, None, Aim::Recall);
        assert!(summary.contains("billing"), "{summary}");
        assert!(recall.contains("Kiwi"), "{recall}");
    }

    #[test]
    fn every_day_gets_its_best_line_when_one_a_day_fits() {
        let day = 86_400_000i64;
        let start = 1_683_554_160_000i64;
        // A quiet first day whose words recur nowhere (a summary rates it low), then a long
        // second day about the office team that outscores it line by line.
        let mut conv = vec![
            Message::new(
                Role::Assistant,
                "It was a quiet and rather ordinary afternoon at home with tea.",
            )
            .at(Some(start)),
        ];
        let done = [
            "booked flights",
            "fixed payroll",
            "moved desks",
            "renewed contracts",
            "answered invoices",
            "replaced projectors",
            "ordered laptops",
            "migrated servers",
            "signed leases",
            "hired tutors",
            "scheduled audits",
            "upgraded databases",
        ];
        for (i, d) in done.iter().enumerate() {
            conv.push(
                Message::new(Role::Assistant, format!("The office team {d} this week."))
                    .at(Some(start + day + i as i64 * 60_000)),
            );
        }
        let lines = candidates(&conv, true);
        let room = lines.iter().map(|l| l.cost).max().unwrap() * 7;
        let s = pick(&lines, room, None, Aim::Summary);
        assert!(s.contains("[8 May 2023]") && s.contains("quiet"), "{s}");
        assert!(s.contains("[9 May 2023]"), "{s}");
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
            Aim::Summary,
        );
        assert_eq!(s, "- User: hi\n- Assistant: Hello there");
    }
}
