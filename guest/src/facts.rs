//! Facts that change: what a person says about themselves — where they live, where they work,
//! their number, their manager, a partner, a pet, a car, a regular day — found in what each
//! speaker says, deterministically, and laid on a time line: a later value of the same fact
//! supersedes the earlier one, a withdrawal ends it, and nothing is forgotten (each value
//! keeps when it was said and the episode that said it).
//!
//! A statement is found in a sentence in the first person ("I", "we", "my", "our") that names
//! what the fact is about (its cue words: `moved to`, `work at`, `number`, `report to`,
//! `partner`, `dog`, `drive`, a weekday beside an activity, …) and a value of the fact's shape
//! (a capitalised place, organisation or name; a phone number; a car's colour and make; a
//! weekday). A sentence that ends a fact (`sold`, `no longer`, `anymore`, `quit`, `passed
//! away`, `gave away`, `cancelled`, `broke up`, …) ends the fact it names, or the fact of the
//! speaker whose value it names ("Biscuit passed away"). The words of change themselves
//! (`moved to`, `new job at`, `new number`, `switched to`, `now`, `instead`, `from now on`,
//! `reassigned`) need no special case: a later value is a change.

use std::collections::BTreeMap;

/// What a statement does to a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// The fact holds with this value (from now on).
    Holds,
    /// The fact ends (its value no longer holds).
    Ends,
}

/// One statement found in a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Said {
    /// What the fact is (`lives in`, `works at`, …); empty for an ending that names only a
    /// value ("Biscuit passed away"): it ends whichever of the speaker's facts has it.
    pub key: String,
    /// The value (empty for an ending that names only the fact: "I sold my car").
    pub value: String,
    /// Holds or ends.
    pub act: Act,
    /// The sentence, as said (for an ending: what the context quotes).
    pub sentence: String,
}

/// A statement on the time line: who said it, when, where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Whose fact it is (the speaker's name, or their role).
    pub who: String,
    /// The statement.
    pub said: Said,
    /// The episode that said it.
    pub episode: u64,
    /// When, ms since the epoch, if known.
    pub at_ms: Option<i64>,
}

/// One value a fact had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The value.
    pub value: String,
    /// When it was first said (ms), if known.
    pub from_ms: Option<i64>,
    /// The episode that said it.
    pub episode: u64,
}

/// A fact's time line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fact {
    /// Whose.
    pub who: String,
    /// What.
    pub key: String,
    /// Its values, oldest first; the last is current unless `ended`.
    pub values: Vec<Span>,
    /// It ended: when (ms, if known), in which episode, and the sentence that said so.
    pub ended: Option<(Option<i64>, u64, String)>,
}

impl Fact {
    /// The value that holds now (`None`: it ended, or it has none).
    pub fn current(&self) -> Option<&Span> {
        if self.ended.is_some() {
            None
        } else {
            self.values.last()
        }
    }
}

/// The kinds of fact, each with its cue words.
struct Kind {
    key: &'static str,
    /// Any of these (in the lower-case sentence) makes the sentence about this fact.
    cues: &'static [&'static str],
    /// The shape of its value.
    shape: Shape,
    /// Words after which the value comes (the first value after one is taken first).
    before: &'static [&'static str],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A capitalised place or organisation (one to four words).
    Proper,
    /// A person's or an animal's name.
    Name,
    /// A phone number (seven digits or more).
    Phone,
    /// A car: up to two lower-case words (a colour) and a capitalised make.
    Car,
}

