//! `abridge bench facts [TEMPLATES.json]`: whether a context shows a person's facts as they
//! are now, on generated dated chats in which people state facts (where they live, where they
//! work, their number, their manager, a partner, a pet, a car, a regular day), change most of
//! them one to three times in ordinary words, and withdraw some, between long stretches of
//! small talk.
//!
//! Each chat is imported as a user would (`abridge summarize` of its JSON lines into a fresh
//! database) and the context is asked for at 1,000 and 2,000 tokens, without a query and with
//! each fact's question as the query. For every fact, the context's text is checked for its
//! values (whole words, any case):
//!
//! * **current**: a fact that still holds has its current value in the context;
//! * **obsolete only**: an earlier value is there and the current one is not (or, for a fact
//!   withdrawn, the withdrawal is not);
//! * **obsolete last**: an earlier value comes after the current one on a line that does not
//!   mark it as earlier (`before`, `previously`, `used to`, …);
//! * **withdrawn kept**: a withdrawn fact's last value is in the context on a line that says
//!   it ended (`sold`, `passed away`, `broke up`, `none`, …).
//!
//! Beside abridge: the most recent turns within the budget, and (a reference that knows the
//! question) the turns that best match it by BM25.
//!
//! The chats come from templates: every fact's values, its question, and the phrasings that
//! state, change and withdraw it, and the small talk between. The built-in set is one wording;
//! `abridge bench facts my-templates.json` runs another (the same JSON shape as
//! `--print-templates` writes), so a result is never tuned to one wording.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, anyhow};
use serde::{Deserialize, Serialize};

use super::bench_context::{Bm25, Conversation, cut};
use super::{Exit, Failure, Settings};

/// The budgets measured.
const BUDGETS: [u32; 2] = [1000, 2000];

/// Turns of a generated chat.
const TURNS: usize = 700;

/// What a set of chats is written from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Templates {
    /// The facts a person states and changes.
    pub facts: Vec<FactTemplate>,
    /// What the person says between facts (`{name}`: another person's name).
    pub small_talk: Vec<String>,
    /// What the other side answers to small talk.
    pub replies: Vec<String>,
    /// What the other side answers to a change or a withdrawal (`{v}`: the new value).
    pub acknowledgements: Vec<String>,
    /// Names of people talked about in small talk.
    pub names: Vec<String>,
}

/// One kind of fact.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FactTemplate {
    /// What it is, for the report (`lives in`).
    pub key: String,
    /// The question about it now (`{who}`: whose fact it is).
    pub question: String,
    /// Values it takes (each chat draws its own sequence, no value twice).
    pub values: Vec<String>,
    /// A first statement (`{v}`: the value).
    pub state: Vec<String>,
    /// A change to a new value (`{v}`: the new value, `{old}`: the one it replaces).
    pub change: Vec<String>,
    /// The fact ending (`{v}`: the value that ends); empty: it is never withdrawn.
    #[serde(default)]
    pub withdraw: Vec<String>,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The built-in wording.