const KINDS: &[Kind] = &[
    Kind {
        key: "phone number",
        cues: &["number", "phone", "reach me", "call me", "mobile", "cell"],
        shape: Shape::Phone,
        before: &[],
    },
    Kind {
        key: "lives in",
        cues: &[
            "live in",
            "living in",
            "lives in",
            "moved to",
            "move to",
            "moving to",
            "relocated",
            "relocating",
            "based in",
            "settled in",
            "home is",
            "home for",
            "new place",
            "new flat",
            "new apartment",
            "new house",
            "we're in",
            "we are in",
            "i'm in",
            "i am in",
            "back in",
        ],
        shape: Shape::Proper,
        before: &[
            "live in",
            "living in",
            "moved to",
            "move to",
            "moving to",
            "relocated to",
            "relocating to",
            "based in",
            "settled in",
            "into",
            "is",
            "in",
            "to",
        ],
    },
    Kind {
        key: "works at",
        cues: &[
            "work at",
            "work for",
            "working at",
            "working for",
            "job at",
            "job with",
            "joined",
            "started at",
            "hired",
            "employer",
            " at ",
            "position at",
        ],
        shape: Shape::Proper,
        before: &[
            "work at",
            "work for",
            "working at",
            "working for",
            "job at",
            "job with",
            "joined",
            "started at",
            "position at",
            "hired by",
            "at",
            "for",
        ],
    },
    Kind {
        key: "manager",
        cues: &[
            "manager",
            "boss",
            "report to",
            "reporting to",
            "supervisor",
            "team lead",
        ],
        shape: Shape::Name,
        before: &[
            "report to",
            "reporting to",
            "manager is",
            "boss is",
            "supervisor is",
            "is",
        ],
    },
    Kind {
        key: "partner",
        cues: &[
            "partner",
            "boyfriend",
            "girlfriend",
            "husband",
            "wife",
            "fiancé",
            "fiance",
            "seeing",
            "dating",
            "together",
            "married",
            "broke up",
            "split up",
            "divorced",
        ],
        shape: Shape::Name,
        before: &["partner", "seeing", "dating", "with", "married"],
    },
    Kind {
        key: "pet",
        cues: &[
            "dog", "cat", "puppy", "kitten", "pet", "rabbit", "hamster", "parrot", "rescue",
            "adopted",
        ],
        shape: Shape::Name,
        before: &["named", "called", "cat", "dog", "puppy", "kitten"],
    },
    Kind {
        key: "car",
        cues: &[
            "car",
            "drive a",
            "drive an",
            "driving a",
            "bought a",
            "traded",
            "vehicle",
        ],
        shape: Shape::Car,
        before: &[
            "for a",
            "drive a",
            "drive an",
            "driving a",
            "bought a",
            "a",
            "an",
            "the",
        ],
    },
];

/// Activities that make a weekday a regular day.
const ACTIVITIES: &[&str] = &[
    "climbing",
    "yoga",
    "gym",
    "swimming",
    "running",
    "football",
    "soccer",
    "tennis",
    "choir",
    "pottery",
    "dance",
    "dancing",
    "piano",
    "guitar",
    "chess",
    "book club",
    "class",
    "practice",
    "training",
    "lesson",
    "lessons",
];

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Words that end a fact.
const ENDINGS: &[&str] = &[
    "sold",
    "no longer",
    "anymore",
    "any more",
    "quit",
    "passed away",
    "died",
    "gave away",
    "gave him away",
    "gave her away",
    "given away",
    "rehomed",
    "cancelled",
    "canceled",
    "broke up",
    "split up",
    "divorced",
    "handed in my notice",
    "resigned",
    "got rid of",
    "laid off",
    "stopped going",
    "away to",
];

/// Words of the first person: the sentence is about the speaker.
const FIRST_PERSON: &[&str] = &[
    "i", "i'm", "i've", "i'd", "i'll", "we", "we're", "we've", "my", "our", "me", "us",
];

/// Capitalised words that are not values.
const NOT_VALUES: &[&str] = &[
    "I",
    "I'm",
    "I've",
    "I'd",
    "I'll",
    "We",
    "We're",
    "My",
    "Our",
    "The",
    "A",
    "An",
    "It",
    "It's",
    "He",
    "She",
    "They",
    "This",
    "That",
    "Big",
    "New",
    "Please",
    "Just",
    "Thanks",
    "From",
    "So",
    "And",
    "But",
    "Oh",
    "Yes",
    "No",
    "Now",
    "Also",
    "Then",
    "Finally",
    "Last",
    "Next",
    "Home",
    "Climbing",
    "Work",
    "Today",
    "Tomorrow",
    "Yesterday",
];

/// The sentences of `text`.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.split(['.', '!', '?', ';', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The words of a sentence with their byte offsets, punctuation trimmed (keeping `'`).
fn words(s: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut at = 0;
    for w in s.split(' ') {
        let trimmed = w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '+');
        if !trimmed.is_empty() {
            let off = at + w.find(trimmed).unwrap_or(0);
            out.push((off, trimmed));
        }
        at += w.len() + 1;
    }
    out
}

fn capitalised(w: &str) -> bool {
    w.chars().next().is_some_and(char::is_uppercase)
        && !NOT_VALUES.contains(&w)
        && !WEEKDAYS.contains(&w.to_lowercase().as_str())
        && !crate::dates::is_calendar_word(w)
}

/// A run of capitalised words starting at word `i` (up to `max` words; "of", "de", "van" may
/// join two), as one value.
fn proper_at(ws: &[(usize, &str)], i: usize, max: usize) -> Option<String> {
    if !capitalised(ws.get(i)?.1) {
        return None;
    }
    let mut run = vec![ws[i].1];
    let mut j = i + 1;
    while j < ws.len() && run.len() < max {
        let w = ws[j].1;
        let joins = ["of", "de", "van", "von", "la", "le"].contains(&w)
            && ws.get(j + 1).is_some_and(|n| capitalised(n.1));
        if !capitalised(w) && !joins {
            break;
        }
        run.push(w);
        j += 1;
    }
    let v = run.join(" ");
    Some(v.trim_end_matches("'s").to_string())
}