pub fn built_in() -> Templates {
    let fact = |key: &str,
                question: &str,
                values: &[&str],
                state: &[&str],
                change: &[&str],
                withdraw: &[&str]| {
        FactTemplate {
            key: key.into(),
            question: question.into(),
            values: strs(values),
            state: strs(state),
            change: strs(change),
            withdraw: strs(withdraw),
        }
    };
    Templates {
        facts: vec![
            fact(
                "lives in",
                "Where does {who} live now?",
                &[
                    "Porto", "Lyon", "Ghent", "Tallinn", "Bergen", "Krakow", "Valencia", "Leeds",
                    "Graz", "Turku", "Split", "Utrecht", "Aarhus", "Bilbao",
                ],
                &[
                    "I live in {v}.",
                    "Home for me is {v} these days.",
                    "I've been living in {v} for a while now.",
                ],
                &[
                    "Big news: we moved to {v} last weekend!",
                    "I've relocated to {v}, the flat is still full of boxes.",
                    "We finally left {old}, we're in {v} now.",
                ],
                &[],
            ),
            fact(
                "works at",
                "Where does {who} work now?",
                &[
                    "Northwind",
                    "Globex",
                    "Initech",
                    "Umbrella Labs",
                    "Acme Freight",
                    "Blue Harbor",
                    "Vandelay Imports",
                    "Stark Logistics",
                    "Pied Piper",
                    "Hooli",
                    "Wayne Health",
                    "Soylent Foods",
                ],
                &[
                    "I work at {v}.",
                    "I'm an analyst at {v}.",
                    "My job is at {v}, mostly data work.",
                ],
                &[
                    "I started a new job at {v} this week.",
                    "I switched jobs, I'm at {v} now.",
                    "I left {old} and joined {v}.",
                ],
                &[
                    "I quit my job at {v}, taking a break for a while.",
                    "I'm no longer at {v}, I handed in my notice.",
                ],
            ),
            fact(
                "phone number",
                "What is {who}'s phone number now?",
                &[
                    "0612 555 014",
                    "0798 555 271",
                    "0655 555 390",
                    "0730 555 842",
                    "0687 555 163",
                    "0641 555 702",
                    "0719 555 338",
                    "0663 555 921",
                    "0752 555 406",
                    "0690 555 617",
                    "0621 555 259",
                    "0774 555 083",
                ],
                &["My number is {v}.", "You can reach me on {v}."],
                &[
                    "New number: {v}, the old one is dead.",
                    "I got a new phone number, it's {v}.",
                    "Please use {v} from now on, I changed my number.",
                ],
                &[],
            ),
            fact(
                "manager",
                "Who is {who}'s manager now?",
                &[
                    "Priya Raman",
                    "Tom Becker",
                    "Ana Ruiz",
                    "Oliver Grant",
                    "Mei Chen",
                    "Sven Larsen",
                    "Fatima Khan",
                    "Diego Morales",
                    "Claire Dubois",
                    "Kenji Sato",
                    "Aisha Bello",
                    "Paul Novak",
                ],
                &["My manager is {v}.", "I report to {v}."],
                &[
                    "I got reassigned, {v} is my manager now.",
                    "{old} moved teams, so I report to {v} instead.",
                    "From now on my boss is {v}.",
                ],
                &[],
            ),
            fact(
                "partner",
                "Who is {who}'s partner now?",
                &[
                    "Jonas", "Camille", "Rafael", "Ingrid", "Theo", "Lucia", "Marcus", "Yara",
                    "Felix", "Nadia", "Oscar", "Elena",
                ],
                &[
                    "My partner {v} is a nurse.",
                    "I've been seeing {v} for two years.",
                ],
                &[
                    "I'm with {v} now, we met at a friend's party.",
                    "{v} and I are together now.",
                ],
                &[
                    "{v} and I broke up last month.",
                    "I split up with {v}, it was mutual.",
                ],
            ),
            fact(
                "pet",
                "What pet does {who} have now?",
                &[
                    "Biscuit", "Luna", "Pepper", "Milo", "Nala", "Ziggy", "Mochi", "Rusty",
                    "Hazel", "Bruno", "Olive", "Pickles",
                ],
                &[
                    "I have a dog named {v}.",
                    "My cat {v} sleeps on my keyboard.",
                ],
                &[
                    "We adopted a puppy called {v}.",
                    "We took in a rescue cat, {v}.",
                ],
                &[
                    "{v} passed away last week, I miss him.",
                    "We gave {v} away to my aunt's farm.",
                ],
            ),
            fact(
                "car",
                "What car does {who} drive now?",
                &[
                    "blue Skoda",
                    "red Fiat",
                    "grey Volvo",
                    "white Toyota",
                    "green Mini",
                    "black Renault",
                    "silver Honda",
                    "yellow Kia",
                    "orange Peugeot",
                    "brown Mazda",
                    "white Tesla",
                    "red Seat",
                ],
                &["I drive a {v}.", "My car is a {v}."],
                &[
                    "I traded in the {old} for a {v}.",
                    "I bought a {v}, the old one kept breaking down.",
                ],
                &[
                    "I sold the {v}, I take the bus now.",
                    "I don't have a car anymore, the {v} is gone.",
                ],
            ),
            fact(
                "climbing day",
                "On which day does {who} go climbing now?",
                &[
                    "Monday",
                    "Tuesday",
                    "Wednesday",
                    "Thursday",
                    "Friday",
                    "Saturday",
                    "Sunday",
                ],
                &["I go climbing every {v}.", "{v} is my climbing day."],
                &[
                    "Climbing moved to {v} from now on.",
                    "I switched climbing to {v}s, it's quieter.",
                ],
                &["I cancelled my climbing membership, no more {v} sessions."],
            ),
        ],
        small_talk: strs(&[
            "The weather has been grey all week, I barely left the house.",
            "I tried a new recipe yesterday, a lentil soup with too much cumin.",
            "Have you read anything good lately? I need a book for the train.",
            "{name} sent me photos from her trip, the mountains looked unreal.",
            "I'm thinking about learning to play the ukulele, is that silly?",
            "Work was busy today, three meetings back to back.",
            "I watched a documentary about octopuses, they are so clever.",
            "My neighbour's kid practised the trumpet for two hours again.",
            "Do you have tips for sleeping better? I keep waking up at four.",
            "{name} and I are planning a picnic if the sun ever comes out.",
            "I found an old photo album in a drawer, so many bad haircuts.",
            "What should I cook for six people on a budget?",
        ]),
        replies: strs(&[
            "That sounds like a lot, I hope you get some rest.",
            "A short walk in daylight helps more than people think.",
            "Try a mystery novel, something light for the commute.",
            "Ha, that's a good story. How did it turn out?",
            "A big pot of chili or a tray bake feeds a crowd cheaply.",
            "It's never silly to learn something new.",
            "Keeping the bedroom cool and dark often helps with early waking.",
            "That sounds lovely, I hope the weather plays along.",
        ]),
        acknowledgements: strs(&[
            "Thanks for letting me know, I'll keep that in mind.",
            "Got it, noted.",
            "That's a big change! How do you feel about it?",
            "Oh, I'm sorry to hear that. Take care of yourself.",
        ]),
        names: strs(&["Sofia", "Mateo", "Hana", "Lukas", "Amara"]),
    }
}

/// xorshift64: the same chats on every run and machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn pick(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }

    fn of<'a>(&mut self, v: &'a [String]) -> &'a str {
        &v[self.pick(v.len())]
    }
}

/// One fact of a generated chat: its values in order, and whether it was withdrawn last.
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    /// Whose fact it is.
    pub who: String,
    /// Its kind (the template's key).
    pub key: String,
    /// The question about it now.
    pub question: String,
    /// Its values, oldest first.
    pub values: Vec<String>,
    /// It ended (the last value no longer holds).
    pub withdrawn: bool,
    /// What its owner said of it, in order: each value's statement, then the withdrawal.
    pub statements: Vec<String>,
}

/// A generated chat and what its facts are at the end.
pub struct Chat {
    /// The turns, as `bench context` reads a conversation.
    pub conversation: Conversation,
    /// Its facts.
    pub facts: Vec<Fact>,
}

/// Chat `seed` from `t`: `people` is one person talking with an assistant (`1`), or a group
/// chat of that many named people whose facts are each their own.
pub fn generate(t: &Templates, seed: u64, people: usize) -> Chat {
    let mut r = Rng::new(seed);
    let names = ["Robin", "Maya", "Elias", "Noor"];
    let speakers: Vec<String> = if people <= 1 {
        vec!["Robin".into()]
    } else {
        names
            .iter()
            .take(people.min(names.len()))
            .map(|s| s.to_string())
            .collect()
    };
    // Events: (turn, speaker, text), the facts' statements placed among the turns.
    let mut events: BTreeMap<usize, (usize, String)> = BTreeMap::new();
    let mut facts = Vec::new();
    let free = |events: &BTreeMap<usize, (usize, String)>, mut at: usize| {
        // A user turn (even in a two-person chat) that holds no event yet.
        if people <= 1 && at % 2 == 1 {
            at += 1;
        }
        while events.contains_key(&at) {
            at += if people <= 1 { 2 } else { 1 };
        }
        at
    };
    // Each kind's values not drawn yet in this chat: no two people share a value, so a value
    // in a context is one person's.
    let mut pools: Vec<Vec<String>> = t.facts.iter().map(|f| f.values.clone()).collect();
    for (who_i, who) in speakers.iter().enumerate() {
        for (ft, pool) in t.facts.iter().zip(pools.iter_mut()) {
            if pool.len() < 2 || ft.state.is_empty() || ft.change.is_empty() {
                continue;
            }
            // A fact stated in the first fifth, changed 0 to 3 times later, withdrawn last
            // now and then.
            let changes = r.pick(4).min(pool.len() - 1);
            let withdrawn = !ft.withdraw.is_empty() && r.pick(10) < 3;
            let mut values = Vec::new();
            for _ in 0..=changes {
                values.push(pool.remove(r.pick(pool.len())));
            }
            let steps = values.len() + usize::from(withdrawn);
            let span = TURNS * 4 / 5 / steps;
            let mut at = r.pick(TURNS / 5);
            let mut statements = Vec::new();
            for (k, v) in values.iter().enumerate() {
                let text = if k == 0 {
                    r.of(&ft.state).replace("{v}", v)
                } else {
                    r.of(&ft.change)
                        .replace("{v}", v)
                        .replace("{old}", &values[k - 1])
                };
                let slot = free(&events, at.min(TURNS - 2));
                statements.push(text.clone());
                events.insert(slot, (who_i, text));
                // The next step within the span after this one: the last stays in the chat.
                at = slot + span / 2 + r.pick((span / 2).max(1));
            }
            if withdrawn {
                let last = values.last().expect("a value");
                let text = r.of(&ft.withdraw).replace("{v}", last);
                let slot = free(&events, at.min(TURNS - 2));
                statements.push(text.clone());
                events.insert(slot, (who_i, text));
            }
            facts.push(Fact {
                who: who.clone(),
                key: ft.key.clone(),
                question: ft.question.replace("{who}", who),
                values,
                withdrawn,
                statements,
            });
        }
    }
    let start = 1_735_689_600_000i64; // 1 January 2025
    let mut turns = Vec::with_capacity(TURNS);
    let mut last_event = false;
    for i in 0..TURNS {
        // About four turns an hour, a new day every 16 turns: 700 turns span some 44 days;
        // stretched to half a year by a gap between days.
        let day = i as i64 / 16;
        let at = start + day * 4 * 86_400_000 + (i as i64 % 16) * 900_000;
        let (speaker, text) = match events.get(&i) {
            Some((who, text)) => {
                last_event = true;
                (speakers[*who].clone(), text.clone())
            }
            None if people <= 1 && i % 2 == 1 => {
                let text = if last_event {
                    r.of(&t.acknowledgements).to_string()
                } else {
                    r.of(&t.replies).to_string()
                };
                last_event = false;
                ("Assistant".to_string(), text)
            }
            None => {
                last_event = false;
                let who = if people <= 1 {
                    0
                } else {
                    r.pick(speakers.len())
                };
                let text = r.of(&t.small_talk).replace("{name}", r.of(&t.names));
                (speakers[who].clone(), text)
            }
        };
        turns.push((speaker, text, Some(at)));
    }
    Chat {
        conversation: Conversation {
            turns,
            first: speakers[0].clone(),
            qa: facts
                .iter()
                .map(|f| (f.question.clone(), Vec::new()))
                .collect(),
            set: "facts",
            source: None,
        },
        facts,
    }
}