/// A phone number in `s`: a run of digits, spaces, `+`, `-`, `(`, `)` holding seven digits or
/// more.
fn phone(s: &str) -> Option<String> {
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() || b[i] == '+' || b[i] == '(' {
            let mut j = i;
            let mut digits = 0;
            while j < b.len() && (b[j].is_ascii_digit() || " +-()".contains(b[j])) {
                digits += usize::from(b[j].is_ascii_digit());
                j += 1;
            }
            if digits >= 7 {
                return Some(b[i..j].iter().collect::<String>().trim().to_string());
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    None
}

/// A car in the words after `i`: up to two lower-case words and a capitalised make (and a
/// capitalised model after it), "blue Skoda", "Toyota Corolla".
fn car_at(ws: &[(usize, &str)], i: usize) -> Option<String> {
    let mut run = Vec::new();
    let mut j = i;
    while j < ws.len() && run.len() < 4 {
        let w = ws[j].1;
        if capitalised(w) {
            run.push(w);
            if ws.get(j + 1).is_some_and(|n| capitalised(n.1)) {
                run.push(ws[j + 1].1);
            }
            return Some(run.join(" "));
        }
        if w.chars().all(char::is_lowercase)
            && run.len() < 2
            && !["car", "new", "old", "one", "used"].contains(&w)
        {
            run.push(w);
            j += 1;
            continue;
        }
        if ["new", "old", "used"].contains(&w) {
            j += 1;
            continue;
        }
        return None;
    }
    None
}

/// The first value of `kind`'s shape in sentence `s` after one of its `before` words (or
/// anywhere, when none is followed by one), not the speaker's own name.
fn value_of(kind: &Kind, s: &str, who: &str) -> Option<String> {
    let ws = words(s);
    let lower: Vec<String> = ws.iter().map(|(_, w)| w.to_lowercase()).collect();
    let not_who = |v: &String| !v.eq_ignore_ascii_case(who);
    match kind.shape {
        Shape::Phone => phone(s),
        Shape::Car => {
            for b in kind.before {
                let bw: Vec<String> = b.split(' ').map(str::to_string).collect();
                for i in 0..lower.len() {
                    if lower[i..].starts_with(&bw)
                        && let Some(v) = car_at(&ws, i + bw.len())
                    {
                        return Some(v);
                    }
                }
            }
            None
        }
        Shape::Proper | Shape::Name => {
            let max = if kind.shape == Shape::Name { 2 } else { 4 };
            for b in kind.before {
                let bw: Vec<String> = b.split(' ').map(str::to_string).collect();
                for i in 0..lower.len() {
                    if lower[i..].starts_with(&bw)
                        && let Some(v) = proper_at(&ws, i + bw.len(), max).filter(not_who)
                    {
                        return Some(v);
                    }
                }
            }
            // A name anywhere (but the sentence's first word when it is a plain opener).
            (0..ws.len()).find_map(|i| proper_at(&ws, i, max).filter(not_who))
        }
    }
}

/// Whether sentence `l` (lower case) is in the first person.
fn first_person(l: &str) -> bool {
    l.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .any(|w| FIRST_PERSON.contains(&w))
}

/// The statements of facts in what `who` said.
pub fn said(who: &str, text: &str) -> Vec<Said> {
    let mut out = Vec::new();
    for s in sentences(text) {
        let l = s.to_lowercase();
        let ends = ENDINGS.iter().any(|e| l.contains(e));
        let mine = first_person(&l);
        // A regular day: a weekday beside an activity.
        // A regular day: a weekday beside an activity, said of oneself or of the activity
        // ("Climbing moved to Thursday").
        if let Some(day) = WEEKDAYS.iter().find(|d| l.contains(*d))
            && let Some(what) = ACTIVITIES.iter().find(|a| l.contains(*a))
            && (mine || l.starts_with(what))
        {
            let key = format!("{what} day");
            let value = format!("{}{}", day[..1].to_uppercase(), &day[1..]);
            out.push(Said {
                key,
                value,
                act: if ends { Act::Ends } else { Act::Holds },
                sentence: s.to_string(),
            });
            continue;
        }
        let mut found = false;
        for kind in KINDS {
            if !kind.cues.iter().any(|c| l.contains(c)) {
                continue;
            }
            // Working "at" a place needs a job word, or the first person at a capitalised
            // organisation with "now" ("I'm at Globex now").
            if kind.key == "works at"
                && l.contains(" at ")
                && !kind
                    .cues
                    .iter()
                    .filter(|c| **c != " at ")
                    .any(|c| l.contains(c))
                && !(l.contains(" now")
                    || l.contains("job")
                    || l.contains("analyst")
                    || l.contains("engineer"))
            {
                continue;
            }
            let value = value_of(kind, s, who);
            if ends && (mine || value.is_some()) {
                out.push(Said {
                    key: kind.key.to_string(),
                    value: value.unwrap_or_default(),
                    act: Act::Ends,
                    sentence: s.to_string(),
                });
                found = true;
                break;
            }
            // A number is the speaker's when they give it ("New number: …").
            if !mine && kind.shape != Shape::Phone {
                continue;
            }
            if let Some(value) = value {
                out.push(Said {
                    key: kind.key.to_string(),
                    value,
                    act: Act::Holds,
                    sentence: s.to_string(),
                });
                found = true;
                break;
            }
        }
        // An ending that names only a value: "Biscuit passed away".
        if !found && ends {
            let ws = words(s);
            if let Some(v) = (0..ws.len()).find_map(|i| proper_at(&ws, i, 2)) {
                out.push(Said {
                    key: String::new(),
                    value: v,
                    act: Act::Ends,
                    sentence: s.to_string(),
                });
            }
        }
    }
    out
}

/// Whether `named` names `value`: every word of it is one of the value's (any case).
fn names(value: &str, named: &str) -> bool {
    let v: Vec<String> = value.split_whitespace().map(str::to_lowercase).collect();
    let n: Vec<String> = named.split_whitespace().map(str::to_lowercase).collect();
    !n.is_empty() && n.iter().all(|w| v.contains(w))
}

/// The facts' time lines from `events` (in the order they were said).
pub fn timeline(events: &[Event]) -> Vec<Fact> {
    let mut facts: BTreeMap<(String, String), Fact> = BTreeMap::new();
    for e in events {
        let mut key = e.said.key.clone();
        if key.is_empty() {
            // The speaker's fact whose current value this names ("the Skoda" names "blue
            // Skoda").
            match facts.values().find(|f| {
                f.who == e.who && f.current().is_some_and(|c| names(&c.value, &e.said.value))
            }) {
                Some(f) => key = f.key.clone(),
                None => continue,
            }
        }
        let f = facts
            .entry((e.who.clone(), key.clone()))
            .or_insert_with(|| Fact {
                who: e.who.clone(),
                key: key.clone(),
                values: Vec::new(),
                ended: None,
            });
        match e.said.act {
            Act::Holds => {
                let same = f
                    .current()
                    .is_some_and(|c| c.value.eq_ignore_ascii_case(&e.said.value));
                if !same {
                    f.values.push(Span {
                        value: e.said.value.clone(),
                        from_ms: e.at_ms,
                        episode: e.episode,
                    });
                    f.ended = None;
                }
            }
            Act::Ends => {
                // An ending of a value the fact never had (or of another value than the
                // current one) still ends the fact; the value is kept as its last.
                if !e.said.value.is_empty()
                    && !f
                        .values
                        .last()
                        .is_some_and(|c| names(&c.value, &e.said.value))
                {
                    f.values.push(Span {
                        value: e.said.value.clone(),
                        from_ms: None,
                        episode: e.episode,
                    });
                }
                if !f.values.is_empty() {
                    f.ended = Some((e.at_ms, e.episode, e.said.sentence.clone()));
                }
            }
        }
    }
    facts
        .into_values()
        .filter(|f| !f.values.is_empty())
        .collect()
}

/// A time as a day (`14 Apr 2025`).
fn day(ms: Option<i64>) -> Option<String> {
    crate::dates::known(ms).map(|t| crate::dates::Day::of_ms(t).render())
}

/// One fact as a line: the current value first, then what it replaced, dated: `Robin lives
/// in: Lyon (since 14 Apr 2025; before: Porto)`, `Robin's car: none since 3 May 2025 (sold
/// the blue Skoda)`.
pub fn line(f: &Fact) -> String {
    let earlier = |upto: usize| -> String {
        f.values[..upto]
            .iter()
            .rev()
            .map(|s| s.value.as_str())
            .collect::<Vec<_>>()
            .join(", then before: ")
    };
    match (&f.ended, f.values.last()) {
        (Some((at, _, sentence)), _) => {
            let since = day(*at).map(|d| format!(" since {d}")).unwrap_or_default();
            format!("{} {}: none{since} ({})", f.who, f.key, sentence.trim())
        }
        (None, Some(now)) => {
            let mut notes = Vec::new();
            if f.values.len() > 1
                && let Some(d) = day(now.from_ms)
            {
                notes.push(format!("since {d}"));
            }
            if f.values.len() > 1 {
                notes.push(format!("before: {}", earlier(f.values.len() - 1)));
            }
            if notes.is_empty() {
                format!("{} {}: {}", f.who, f.key, now.value)
            } else {
                format!("{} {}: {} ({})", f.who, f.key, now.value, notes.join("; "))
            }
        }
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(who: &str, text: &str) -> Vec<(String, String, Act)> {
        said(who, text)
            .into_iter()
            .map(|s| (s.key, s.value, s.act))
            .collect()
    }

    fn holds(k: &str, v: &str) -> (String, String, Act) {
        (k.to_string(), v.to_string(), Act::Holds)
    }

    fn ends(k: &str, v: &str) -> (String, String, Act) {
        (k.to_string(), v.to_string(), Act::Ends)
    }

    #[test]
    fn statements_and_changes_in_ordinary_words() {
        let cases: &[(&str, (String, String, Act))] = &[
            ("I live in Porto.", holds("lives in", "Porto")),
            (
                "Big news: we moved to Lyon last weekend!",
                holds("lives in", "Lyon"),
            ),
            (
                "I've relocated to Ghent, the flat is still full of boxes.",
                holds("lives in", "Ghent"),
            ),
            (
                "Home for me is Bergen these days.",
                holds("lives in", "Bergen"),
            ),
            ("I work at Northwind.", holds("works at", "Northwind")),
            (
                "I started a new job at Umbrella Labs this week.",
                holds("works at", "Umbrella Labs"),
            ),
            (
                "I switched jobs, I'm at Globex now.",
                holds("works at", "Globex"),
            ),
            (
                "My number is 0612 555 014.",
                holds("phone number", "0612 555 014"),
            ),
            (
                "New number: 0798 555 271, the old one is dead.",
                holds("phone number", "0798 555 271"),
            ),
            (
                "I got reassigned, Ana Ruiz is my manager now.",
                holds("manager", "Ana Ruiz"),
            ),
            ("I report to Tom Becker.", holds("manager", "Tom Becker")),
            ("My partner Jonas is a nurse.", holds("partner", "Jonas")),
            ("I have a dog named Biscuit.", holds("pet", "Biscuit")),
            ("We adopted a puppy called Milo.", holds("pet", "Milo")),
            ("I drive a blue Skoda.", holds("car", "blue Skoda")),
            (
                "I traded in the blue Skoda for a red Fiat.",
                holds("car", "red Fiat"),
            ),
            (
                "I go climbing every Tuesday.",
                holds("climbing day", "Tuesday"),
            ),
            (
                "Climbing moved to Thursday from now on.",
                holds("climbing day", "Thursday"),
            ),
            (
                "I sold the grey Volvo, I take the bus now.",
                ends("", "Volvo"),
            ),
            (
                "I don't have a car anymore, the green Mini is gone.",
                ends("car", "green Mini"),
            ),
            (
                "I quit my job at Initech, taking a break for a while.",
                ends("works at", "Initech"),
            ),
            ("Jonas and I broke up last month.", ends("partner", "Jonas")),
            (
                "Biscuit passed away last week, I miss him.",
                ends("", "Biscuit"),
            ),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter_map(|(text, want)| {
                let got = keys("Robin", text);
                (got.first() != Some(want)).then(|| format!("{text}: {got:?}, not {want:?}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(keys("Robin", "The weather has been grey all week.").is_empty());
        assert!(
            keys("Robin", "Sofia moved to Paris.").is_empty(),
            "another person's move"
        );
    }

    fn ev(episode: u64, text: &str) -> Vec<Event> {
        said("Robin", text)
            .into_iter()
            .map(|s| Event {
                who: "Robin".into(),
                said: s,
                episode,
                at_ms: Some(1_735_689_600_000 + episode as i64 * 86_400_000),
            })
            .collect()
    }

    #[test]
    fn a_later_value_supersedes_and_an_ending_ends() {
        let mut events = Vec::new();
        for (i, t) in [
            "I live in Porto.",
            "I drive a blue Skoda.",
            "I have a dog named Biscuit.",
            "We moved to Lyon last weekend!",
            "I live in Lyon, it's lovely.",
            "I sold the blue Skoda.",
            "Biscuit passed away last week.",
        ]
        .iter()
        .enumerate()
        {
            events.extend(ev(i as u64 + 1, t));
        }
        let facts = timeline(&events);
        let lives = facts.iter().find(|f| f.key == "lives in").unwrap();
        assert_eq!(
            lives.values.len(),
            2,
            "the same value said again is no change"
        );
        assert_eq!(lives.current().unwrap().value, "Lyon");
        assert_eq!(
            line(lives),
            "Robin lives in: Lyon (since 5 January 2025; before: Porto)"
        );
        let car = facts.iter().find(|f| f.key == "car").unwrap();
        assert!(car.current().is_none());
        assert_eq!(
            line(car),
            "Robin car: none since 7 January 2025 (I sold the blue Skoda)"
        );
        let pet = facts.iter().find(|f| f.key == "pet").unwrap();
        assert!(pet.ended.is_some(), "ended by naming its value");
    }
}