/// Words that mark a value on its line as an earlier one.
const EARLIER: &[&str] = &[
    "before",
    "previously",
    "formerly",
    "used to",
    "old",
    "earlier",
    "was",
    "until",
    "replaced",
    "left",
    "moved from",
    "no longer",
    "instead of",
    "traded",
];

/// Words that say a fact ended.
const ENDED: &[&str] = &[
    "sold",
    "passed away",
    "broke up",
    "split up",
    "quit",
    "no longer",
    "anymore",
    "gave",
    "given away",
    "cancelled",
    "canceled",
    "none",
    "ended",
    "gone",
    "died",
];

/// The lines of `text` (lower case), and where each value occurs: (line, byte offset).
fn occurrences(lines: &[String], value: &str) -> Vec<(usize, usize)> {
    let v = value.to_lowercase();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find(&v) {
            let s = from + at;
            let e = s + v.len();
            let before = line[..s].chars().next_back();
            let after = line[e..].chars().next();
            if !before.is_some_and(char::is_alphanumeric)
                && !after.is_some_and(char::is_alphanumeric)
            {
                out.push((i, s));
            }
            from = e;
        }
    }
    out
}

/// One fact's outcome in one context.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// It holds, and its current value is there.
    pub current: bool,
    /// An earlier value is there and what holds now is not.
    pub obsolete_only: bool,
    /// An earlier value comes after the current one, unmarked.
    pub obsolete_last: bool,
    /// It was withdrawn, and the context says so.
    pub withdrawn_kept: bool,
}

/// What `context` shows of `f`.
pub fn judge(f: &Fact, context: &str) -> Outcome {
    let lines: Vec<String> = context.lines().map(str::to_lowercase).collect();
    let last = f.values.last().map(String::as_str).unwrap_or_default();
    let earlier = &f.values[..f.values.len().saturating_sub(1)];
    let any_earlier = earlier.iter().any(|v| !occurrences(&lines, v).is_empty());
    if f.withdrawn {
        let kept = occurrences(&lines, last)
            .iter()
            .any(|(l, _)| ENDED.iter().any(|w| lines[*l].contains(w)));
        return Outcome {
            withdrawn_kept: kept,
            obsolete_only: !kept && (any_earlier || !occurrences(&lines, last).is_empty()),
            ..Outcome::default()
        };
    }
    let now = occurrences(&lines, last);
    let current = !now.is_empty();
    let last_now = now.iter().max().copied();
    let obsolete_last = last_now.is_some_and(|n| {
        earlier.iter().any(|v| {
            occurrences(&lines, v)
                .iter()
                .any(|o| *o > n && !EARLIER.iter().any(|w| lines[o.0].contains(w)))
        })
    });
    Outcome {
        current,
        obsolete_only: !current && any_earlier,
        obsolete_last,
        withdrawn_kept: false,
    }
}

/// `a.f += b.f` for each field `f` named: counts of two runs added.
macro_rules! add_fields {
    ($a:ident, $b:ident, $($f:ident),+) => {
        $( $a.$f += $b.$f; )+
    };
}

/// `n` of `of` as a share with three decimals, `-` of none.
fn share(n: usize, of: usize) -> String {
    if of == 0 {
        "-".to_string()
    } else {
        format!("{:.3}", n as f64 / of as f64)
    }
}

/// A reader's label: `abridge`, or `abridge(q)` with the question as the query.
fn label(reader: &str, q: bool) -> String {
    if q {
        format!("{reader}(q)")
    } else {
        reader.to_string()
    }
}

/// The shares of a set of outcomes: current (of facts that hold), obsolete only and obsolete
/// last (of all facts; obsolete last of those that hold), withdrawn kept (of those withdrawn).
#[derive(Clone, Copy, Debug, Default)]
struct Shares {
    holding: usize,
    withdrawn: usize,
    current: usize,
    obsolete_only: usize,
    obsolete_last: usize,
    withdrawn_kept: usize,
}

impl Shares {
    fn add(&mut self, f: &Fact, o: Outcome) {
        if f.withdrawn {
            self.withdrawn += 1;
        } else {
            self.holding += 1;
        }
        self.current += usize::from(o.current);
        self.obsolete_only += usize::from(o.obsolete_only);
        self.obsolete_last += usize::from(o.obsolete_last);
        self.withdrawn_kept += usize::from(o.withdrawn_kept);
    }

    fn merge(&mut self, o: &Shares) {
        add_fields!(
            self,
            o,
            holding,
            withdrawn,
            current,
            obsolete_only,
            obsolete_last,
            withdrawn_kept
        );
    }

    fn row(&self) -> String {
        format!(
            "{:>8} {:>9} {:>9} {:>9}",
            share(self.current, self.holding),
            share(self.obsolete_only, self.holding + self.withdrawn),
            share(self.obsolete_last, self.holding),
            share(self.withdrawn_kept, self.withdrawn),
        )
    }
}

/// The three readers of one chat at one budget, without and with the question.
#[derive(Default)]
struct Measured {
    /// (reader, with the question) → shares.
    shares: BTreeMap<(&'static str, bool), Shares>,
}

/// What each reader shows of `chat`'s facts at `budget` (`turns`: its turns as lines with
/// their token estimates).
async fn measure(
    chat: &Chat,
    turns: &[(String, u32)],
    index: &Bm25,
    budget: u32,
    local: &abridge_app::Scoped,
) -> anyhow::Result<Measured> {
    let mut m = Measured::default();
    let (plain, _) = super::bench_context::context_text(local, budget, None).await?;
    let recent = cut(turns, (0..turns.len()).rev(), budget);
    for f in &chat.facts {
        m.shares
            .entry(("abridge", false))
            .or_default()
            .add(f, judge(f, &plain));
        m.shares
            .entry(("recent", false))
            .or_default()
            .add(f, judge(f, &recent));
        let (asked, _) =
            super::bench_context::context_text(local, budget, Some(&f.question)).await?;
        m.shares
            .entry(("abridge", true))
            .or_default()
            .add(f, judge(f, &asked));
        let bm = cut(turns, index.rank(&f.question).into_iter(), budget);
        m.shares
            .entry(("bm25", true))
            .or_default()
            .add(f, judge(f, &bm));
    }
    Ok(m)
}

/// The facts view (`abridge facts`) of a chat's session against what the chat says: of its
/// facts, how many the view gives right (the current value, or none for a withdrawn one). A
/// fact is found by its owner and its first value (the templates name kinds their own way).
async fn view_right(chat: &Chat, local: &abridge_app::Scoped) -> anyhow::Result<usize> {
    let view = local
        .facts(super::bench_context::SESSION)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let mut right = 0;
    for f in &chat.facts {
        let found = view.iter().find(|v| {
            same(&v.who, &f.who)
                && v.values
                    .iter()
                    .any(|x| f.values.iter().any(|y| same(&x.value, y)))
        });
        let ok = found.is_some_and(|v| match (f.withdrawn, &v.current) {
            (true, current) => current.is_none(),
            (false, Some(c)) => f.values.last().is_some_and(|l| same(c, l)),
            (false, None) => false,
        });
        right += usize::from(ok);
    }
    Ok(right)
}

/// How recall reads a chat's facts once every turn of each person is one of their memories.
#[derive(Clone, Copy, Debug, Default)]
struct Recalls {
    /// Facts asked about.
    facts: usize,
    /// Facts whose first recalled statement is the newest, and not marked superseded.
    current_first: usize,
    /// Facts for which an earlier statement was recalled without a mark.
    unmarked: usize,
    /// Facts for which any statement was recalled.
    found: usize,
    /// Earlier statements recalled, and how many of them were marked superseded.
    earlier: usize,
    marked: usize,
}

impl Recalls {
    fn merge(&mut self, o: &Recalls) {
        add_fields!(
            self,
            o,
            facts,
            current_first,
            unmarked,
            found,
            earlier,
            marked
        );
    }

    fn row(&self) -> String {
        format!(
            "{:>8} {:>9} {:>8} {:>9}",
            share(self.found, self.facts),
            share(self.current_first, self.facts),
            share(self.unmarked, self.facts),
            share(self.marked, self.earlier),
        )
    }
}

/// Memories recalled for a chat's facts: every turn a person said is remembered as their
/// `{user, text}` memory, in order; each fact's question is recalled (k = 5) among its
/// owner's memories.
async fn recall_facts(chat: &Chat, local: &abridge_app::Scoped) -> anyhow::Result<Recalls> {
    use abridge_app::memories::{MemoryInput, Summaries, filter};
    let owners: std::collections::BTreeSet<&str> =
        chat.facts.iter().map(|f| f.who.as_str()).collect();
    let items: Vec<MemoryInput> = chat
        .conversation
        .turns
        .iter()
        .filter(|(who, _, _)| owners.contains(who.as_str()))
        .map(|(who, text, _)| MemoryInput {
            id: None,
            user: who.clone(),
            project: String::new(),
            environment: String::new(),
            kind: abridge_app::memories::DEFAULT_TYPE.into(),
            key: abridge_app::memories::DEFAULT_KEY.into(),
            text: text.clone(),
            importance: None,
            replaces: None,
        })
        .collect();
    // In order, a handful at a time: each write sees the ones before it.
    for chunk in items.chunks(50) {
        local
            .remember(chunk.to_vec(), Summaries::Leave)
            .await
            .map_err(|e| anyhow!("{e}"))?;
    }
    let mut r = Recalls::default();
    for f in &chat.facts {
        let hits = local
            .recall(
                &f.question,
                &filter(Some(f.who.clone()), None, None, None, None),
                5,
            )
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let said: Vec<(usize, bool)> = hits
            .iter()
            .filter(|h| h.kind == "memory")
            .filter_map(|h| {
                f.statements
                    .iter()
                    .position(|s| *s == h.text)
                    .map(|i| (i, h.superseded_by.is_some()))
            })
            .collect();
        let newest = f.statements.len().saturating_sub(1);
        r.facts += 1;
        r.found += usize::from(!said.is_empty());
        r.current_first += usize::from(said.first() == Some(&(newest, false)));
        let earlier: Vec<bool> = said
            .iter()
            .filter(|(i, _)| *i < newest)
            .map(|(_, marked)| *marked)
            .collect();
        r.unmarked += usize::from(earlier.iter().any(|m| !m));
        r.earlier += earlier.len();
        r.marked += earlier.iter().filter(|m| **m).count();
    }
    Ok(r)
}

/// The question about a fact now, from what it is (`lives in` → "Where does Robin live now?").
fn question_of(who: &str, key: &str) -> String {
    match key {
        "lives in" => format!("Where does {who} live now?"),
        "works at" => format!("Where does {who} work now?"),
        "phone number" => format!("What is {who}'s phone number now?"),
        "manager" => format!("Who is {who}'s manager now?"),
        "partner" => format!("Who is {who}'s partner now?"),
        "pet" => format!("What pet does {who} have now?"),
        "car" => format!("What car does {who} drive now?"),
        k => match k.strip_suffix(" day") {
            Some(what) => format!("On which day does {who} go {what} now?"),
            None => format!("What is {who}'s {k} now?"),
        },
    }
}

/// `abridge bench facts --real FILE…`: real conversations have no record of their facts, so
/// each is read for the facts abridge finds that change (a value replaced, or ended), listed
/// with the sentences that said them (to check by reading), and the context is judged against
/// that time line as the generated chats are: the current value in it, an earlier one only, an
/// earlier one last without a mark, the ending kept.
pub async fn run_real(s: &Settings, paths: &[PathBuf]) -> Result<(), Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::new(Exit::Internal, e))?;
    let pure = super::commands::pure_engine(s)?;
    let fail = |e: anyhow::Error| Failure::new(Exit::Internal, e);
    let mut totals: BTreeMap<(u32, &'static str, bool), Shares> = BTreeMap::new();
    let mut all_facts = 0;
    for path in paths {
        let conv = super::bench_context::load(path).map_err(|e| Failure::new(Exit::Input, e))?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let tmp = tempfile::tempdir().map_err(|e| Failure::new(Exit::Internal, e))?;
        let local = super::bench_context::import(s, &exe, &conv, tmp.path()).map_err(fail)?;
        let view = local
            .facts(super::bench_context::SESSION)
            .await
            .map_err(|e| fail(anyhow!("{e}")))?;
        // The messages that said each value or ending, to read.
        let mut said: BTreeMap<u64, String> = BTreeMap::new();
        for f in view
            .iter()
            .filter(|f| f.values.len() > 1 || f.ended.is_some())
        {
            for ep in f.episodes() {
                let page = local
                    .messages(super::bench_context::SESSION, ep.saturating_sub(1), 1)
                    .await
                    .map_err(|e| fail(anyhow!("{e}")))?;
                if let Some(m) = page.messages.first() {
                    said.insert(ep, m.content.chars().take(160).collect());
                }
            }
        }
        let said = |ep: u64| said.get(&ep).cloned().unwrap_or_default();
        println!(
            "{name}: {} facts found, {} of them changed or ended",
            view.len(),
            view.iter()
                .filter(|f| f.values.len() > 1 || f.ended.is_some())
                .count()
        );
        // The facts that hold as first said, one line each (to read for precision).
        for f in view
            .iter()
            .filter(|f| f.values.len() == 1 && f.ended.is_none())
        {
            println!("  {}", f.line);
        }
        let mut facts = Vec::new();
        for f in view
            .iter()
            .filter(|f| f.values.len() > 1 || f.ended.is_some())
        {
            println!("  {}", f.line);
            for v in &f.values {
                println!("    #{} {}: {}", v.episode, v.value, said(v.episode));
            }
            if let Some(e) = &f.ended {
                println!("    #{} ended: {}", e.episode, said(e.episode));
            }
            facts.push(Fact {
                who: f.who.clone(),
                key: f.key.clone(),
                question: question_of(&f.who, &f.key),
                values: f.values.iter().map(|v| v.value.clone()).collect(),
                withdrawn: f.ended.is_some(),
                statements: Vec::new(),
            });
        }
        all_facts += facts.len();
        if facts.is_empty() {
            continue;
        }
        let mut turns: Vec<(String, u32)> = Vec::with_capacity(conv.turns.len());
        for (speaker, text, _) in &conv.turns {
            let line = format!("{speaker}: {text}");
            let t = pure
                .estimate_tokens(&line)
                .await
                .map_err(|e| Failure::new(Exit::Internal, e))?;
            turns.push((line, t));
        }
        let index = Bm25::new(&turns);
        let chat = Chat {
            conversation: conv,
            facts,
        };
        for budget in BUDGETS {
            let m = measure(&chat, &turns, &index, budget, &local)
                .await
                .map_err(fail)?;
            for ((reader, q), sh) in &m.shares {
                let label = label(reader, *q);
                println!("{name:<24} {budget:>6} {label:<13} {}", sh.row());
                totals.entry((budget, reader, *q)).or_default().merge(sh);
            }
        }
    }
    println!(
        "{:<24} {:>6} {:<13} {:>8} {:>9} {:>9} {:>9}",
        "all", "budget", "reader", "current", "obs.only", "obs.last", "withdrawn"
    );
    for ((budget, reader, q), sh) in &totals {
        let label = label(reader, *q);
        println!("{:<24} {budget:>6} {label:<13} {}", "all", sh.row());
    }
    println!(
        "{all_facts} facts that changed or ended, as abridge itself reads them (no file records its facts: the lines above are to check by reading); the columns as for generated chats"
    );
    Ok(())
}

/// `abridge bench facts [TEMPLATES.json]`: `chats` chats of each kind (one person with an
/// assistant, a group of three), from `seed` on.
pub async fn run(
    s: &Settings,
    templates: Option<&PathBuf>,
    chats: usize,
    seed: u64,
) -> Result<(), Failure> {
    let t = match templates {
        None => built_in(),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))
                .map_err(|e| Failure::new(Exit::Input, e))?;
            serde_json::from_str(&text)
                .with_context(|| {
                    format!(
                        "{} is not a templates file: write one like `abridge bench facts --print-templates` prints",
                        p.display()
                    )
                })
                .map_err(|e| Failure::new(Exit::Input, e))?
        }
    };
    if t.facts.is_empty()
        || t.small_talk.is_empty()
        || t.replies.is_empty()
        || t.acknowledgements.is_empty()
        || t.names.is_empty()
    {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "a templates file needs facts, small_talk, replies, acknowledgements and names, none of them empty"
            ),
        ));
    }
    let exe = std::env::current_exe().map_err(|e| Failure::new(Exit::Internal, e))?;
    let pure = super::commands::pure_engine(s)?;
    println!(
        "{:<12} {:>6} {:<13} {:>8} {:>9} {:>9} {:>9}",
        "chat", "budget", "reader", "current", "obs.only", "obs.last", "withdrawn"
    );
    let mut totals: BTreeMap<(u32, &'static str, bool), Shares> = BTreeMap::new();
    let mut facts = 0;
    let mut views: Vec<(String, usize, usize)> = Vec::new();
    let mut recalls: Vec<(String, Recalls)> = Vec::new();
    for k in 0..chats.max(1) {
        for people in [1usize, 3] {
            let chat = generate(&t, seed + k as u64, people);
            facts += chat.facts.len();
            let name = format!(
                "{}-{}",
                if people == 1 { "pair" } else { "group" },
                seed + k as u64
            );
            let tmp = tempfile::tempdir().map_err(|e| Failure::new(Exit::Internal, e))?;
            let local = super::bench_context::import(s, &exe, &chat.conversation, tmp.path())
                .map_err(|e| Failure::new(Exit::Internal, e))?;
            let mut turns: Vec<(String, u32)> = Vec::with_capacity(TURNS);
            for (speaker, text, _) in &chat.conversation.turns {
                let line = format!("{speaker}: {text}");
                let t = pure
                    .estimate_tokens(&line)
                    .await
                    .map_err(|e| Failure::new(Exit::Internal, e))?;
                turns.push((line, t));
            }
            let index = Bm25::new(&turns);
            for budget in BUDGETS {
                let m = measure(&chat, &turns, &index, budget, &local)
                    .await
                    .map_err(|e| Failure::new(Exit::Internal, e))?;
                for ((reader, q), sh) in &m.shares {
                    let label = if *q {
                        format!("{reader}(q)")
                    } else {
                        reader.to_string()
                    };
                    println!("{name:<12} {budget:>6} {label:<13} {}", sh.row());
                    totals.entry((budget, reader, *q)).or_default().merge(sh);
                }
            }
            let right = view_right(&chat, &local)
                .await
                .map_err(|e| Failure::new(Exit::Internal, e))?;
            views.push((name.clone(), right, chat.facts.len()));
            let rc = recall_facts(&chat, &local)
                .await
                .map_err(|e| Failure::new(Exit::Internal, e))?;
            recalls.push((name, rc));
        }
    }
    for ((budget, reader, q), sh) in &totals {
        let label = label(reader, *q);
        println!("{:<12} {budget:>6} {label:<13} {}", "all", sh.row());
    }
    println!();
    println!(
        "{:<12} {:>8} {:>9} {:>8} {:>9} {:>9}",
        "chat", "found", "cur.first", "unmarked", "marked", "view"
    );
    let mut all = Recalls::default();
    let (mut right, mut of) = (0, 0);
    for ((name, rc), (_, r, n)) in recalls.iter().zip(&views) {
        println!(
            "{name:<12} {} {:>9.3}",
            rc.row(),
            *r as f64 / (*n).max(1) as f64
        );
        all.merge(rc);
        right += r;
        of += n;
    }
    println!(
        "{:<12} {} {:>9.3}",
        "all",
        all.row(),
        right as f64 / of.max(1) as f64
    );
    println!(
        "memories: every turn a person said remembered as their {{user, text}} memory, each fact's question recalled (k = 5) among its owner's; found: a statement of the fact recalled; cur.first: the first one recalled is the newest, unmarked; unmarked: an earlier statement recalled without its superseded mark (the done-when: never); marked: the share of earlier statements recalled that carry the mark; view: the facts view (abridge facts) gives the fact's current value, or none for a withdrawn one"
    );
    println!(
        "{facts} facts; current: share of facts that hold whose current value is in the context; obs.only: share of facts where an earlier value is there and the current one (or the withdrawal) is not; obs.last: share of facts that hold where an earlier value comes after the current one on a line that does not mark it as earlier; withdrawn: share of withdrawn facts whose withdrawal is there. (q): with the fact's question as the query; bm25(q): the turns that best match the question (a reference that knows it); recent: the newest turns"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_is_the_same_every_run_and_states_every_value_in_order() {
        let t = built_in();
        let a = generate(&t, 7, 1);
        let b = generate(&t, 7, 1);
        assert_eq!(a.facts, b.facts);
        assert_eq!(a.conversation.turns, b.conversation.turns);
        assert_eq!(a.conversation.turns.len(), TURNS);
        let text: Vec<&str> = a.conversation.turns.iter().map(|t| t.1.as_str()).collect();
        for f in &a.facts {
            // Each value is said, and said after the one before it.
            let mut after = 0;
            for v in &f.values {
                let at = text[after..]
                    .iter()
                    .position(|t| t.contains(v.as_str()))
                    .unwrap_or_else(|| panic!("{} {v} is never said after turn {after}", f.key));
                after += at;
            }
        }
        assert!(
            a.facts.iter().any(|f| f.values.len() > 1),
            "some facts change"
        );
        let g = generate(&t, 7, 3);
        let who: std::collections::BTreeSet<&str> =
            g.facts.iter().map(|f| f.who.as_str()).collect();
        assert_eq!(who.len(), 3, "a group chat's facts are three people's");
    }

    #[test]
    fn the_judge_reads_current_obsolete_and_withdrawn_values() {
        let f = Fact {
            who: "Robin".into(),
            key: "lives in".into(),
            question: String::new(),
            values: vec!["Porto".into(), "Lyon".into()],
            withdrawn: false,
            statements: Vec::new(),
        };
        let both = judge(&f, "Robin lives in Lyon.\nEarlier: Robin lives in Porto");
        assert!(both.current && !both.obsolete_only && !both.obsolete_last);
        let marked = judge(&f, "lives in: Lyon\nbefore that, Porto");
        assert!(marked.current && !marked.obsolete_last);
        let last = judge(&f, "we moved to Lyon\nI love Porto so much");
        assert!(last.current && last.obsolete_last);
        let old = judge(&f, "I live in Porto.");
        assert!(!old.current && old.obsolete_only);
        assert_eq!(
            judge(&f, "Lyonnaise potatoes"),
            Outcome::default(),
            "whole words"
        );
        let car = Fact {
            values: vec!["blue Skoda".into()],
            withdrawn: true,
            ..f
        };
        assert!(judge(&car, "car: none since 3 May (sold the blue Skoda)").withdrawn_kept);
        let kept = judge(&car, "I drive a blue Skoda.");
        assert!(!kept.withdrawn_kept && kept.obsolete_only);
    }

    #[test]
    fn the_built_in_templates_read_back_from_their_json() {
        let t = built_in();
        let json = serde_json::to_string(&t).unwrap();
        let back: Templates = serde_json::from_str(&json).unwrap();
        assert_eq!(back.facts.len(), t.facts.len());
    }
}
