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
//!
//! Cues match any regular form of their words ("partners", "moved"); an organisation's name
//! ("Birchwood Bank") is an employer by its shape; a sentence that speaks of no one else is the
//! speaker's ("Another day at Ironclad Security"). A sentence with a fact's cue and a name that
//! no rule reads is kept as what was said later of the fact ([`Act::Mentions`]), so the context
//! still shows a change the rules could not read.

use std::collections::BTreeMap;

/// What a statement does to a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// The fact holds with this value (from now on).
    Holds,
    /// The fact ends (its value no longer holds).
    Ends,
    /// The speaker said something of the fact in words the rules do not read: a new value of
    /// its kind, or its value now beside an ending's word. Nothing changes; the fact shows
    /// what was said later, so a change read by no rule is still in the context.
    Mentions,
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

/// The latest episode a fact's time line took in (its last value or its end).
pub fn latest(f: &Fact) -> u64 {
    f.ended
        .as_ref()
        .map(|(_, e, _)| *e)
        .or(f.values.last().map(|s| s.episode))
        .unwrap_or(0)
        .max(f.later.as_ref().map_or(0, |(_, e, _)| *e))
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
    /// What its owner said of it after its last statement, in words no rule reads ("Update:
    /// new place in Tampa!"): when, in which episode, the sentence.
    pub later: Option<(Option<i64>, u64, String)>,
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
    /// The words a question about it is asked with ("Where does Robin *live* now?").
    asked: &'static [&'static str],
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
        cues: &[
            "number", "phone", "reach me", "call me", "text me", "ring me", "mobile", "cell",
            "whatsapp",
        ],
        shape: Shape::Phone,
        before: &[],
        asked: &["number", "phone", "mobile", "reach"],
    },
    Kind {
        key: "pet",
        cues: &[
            "dog",
            "cat",
            "puppy",
            "kitten",
            "pet",
            "rabbit",
            "hamster",
            "parrot",
            "rescue",
            "adopted",
            "rehome",
            "pup",
            "tortoise",
            "turtle",
            "guinea pig",
            "ferret",
            "budgie",
            "gecko",
            "lizard",
            "snake",
            "goldfish",
            "pony",
            "horse",
            "beagle",
            "labrador",
            "spaniel",
            "terrier",
            "poodle",
            "collie",
            "greyhound",
            "tabby",
            "bunny",
            "kitty",
            "doggo",
        ],
        shape: Shape::Name,
        before: &[
            "name is",
            "call him",
            "call her",
            "named him",
            "named her",
            "named",
            "called",
            "cat",
            "dog",
            "puppy",
            "kitten",
            "rehome",
            "tortoise",
            "rabbit",
            "hamster",
            "parrot",
        ],
        asked: &["pet", "dog", "cat", "puppy", "kitten", "animal"],
    },
    Kind {
        key: "lives in",
        asked: &[
            "live", "lives", "living", "home", "city", "town", "based", "reside",
        ],
        cues: &[
            "now call",
            "lived in",
            "my address",
            "our address",
            "address is",
            "live in",
            "living in",
            "lives in",
            "moved to",
            "move to",
            "moving to",
            "relocated",
            "relocating",
            "relocation",
            "new city",
            "new town",
            "new address",
            "settled down in",
            "moving day",
            "moved house to",
            "move house",
            "put down roots",
            "roots in",
            "changed cities",
            "moved cities",
            "based in",
            "settled in",
            "home is",
            "home for me",
            "home for us",
            "home in",
            "settling into",
            "settling in",
            "made the jump to",
            "is home",
            "home town",
            "hometown",
            "life in",
            "my base",
            "our base",
            "street in",
            "neighbourhood in",
            "neighborhood in",
            "new place",
            "place in",
            "flat in",
            "apartment in",
            "house in",
            "new flat",
            "new apartment",
            "new house",
            "rent",
            "resident of",
            "townhouse",
            "cottage",
            "condo",
            "boxes",
            "unpacking",
            "removal",
            "neighbours",
            "neighbors",
            "raised in",
            "grew up in",
            "born in",
        ],
        shape: Shape::Proper,
        before: &[
            "call",
            "lived in",
            "live in",
            "living in",
            "moved to",
            "move to",
            "moving to",
            "settling into",
            "made the jump to",
            "moved house to",
            "roots in",
            "home in",
            "relocated to",
            "relocating to",
            "settled down in",
            "new city",
            "new town",
            "new address",
            "resident of",
            "raised in",
            "grew up in",
            "born in",
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
        asked: &[
            "work", "works", "working", "job", "employer", "company", "employed",
        ],
        cues: &[
            "worked at",
            "worked for",
            "first day at",
            "my company",
            "company is",
            "new position",
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
            "employers",
            "employed",
            "offer from",
            "position at",
            "contract with",
            "joining",
            "start at",
            "starting at",
            "first week at",
            "at work",
            "team at",
            "i'm a",
            "i'm an",
            "i am a",
            "resigned",
            "laid me off",
            "laid off",
            "job",
            "jobs",
            "employee",
            "payroll",
            "colleagues",
            "coworkers",
            "co-workers",
            "career",
            "new role",
            "new hire",
            "hire at",
            "role at",
            "signed with",
            "office",
            "gig",
            "new work",
        ],
        shape: Shape::Proper,
        before: &[
            "worked at",
            "worked for",
            "first day at",
            "company is",
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
            "employed by",
            "offer from",
            "contract with",
            "joining",
            "start at",
            "starting at",
            "first week at",
            "quit",
            "employer",
            "employer is",
            "hello",
            "resigned from",
            "at",
        ],
    },
    Kind {
        key: "manager",
        asked: &["manager", "boss", "supervisor", "manages", "report"],
        cues: &[
            "report directly to",
            "reports to",
            "manages our team",
            "manages my team",
            "manages me",
            "my manager",
            "my boss",
            "my supervisor",
            "boss",
            "supervisor",
            "new chief",
            "my chief",
            "my new manager",
            "my new boss",
            "my new supervisor",
            "report to",
            "reporting to",
            "manager is",
            "boss is",
            "supervisor is",
            "my team lead",
            "line manager",
            "new manager",
            "manager",
            "work under",
            "runs my team",
            "runs our team",
            "leads my team",
            "leads our team",
            "head of my team",
            "head of our team",
            "taking over our team",
            "took over our team",
            "running our team",
            "running my team",
            "moved under",
            "put under",
            "placed under",
            "now under",
            "reassigned to",
            "answer to",
            "in charge of the team",
            "in charge of my team",
            "in charge of our team",
            "team leader",
            "team lead",
            "new boss",
            "new lead",
        ],
        shape: Shape::Name,
        before: &[
            "answer to",
            "under",
            "reassigned to",
            "work under",
            "report directly to",
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
        asked: &[
            "partner",
            "dating",
            "together",
            "relationship",
            "boyfriend",
            "girlfriend",
            "husband",
            "wife",
        ],
        cues: &[
            "going out with",
            "partner",
            "boyfriend",
            "girlfriend",
            "husband",
            "wife",
            "fiancé",
            "fiance",
            "fiancée",
            "fiancee",
            "spouse",
            "other half",
            "live together",
            "living together",
            "moved in together",
            "i'm seeing",
            "am seeing",
            "been seeing",
            "started seeing",
            "now seeing",
            "dating",
            "been together",
            "are together",
            "together now",
            "got together",
            "married",
            "broke up",
            "split up",
            "divorced",
            "separate ways",
            "i'm with",
            "i am with",
            "a couple",
            "couple",
            "anniversary",
            "engaged",
            "asked me out",
            "relationship",
            "made it official",
            "are a thing",
            "are an item",
            "relation with",
            "dates with",
            "on dates",
            "seeing someone",
            "in love with",
            "my ex",
        ],
        shape: Shape::Name,
        before: &[
            "partner",
            "seeing",
            "dating",
            "engaged to",
            "relationship with",
            "relation with",
            "with",
            "married",
        ],
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
            "own a",
            "get around in",
            "picked up a",
            "dealer",
            "leased",
            "lease",
        ],
        shape: Shape::Car,
        before: &[
            "for a",
            "drive a",
            "drive an",
            "driving a",
            "bought a",
            "own a",
            "in a",
            "up a",
            "a",
            "an",
            "the",
        ],
        asked: &["car", "drive", "drives", "driving", "vehicle"],
    },
];

/// Car makes: a colour (or nothing) and one of these is a car whatever the words around it
/// ("my white Fiat is due for a service", "I commute in my grey Audi").
const MAKES: &[&str] = &[
    "Acura",
    "Alfa",
    "Aston",
    "Audi",
    "Bentley",
    "BMW",
    "Buick",
    "BYD",
    "Cadillac",
    "Chevrolet",
    "Chevy",
    "Chrysler",
    "Citroen",
    "Citroën",
    "Cupra",
    "Dacia",
    "Dodge",
    "Ferrari",
    "Fiat",
    "Ford",
    "Genesis",
    "GMC",
    "Honda",
    "Hyundai",
    "Infiniti",
    "Jaguar",
    "Jeep",
    "Kia",
    "Lada",
    "Lamborghini",
    "Lancia",
    "Land",
    "Lexus",
    "Lincoln",
    "Lotus",
    "Lucid",
    "Maserati",
    "Mazda",
    "Mercedes",
    "MG",
    "Mini",
    "Mitsubishi",
    "Nissan",
    "Opel",
    "Peugeot",
    "Polestar",
    "Porsche",
    "Renault",
    "Rivian",
    "Saab",
    "Seat",
    "Skoda",
    "Škoda",
    "Smart",
    "Subaru",
    "Suzuki",
    "Tesla",
    "Toyota",
    "Vauxhall",
    "Volkswagen",
    "Volvo",
    "VW",
];

/// Colours (and the words of a car's state) that may come before a make.
const COLOURS: &[&str] = &[
    "white", "black", "grey", "gray", "silver", "red", "blue", "green", "yellow", "orange",
    "brown", "beige", "dark", "light", "navy", "purple", "pink", "gold", "bronze", "maroon",
    "cream", "teal", "old", "new", "used", "little", "tiny", "electric", "hybrid", "vintage",
];

/// A car named by its make in a clause: up to two colour words and a make (and a capitalised
/// model after it); the last one named ("I traded in the blue Skoda for a red Fiat"), or with
/// `first` the first.
fn car_by_make(ws: &[(usize, &str)], first: bool) -> Option<String> {
    let is_make = |w: &&(usize, &str)| MAKES.contains(&w.1);
    let i = if first {
        ws.iter().position(|w| is_make(&w))?
    } else {
        ws.iter().rposition(|w| is_make(&w))?
    };
    let mut start = i;
    while start > 0 && i - start < 2 && COLOURS.contains(&ws[start - 1].1.to_lowercase().as_str()) {
        start -= 1;
    }
    // "old" and "new" say which car, not what it is.
    while start < i && ["old", "new", "used"].contains(&ws[start].1.to_lowercase().as_str()) {
        start += 1;
    }
    let mut end = i + 1;
    if ws.get(end).is_some_and(|w| capitalised(w.1)) {
        end += 1;
    }
    Some(
        ws[start..end]
            .iter()
            .map(|w| w.1)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The last words of an organisation's name ("Birchwood Bank", "Helix Biotech", "Kite
/// Insurance"): a capitalised run ending in one is an employer, never a place, whatever the
/// words around it ("I moved over to Birchwood Bank").
const ORG_WORDS: &[&str] = &[
    "agency",
    "apparel",
    "furniture",
    "textiles",
    "pharmacy",
    "airlines",
    "airways",
    "analytics",
    "associates",
    "aviation",
    "bank",
    "bakery",
    "biotech",
    "books",
    "brewery",
    "builders",
    "capital",
    "clinic",
    "co",
    "college",
    "consulting",
    "construction",
    "corp",
    "corporation",
    "council",
    "design",
    "dynamics",
    "electric",
    "electronics",
    "energy",
    "engineering",
    "films",
    "finance",
    "foods",
    "foundation",
    "freight",
    "games",
    "gmbh",
    "group",
    "health",
    "healthcare",
    "holdings",
    "hospital",
    "hotel",
    "hotels",
    "inc",
    "industries",
    "institute",
    "insurance",
    "labs",
    "law",
    "llc",
    "logistics",
    "ltd",
    "marine",
    "media",
    "medical",
    "mining",
    "motors",
    "networks",
    "partners",
    "pharma",
    "pharmaceuticals",
    "press",
    "publishing",
    "rail",
    "realty",
    "records",
    "retail",
    "robotics",
    "school",
    "schools",
    "security",
    "shipping",
    "software",
    "solutions",
    "studio",
    "studios",
    "systems",
    "tech",
    "technologies",
    "telecom",
    "transport",
    "university",
    "ventures",
    "works",
];

/// A clause's first word as a name when it is no opener ("Bandit crossed the rainbow
/// bridge"): the time line keeps an ending by it only if it is a value the speaker has now.
fn opening_name(ws: &[(usize, &str)], who: &str) -> Option<String> {
    ws.first()
        .map(|w| w.1)
        .filter(|w| {
            capitalised(w) && !implied_subject(&[w.to_lowercase()]) && !w.eq_ignore_ascii_case(who)
        })
        .map(str::to_string)
}

/// Whether a clause opens with a name as its subject: a value there ("Rafael and I"), or a
/// capitalised word and a verb in the third person ("Bob lives in Rome").
fn named_subject(ws: &[(usize, &str)]) -> bool {
    proper_at(ws, 0, 4).is_some()
        || (ws.first().is_some_and(|w| capitalised(w.1))
            && ws.get(1).is_some_and(|n| {
                n.0 == ws[0].0 + ws[0].1.len() + 1
                    && n.1.len() > 3
                    && n.1.ends_with('s')
                    && n.1.chars().all(char::is_lowercase)
            }))
}

/// Whether a clause opens with a car as its subject ("The blue Volkswagen is parked outside").
fn car_at_start(ws: &[(usize, &str)]) -> bool {
    ws.iter().take(3).any(|w| MAKES.contains(&w.1))
}

/// An organisation's name in a clause (see [`ORG_WORDS`]).
fn org_in(ws: &[(usize, &str)]) -> Option<String> {
    (0..ws.len()).find_map(|i| {
        proper_at(ws, i, 4).filter(|v| {
            v.contains(' ')
                && v.rsplit(' ')
                    .next()
                    .is_some_and(|w| ORG_WORDS.contains(&w.to_lowercase().as_str()))
        })
    })
}

/// Whether a one-word value is an acronym ("LGBTQ", "IP").
fn no_value(v: &str) -> bool {
    !v.contains(' ')
        && v.chars().filter(|c| c.is_alphabetic()).count() > 1
        && v.chars().all(|c| c.is_uppercase() || !c.is_alphabetic())
}

/// Whether a value is an organisation's name.
fn is_org(v: &str) -> bool {
    org_in(&words(v)).is_some_and(|o| o == v)
}

/// Activities that make a weekday a regular day.
const ACTIVITIES: &[&str] = &[
    "climb",
    "swim",
    "run",
    "dance",
    "rehearsal",
    "match",
    "league",
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
    "bowling",
    "cycling",
    "hiking",
    "golf",
    "badminton",
    "volleyball",
    "basketball",
    "hockey",
    "rugby",
    "karate",
    "judo",
    "boxing",
    "pilates",
    "zumba",
    "spin",
    "crossfit",
    "knitting",
    "painting",
    "drawing",
    "singing",
    "band",
    "orchestra",
    "violin",
    "drums",
    "cello",
    "skating",
    "rowing",
    "sailing",
    "fencing",
    "archery",
    "squash",
    "darts",
    "poker",
    "quiz",
    "trivia",
    "volunteering",
    "scouts",
];

// Weekday names (the dates module's).
use crate::dates::WEEKDAYS;

/// Activities that are a setting for another one (a bowling league, a yoga class).
const GENERAL_ACTIVITIES: &[&str] = &[
    "league",
    "class",
    "practice",
    "training",
    "lesson",
    "lessons",
    "rehearsal",
    "match",
];

/// The activity a clause (its lower-case words) names first ("Choir rehearsals moved to
/// Sunday" is about choir).
fn activity_in(lower: &[String]) -> Option<&'static &'static str> {
    ACTIVITIES
        .iter()
        .filter_map(|a| phrase_at(lower, a.trim()).first().map(|&i| (i, a)))
        .min_by_key(|(i, _)| *i)
        .map(|(_, a)| a)
}

/// An activity's name as a fact's key uses it ("climb" and "climbing" are one).
fn activity_name(word: &str) -> &str {
    match word.trim() {
        "climb" => "climbing",
        "swim" => "swimming",
        "run" => "running",
        "dance" | "dancing" => "dancing",
        w => w,
    }
}

/// Words that end a fact.
const ENDINGS: &[&str] = &[
    "new home for",
    "found a home for",
    "went bust",
    "stolen",
    "car-free",
    "single again",
    "i'm single",
    "are done",
    "left the",
    "are free",
    "made redundant",
    "redundant",
    "last day at",
    "my last day",
    "broke it off",
    "called it off",
    "ended things",
    "write-off",
    "crashed",
    "is gone",
    "are gone",
    "it's over",
    "over between",
    "went to live with",
    "break from work",
    "lost my job",
    "losing my job",
    "lost our jobs",
    "got fired",
    "was fired",
    "fired me",
    "let me go",
    "job hunting",
    "between jobs",
    "unemployed",
    "looking for a job",
    "ended",
    "is over",
    "no car",
    "written off",
    "totaled",
    "totalled",
    "rehome",
    "laid me off",
    "separate ways",
    "got rid",
    "no more",
    "stopped",
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
    "walked away from",
    "let go",
    "not renewed",
    "wasn't renewed",
    "stole my",
    "never came back",
    "went missing",
    "dumped me",
    "called it quits",
    "call it quits",
    "separated",
    "disposed of",
    "eliminated",
    "my notice",
    "gave notice",
    "over with",
    "ended it",
    "gave up",
    "given up",
    "my ex",
];

/// Words that end something, too loose to end a fact by themselves ("finished", "ran away",
/// "closed down"): they end only the fact whose value now they name, which the time line
/// checks ("Things with Rosie are finished" ends Rosie's being the partner only while she is).
const WEAK_ENDINGS: &[&str] = &[
    "finished",
    "ran away",
    "run away",
    "scrapped",
    "goodbye to",
    "moved out",
    "closed down",
    "shut down",
    "went under",
    "bankrupt",
    "out of business",
    "out of work",
    "retired from",
    "no longer together",
    "left me",
    "we lost",
    "i lost",
    "put to sleep",
    "farewell",
    "split",
    "to a farm",
    "new family",
    "new owners",
    "got out",
    "done with",
    "ran out",
    "expired",
    "a new home",
    "is lost",
    "got lost",
    "rip",
    "rest in peace",
    "rainbow bridge",
];

/// Words after an ending that say a new value follows: "sold the house in Uppsala and bought
/// one in Rennes".
const RENEWALS: &[&str] = &[
    "new",
    "bought",
    "found",
    "hello",
    "moved into",
    "moved to",
    "now",
    "got",
    "have",
];

/// Words that say something changed ("now", "new", "moved", "instead", …).
const CHANGE_WORDS: &[&str] = &[
    "now",
    "new",
    "moved",
    "moving",
    "changed",
    "switched",
    "instead",
    "anymore",
    "longer",
    "started",
    "starting",
    "joined",
    "joining",
    "left",
    "leaving",
    "replaced",
    "took",
    "taking",
    "update",
    "officially",
    "finally",
];

/// Words of the third person: a sentence with one speaks of someone else.
const THIRD_PERSON: &[&str] = &[
    "he", "she", "they", "his", "her", "their", "him", "them", "he's", "she's", "they're",
];

/// Words of the first person: the sentence is about the speaker.
const FIRST_PERSON: &[&str] = &[
    "i", "i'm", "i've", "i'd", "i'll", "we", "we're", "we've", "my", "our", "me", "us",
];

/// Capitalised words that are not values.
const NOT_VALUES: &[&str] = &[
    "Introducing",
    "Presenting",
    "Meet",
    "Say",
    "Welcome",
    "Guess",
    "Sad",
    "Got",
    "Goodbye",
    "Hello",
    "Hi",
    "Hey",
    "Update",
    "Heads",
    "Sadly",
    "Sorry",
    "Congrats",
    "Congratulations",
    "Happy",
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
    "At",
    "In",
    "On",
    "For",
    "With",
    "Over",
    "To",
    "By",
    "After",
    "Since",
    "Things",
    "Me",
    "RIP",
    "That",
    "That's",
    "There",
    "There's",
    "Here",
    "Here's",
    "What",
    "What's",
    "Let's",
    "You",
    "You're",
    "You've",
    "You'll",
    "Your",
    "We've",
    "We'll",
    "We'd",
    "They're",
    "They've",
    "He's",
    "She's",
    "Yeah",
    "Well",
    "Wow",
    "Thank",
    "Okay",
    "OK",
    "Sure",
    "Haha",
    "Cool",
    "Nice",
    "Great",
    "Awesome",
    "Really",
    "Anyway",
    "Actually",
    "Honestly",
    "Maybe",
    "Wait",
    "If",
    "When",
    "Whenever",
    "While",
];

/// Words after a name that make it a sentence's subject.
const SUBJECT_FOLLOWERS: &[&str] = &[
    "is", "was", "and", "died", "passed", "has", "had", "became", "moved", "left", "joined",
    "laid", "will", "got", "sold", "gave", "went", "'s", "says", "said", "let", "fired", "dumped",
    "sacked", "ran", "runs", "leads", "replaced", "asked",
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
    // A verb a sentence opens with when it leaves out "I" ("Met Jonas at a wedding").
    if i == 0 && implied_subject(&[ws[0].1.to_lowercase()]) {
        return None;
    }
    // A sentence's first word is capitalised whatever it is: a value when a subject's verb or
    // "and" follows it ("Pepper died", "Rafael and I"), not an opener ("Sad news", "Got rid").
    if i == 0 {
        // More than a space before the next word: an appositive ("Mochi, my cat, …") or a
        // heading ("Official: Jake is my boyfriend").
        let gap = ws.get(1).is_some_and(|n| n.0 > ws[0].0 + ws[0].1.len() + 1);
        let next_capitalised = ws.get(1).is_some_and(|n| capitalised(n.1));
        let follows = ws
            .get(1)
            .is_some_and(|n| SUBJECT_FOLLOWERS.contains(&n.1.to_lowercase().as_str()));
        let value = if gap {
            !next_capitalised
        } else {
            next_capitalised || follows
        };
        if !value {
            return None;
        }
    }
    let mut run = vec![ws[i].1];
    let mut j = i + 1;
    while j < ws.len() && run.len() < max {
        let w = ws[j].1;
        // A name does not run on past punctuation ("Official: Jake", "Boss: Gary Hughes").
        if ws[j].0 > ws[j - 1].0 + ws[j - 1].1.len() + 1 {
            break;
        }
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

/// Whether a run of digits is a date ("2024-03-15", "2022/01/01"), not a number to call.
fn is_date(run: &str) -> bool {
    let groups: Vec<&str> = run.split(['-', '/']).map(str::trim).collect();
    groups.len() == 3
        && groups[0].len() == 4
        && groups[1].len() <= 2
        && groups[2]
            .get(..2)
            .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
}

/// A phone number as a speaker gives one without saying so: a leading "+" or "0", or three
/// groups of digits or more ("555 201 3344"), not a lone count ("31536000 seconds").
fn phone_by_shape(s: &str) -> bool {
    phone(s).is_some_and(|p| {
        p.starts_with('+')
            || p.starts_with('0')
            || p.split([' ', '-']).filter(|g| !g.is_empty()).count() >= 3
    })
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
            let run = b[i..j].iter().collect::<String>().trim().to_string();
            if digits >= 7 && !is_date(&run) {
                return Some(run);
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

/// The positions where `phrase` (lower case, words separated by spaces) starts in `lower`
/// (a sentence's words in lower case): whole words only ("car" is not in "Caribbean").
fn phrase_at(lower: &[String], phrase: &str) -> Vec<usize> {
    let pw: Vec<&str> = phrase.split(' ').filter(|w| !w.is_empty()).collect();
    if pw.is_empty() || pw.len() > lower.len() {
        return Vec::new();
    }
    (0..=lower.len() - pw.len())
        .filter(|&i| {
            pw.iter()
                .zip(&lower[i..])
                .all(|(p, w)| inflected(p, w, pw.len() == 1))
        })
        .collect()
}

/// Whether `w` is `p` or, for a word of four letters or more, one of its regular forms
/// ("partners", "moved", "moving", "works"): a phrase is matched in any of them.
fn inflects(p: &str, w: &str) -> bool {
    inflected(p, w, true)
}

/// [`inflects`], with a plural's "-s" only if `plural` (a phrase of one word: "partners", but
/// "places in" is not "place in").
fn inflected(p: &str, w: &str, plural: bool) -> bool {
    if p == w {
        return true;
    }
    if p.len() < 4 || !p.bytes().all(|b| b.is_ascii_lowercase()) {
        return false;
    }
    let stem = p.strip_suffix('e').unwrap_or(p);
    w.strip_prefix(p).is_some_and(|rest| {
        ["d", "ed", "ing"].contains(&rest) || (plural && ["s", "es"].contains(&rest))
    }) || w
        .strip_prefix(stem)
        .is_some_and(|rest| ["ing", "ed"].contains(&rest))
}

/// Whether any of `phrases` is in the clause (its words `ws`, in lower case `lower`), and
/// where the first found is. A capitalised word inside the clause is part of a name, not one
/// of the phrases ("Jack's Wife Freda" says nothing of a wife).
fn any_at(ws: &[(usize, &str)], lower: &[String], phrases: &[&str]) -> Option<usize> {
    phrases
        .iter()
        .flat_map(|p| phrase_at(lower, p))
        .filter(|&i| {
            i == 0
                || !ws[i].1.chars().next().is_some_and(char::is_uppercase)
                || ws[i].1 == "I"
                || ws[i].1.starts_with("I'")
        })
        .min()
}

/// Where "is home" (not "is home to") is said in a clause's lower-case words.
fn home_at(lower: &[String]) -> Vec<usize> {
    [
        "is home",
        "is my home",
        "is our home",
        "is my base",
        "is our base",
        "has been my base",
        "has been our base",
        "has been home",
    ]
    .iter()
    .flat_map(|p| {
        let n = p.split(' ').count();
        phrase_at(lower, p)
            .into_iter()
            .filter(move |&i| lower.get(i + n).is_none_or(|w| w != "to"))
    })
    .collect()
}

/// The run of capitalised words that ends right before word `end` ("Utrecht" in "Utrecht is
/// home"), up to `max` words.
fn proper_before(ws: &[(usize, &str)], end: usize, max: usize) -> Option<String> {
    let mut start = end;
    while start > 0 && end - start < max && capitalised(ws[start - 1].1) {
        start -= 1;
    }
    if start == end {
        return None;
    }
    let v = ws[start..end]
        .iter()
        .map(|w| w.1)
        .collect::<Vec<_>>()
        .join(" ");
    Some(v.trim_end_matches("'s").to_string())
}

/// How far from a cue (in words) a name may be when no value word precedes it.
const NEAR: usize = 5;

/// The first value of `kind`'s shape in a clause (its words `ws`, in lower case `lower`)
/// right after one of its `before` words, or within [`NEAR`] words of its cues; never the
/// speaker's own name.
fn value_of(
    kind: &Kind,
    clause: &str,
    ws: &[(usize, &str)],
    lower: &[String],
    cue: usize,
    who: &str,
    ends: bool,
) -> Option<String> {
    let not_who = |v: &String| !v.eq_ignore_ascii_case(who);
    match kind.shape {
        Shape::Phone => phone(clause),
        Shape::Car => car_by_make(ws, ends).or_else(|| {
            kind.before.iter().find_map(|b| {
                let n = b.split(' ').count();
                phrase_at(lower, b)
                    .into_iter()
                    .find_map(|i| car_at(ws, i + n))
            })
        }),
        Shape::Proper | Shape::Name => {
            let max = if kind.shape == Shape::Name { 2 } else { 4 };
            let after = kind.before.iter().find_map(|b| {
                let n = b.split(' ').count();
                phrase_at(lower, b)
                    .into_iter()
                    .find_map(|i| proper_at(ws, i + n, max).filter(not_who))
            });
            // A place before "is home".
            if after.is_none()
                && kind.key == "lives in"
                && let Some(v) = home_at(lower)
                    .into_iter()
                    .find_map(|i| proper_before(ws, i, max).filter(not_who))
            {
                return Some(v);
            }
            if after.is_some() {
                return after;
            }
            // A name right before "my cat" ("Suki my cat knocked a glass off the table").
            if kind.shape == Shape::Name
                && let Some(v) = (1..ws.len().saturating_sub(1))
                    .filter(|&i| {
                        (lower[i] == "my" || lower[i] == "our")
                            && kind.cues.iter().any(|c| inflects(c, &lower[i + 1]))
                    })
                    .find_map(|i| proper_before(ws, i, max))
                    .filter(not_who)
            {
                return Some(v);
            }
            // Introduced by name: "Meet Coco, the newest member of our family, a kitten".
            if kind.shape == Shape::Name
                && let Some(v) = [
                    "meet",
                    "introducing",
                    "presenting",
                    "welcome",
                    "say hi to",
                    "say hello to",
                ]
                .iter()
                .find_map(|o| {
                    let n = o.split(' ').count();
                    phrase_at(lower, o)
                        .into_iter()
                        .find(|&i| i == 0)
                        .and_then(|_| proper_at(ws, n, max))
                })
                .filter(not_who)
            {
                return Some(v);
            }
            // "Hazel the dog loves the beach", "welcome to the family, Rusty the hamster": a
            // name, "the" and a cue.
            if kind.shape == Shape::Name
                && let Some(i) = (0..ws.len().saturating_sub(2)).find(|&i| {
                    capitalised(ws[i].1)
                        && lower[i + 1] == "the"
                        && kind.cues.iter().any(|c| inflects(c, &lower[i + 2]))
                })
            {
                return Some(ws[i].1.to_string()).filter(not_who);
            }
            // A name near the cue ("Ana Ruiz is my manager now", "Rafael and I broke up").
            let mut from = cue.saturating_sub(NEAR);
            // A name the window cuts into starts where its first word does.
            while from > 0 && capitalised(ws[from].1) && capitalised(ws[from - 1].1) {
                from -= 1;
            }
            // Up to a few words past the last of the kind's cues ("We adopted a kitten from
            // the shelter: Juno").
            let last = kind
                .cues
                .iter()
                .flat_map(|p| phrase_at(lower, p))
                .max()
                .unwrap_or(cue)
                .max(cue);
            let to = (last + NEAR).min(ws.len());
            (from..to).find_map(|i| proper_at(ws, i, max).filter(not_who))
        }
    }
}

/// Verbs (and the adverbs before them) a speaker opens a sentence with when they leave out
/// "I": "Just picked up a blue Skoda", "Got rid of the car", "Moved to Lyon last week", "Work
/// at Acme is busy".
const IMPLIED_SUBJECT: &[&str] = &[
    "just",
    "finally",
    "got",
    "picked",
    "bought",
    "moved",
    "started",
    "work",
    "working",
    "sold",
    "left",
    "switched",
    "traded",
    "quit",
    "resigned",
    "joined",
    "adopted",
    "living",
    "settled",
    "relocated",
    "leased",
    "drove",
    "driving",
    "married",
    "been",
    "born",
    "raised",
    "signed",
    "still",
    "officially",
    "currently",
    "goodbye",
    "farewell",
    "bye",
    "met",
    "welcome",
    "meet",
    "say",
    "brought",
    "took",
    "made",
    "found",
    "went",
    "came",
    "had",
    "gave",
    "began",
];

/// Whether a clause (its words in lower case) leaves its subject out: it opens with one of the
/// [`IMPLIED_SUBJECT`] words, so the speaker is the subject.
fn implied_subject(lower: &[String]) -> bool {
    let Some(first) = lower.first() else {
        return false;
    };
    // Or with a verb's "-ing" or "-ed" form ("Settling into Metz", "Unpacking the last boxes in
    // Kilkenny"), not as a subject ("Living in Paris is expensive").
    IMPLIED_SUBJECT.contains(&first.as_str())
        || (first.len() >= 5
            && (first.ends_with("ing") || first.ends_with("ed"))
            && lower
                .get(1)
                .is_none_or(|n| !["is", "was", "are", "has", "can"].contains(&n.as_str())))
}

/// Whether a clause (its words in lower case) is in the first person.
fn first_person(lower: &[String]) -> bool {
    lower.iter().any(|w| FIRST_PERSON.contains(&w.as_str()))
}

/// The clauses facts are looked for in: a sentence, or a long one's parts (split at commas
/// and "but"), so a cue and a value must be said together.
fn clauses(sentence: &str) -> Vec<&str> {
    // Two statements joined: "I handed in my notice and I'm joining Keller Systems" (not
    // "Alex and I split up": the first part holds a statement of its own, three words or more).
    for join in [
        " and I'm ",
        " and I ",
        " and we're ",
        " and we ",
        " and now I ",
        " and now we ",
    ] {
        if let Some(at) = sentence.find(join)
            && sentence[..at].split_whitespace().count() >= 3
        {
            let (a, b) = (&sentence[..at], &sentence[at + 5..]);
            return clauses(a).into_iter().chain(clauses(b)).collect();
        }
    }
    if sentence.split_whitespace().count() <= 24 {
        return vec![sentence];
    }
    sentence
        .split([',', ':'])
        .flat_map(|c| c.split(" but "))
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// `query` with the words its kinds of fact are told with added (their cues), when it asks
/// about one: an offline embedding of "Where does Robin live now?" then lies near "we moved
/// to Lyon". Any other query is given back as it is.
pub fn with_fact_words(query: &str) -> String {
    let lower: Vec<String> = words(query).iter().map(|(_, w)| w.to_lowercase()).collect();
    let mut out = query.to_string();
    for kind in KINDS {
        if lower.iter().any(|w| kind.asked.contains(&w.as_str())) {
            for cue in kind.cues {
                out.push(' ');
                out.push_str(cue);
            }
        }
    }
    out
}

/// How much of one message is read for facts (characters).
pub const READ_CHARS: usize = 4_000;

/// The first [`READ_CHARS`] characters of `text`.
fn first_page(text: &str) -> &str {
    match text.char_indices().nth(READ_CHARS) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// The statements of facts in what `who` said.
pub fn said(who: &str, text: &str) -> Vec<Said> {
    read(who, text, false)
}

/// [`said`], and with `mentions` what the sentences no rule reads say of a fact (after the
/// statements: see [`Act::Mentions`]).
fn read(who: &str, text: &str, mentions: bool) -> Vec<Said> {
    let mut out = Vec::new();
    let mut unread = Vec::new();
    // A person says their facts in a message, not in the middle of a pasted document: only the
    // first [`READ_CHARS`] characters are read, so a 50 MB paste costs what a page does.
    let text = first_page(text).replace('\u{2019}', "'");
    // A short sentence that names a fact without its value ("New job!") gives the next one's
    // value its fact ("I'm with Keller Systems now").
    let mut pending: Option<&Kind> = None;
    for sentence in sentences(&text) {
        let before = out.len();
        if let Some(kind) = pending.take()
            && let Some(value) =
                value_after_preposition(sentence, who).or_else(|| bare_name(sentence, who))
        {
            out.push(Said {
                key: kind.key.to_string(),
                value,
                act: Act::Holds,
                sentence: sentence.to_string(),
            });
            continue;
        }
        let parts = clauses(sentence);
        for c in &parts {
            statement(who, c, sentence, &mut out);
        }
        // A statement split over two parts: "Met Jonas at a wedding and we're together now".
        if out.len() == before && parts.len() > 1 {
            sole_name(who, sentence, &mut out);
        }
        if out.len() == before {
            pending = headline(sentence);
            if mentions {
                unread.extend(mentioned(who, sentence));
            }
        }
    }
    out.extend(unread);
    out
}

/// A person's fact whose cue a first-person sentence names, with the one name it holds as its
/// value ("Met Jonas at a friend's wedding and we're together now").
fn sole_name(who: &str, sentence: &str, out: &mut Vec<Said>) {
    let ws = words(sentence);
    let lower: Vec<String> = ws.iter().map(|(_, w)| w.to_lowercase()).collect();
    if !(first_person(&lower) || implied_subject(&lower)) || any_at(&ws, &lower, ENDINGS).is_some()
    {
        return;
    }
    let mut names_said: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ws.len() {
        match proper_at(&ws, i, 2) {
            Some(v) => {
                i += v.split(' ').count();
                if !v.eq_ignore_ascii_case(who) && !names_said.contains(&v) {
                    names_said.push(v);
                }
            }
            None => i += 1,
        }
    }
    let [name] = names_said.as_slice() else {
        return;
    };
    if let Some(kind) = KINDS
        .iter()
        .filter(|k| k.shape == Shape::Name)
        .find(|k| any_at(&ws, &lower, k.cues).is_some())
    {
        out.push(Said {
            key: kind.key.to_string(),
            value: name.clone(),
            act: Act::Holds,
            sentence: sentence.to_string(),
        });
    }
}

/// A sentence that is only a name ("We have a new kitten! Rusty!"), never the speaker's.
fn bare_name(sentence: &str, who: &str) -> Option<String> {
    let ws = words(sentence);
    (!ws.is_empty() && ws.len() <= 3 && ws.iter().all(|w| capitalised(w.1)))
        .then(|| ws.iter().map(|w| w.1).collect::<Vec<_>>().join(" "))
        .filter(|v| !v.eq_ignore_ascii_case(who))
}

/// The fact a short sentence of a few words names without a value ("New job!", "Big news, new
/// flat!"), a place's, an organisation's or a person's.
fn headline(sentence: &str) -> Option<&'static Kind> {
    let ws = words(sentence);
    let lower: Vec<String> = ws.iter().map(|(_, w)| w.to_lowercase()).collect();
    // A few words, or a few more that announce something new ("We have a new kitten!").
    if ws.len() > 6 || (ws.len() > 4 && !lower.iter().any(|w| w == "new")) {
        return None;
    }
    KINDS
        .iter()
        .filter(|k| matches!(k.shape, Shape::Proper | Shape::Name))
        .find(|k| any_at(&ws, &lower, k.cues).is_some())
}

/// The value a sentence in the first person gives after a preposition ("I'm with Keller
/// Systems now", "we're in Ghent"), never the speaker's own name.
fn value_after_preposition(sentence: &str, who: &str) -> Option<String> {
    let ws = words(sentence);
    let lower: Vec<String> = ws.iter().map(|(_, w)| w.to_lowercase()).collect();
    if !first_person(&lower) && !implied_subject(&lower) {
        return None;
    }
    (0..ws.len())
        .filter(|&i| ["with", "at", "for", "in", "to", "joined", "is"].contains(&lower[i].as_str()))
        .find_map(|i| proper_at(&ws, i + 1, 4).filter(|v| !v.eq_ignore_ascii_case(who)))
}

/// The words one of which a clause needs for any rule to read it: the longest word of every
/// cue, ending and pattern, the makes and the weekdays. Most sentences hold none, and are
/// passed over at the cost of a look-up a word (a 50 MB message is read within the guest's
/// CPU budget).
fn markers() -> &'static std::collections::BTreeSet<String> {
    static SET: std::sync::OnceLock<std::collections::BTreeSet<String>> =
        std::sync::OnceLock::new();
    SET.get_or_init(|| {
        let longest = |p: &str| {
            p.split(' ')
                .max_by_key(|w| w.chars().count())
                .unwrap_or("")
                .to_string()
        };
        let mut set: std::collections::BTreeSet<String> = KINDS
            .iter()
            .flat_map(|k| k.cues.iter())
            .chain(ENDINGS)
            .chain(WEAK_ENDINGS)
            .chain(ACTIVITIES)
            .map(|p| longest(p.trim()))
            .collect();
        set.extend(MAKES.iter().map(|m| m.to_lowercase()));
        set.extend(WEEKDAYS.iter().map(|d| d.to_string()));
        for w in [
            "gave",
            "put",
            "left",
            "moved",
            "switched",
            "changed",
            "transferred",
            "went",
            "relocated",
            "jumped",
            "swapped",
            "traded",
            "exchanged",
            "replaced",
            "succeeded",
            "took",
            "home",
            "base",
            "goodbye",
            "hello",
            "give",
            "given",
        ] {
            set.insert(w.to_string());
        }
        set.extend(ORG_WORDS.iter().map(|w| w.to_string()));
        set
    })
}

/// Whether a clause (its lower-case words) holds one of the [`markers`] or a digit (a phone
/// number).
fn worth_reading(lower: &[String]) -> bool {
    let set = markers();
    lower.iter().any(|w| {
        set.contains(w.as_str())
            || w.strip_suffix('s').is_some_and(|d| set.contains(d))
            || w.bytes().any(|b| b.is_ascii_digit())
    })
}

/// Whether a clause is code or markup ("`TemplateNotFound`", "**Worker Processes**"):
/// what a person says of themselves is plain words.
fn markup(c: &str) -> bool {
    c.contains(['`', '*', '#', '|', '{', '}', '<', '>', '_', '\\', '[', ']'])
}

/// The statement of clause `c` (of `sentence`), if it holds one.
fn statement(who: &str, c: &str, sentence: &str, out: &mut Vec<Said>) {
    if markup(c) {
        return;
    }
    let ws = words(c);
    let mut lower: Vec<String> = ws.iter().map(|(_, w)| w.to_lowercase()).collect();
    if !worth_reading(&lower) {
        return;
    }
    // "A couple of days" is a number, not two people.
    for i in 1..lower.len() {
        if lower[i] == "of" && lower[i - 1] == "couple" {
            lower[i - 1] = "few".to_string();
        }
    }
    // An ending's words, or giving someone (a pet) to others or up: "we gave Luna to a
    // family", "we had to give Pip up".
    let gave_to = ["gave", "give", "given"]
        .iter()
        .flat_map(|g| phrase_at(&lower, g))
        .any(|g| {
            lower[g + 1..]
                .iter()
                .take(4)
                .any(|w| w == "to" || w == "away" || w == "up")
        });
    // Putting a pet down: "we had to put Pepper down".
    let put_down = phrase_at(&lower, "put").into_iter().any(|g| {
        lower[g + 1..]
            .iter()
            .take(3)
            .enumerate()
            .any(|(k, w)| w == "down" && lower.get(g + k + 2).is_none_or(|n| n != "roots"))
    });
    let ending_at = any_at(&ws, &lower, ENDINGS);
    let weak_at = any_at(&ws, &lower, WEAK_ENDINGS);
    let ends = gave_to || put_down || ending_at.is_some();
    let weak = !ends && weak_at.is_some();
    // The speaker's own: said in the first person, with "I" left out, or of no one else (no
    // third person, no name as its subject): "Another day at Ironclad Security".
    let third = lower.iter().any(|w| THIRD_PERSON.contains(&w.as_str()));
    let mine = first_person(&lower)
        || implied_subject(&lower)
        || (!third && !named_subject(&ws) && !car_at_start(&ws));
    // A regular day: a weekday beside an activity, said of oneself or of the activity
    // ("Climbing moved to Thursday").
    let day = lower.iter().find_map(|w| {
        let w = w
            .strip_suffix('s')
            .filter(|d| WEEKDAYS.contains(d))
            .unwrap_or(w);
        WEEKDAYS.iter().find(|d| **d == w)
    });
    if let Some(day) = day
        && let Some(what) = activity_in(&lower)
        && (mine
            || lower.first().is_some_and(|w| w == what.trim())
            || phrase_at(&lower, what.trim()).into_iter().any(|i| {
                lower.get(i + 1).is_some_and(|n| {
                    ["is", "moved", "changed", "switched", "starts"].contains(&n.as_str())
                }) || lower[..i].iter().any(|w| {
                    // "They moved choir practice to Saturday".
                    [
                        "moved",
                        "changed",
                        "switched",
                        "shifted",
                        "rescheduled",
                        "pushed",
                    ]
                    .contains(&w.as_str())
                })
            }))
    {
        out.push(Said {
            key: format!("{} day", activity_name(what)),
            value: format!("{}{}", day[..1].to_uppercase(), &day[1..]),
            act: if ends { Act::Ends } else { Act::Holds },
            sentence: sentence.to_string(),
        });
        return;
    }
    // Giving up an activity ends its day: "I stopped playing tennis", "I left the choir".
    if day.is_none()
        && (ends || weak)
        && mine
        && let Some(what) = activity_in(&lower)
    {
        out.push(Said {
            key: format!("{} day", activity_name(what)),
            value: String::new(),
            act: Act::Ends,
            sentence: sentence.to_string(),
        });
        return;
    }
    // "We're Avignon-based now".
    if mine
        && let Some(v) = ws.iter().find_map(|(_, w)| {
            w.strip_suffix("-based")
                .filter(|p| capitalised(p) && !p.contains('-'))
        })
    {
        out.push(Said {
            key: "lives in".to_string(),
            value: v.to_string(),
            act: if ends { Act::Ends } else { Act::Holds },
            sentence: sentence.to_string(),
        });
        return;
    }
    let org = org_in(&ws);
    // A change that names the value it replaces: the new value is the fact's whatever cue
    // comes near the old one ("Carla Mendes replaced Jonah Wright as our manager").
    let change = if ends {
        None
    } else {
        change_of_value(&ws, &lower)
    };
    // What the kinds below weigh their value against: the clause's names, a car in it, a
    // renewal's word after an ending ("My old phone died, new number is …", "we sold the house
    // in Uppsala and bought one in Rennes"), a place that "is home".
    let named: Vec<String> = (0..ws.len()).filter_map(|i| proper_at(&ws, i, 4)).collect();
    let a_car = car_by_make(&ws, true).filter(|c| c.contains(' '));
    let renewal = ending_at.or(weak_at).and_then(|e| {
        RENEWALS
            .iter()
            .flat_map(|r| phrase_at(&lower, r))
            .filter(|&i| i > e)
            .min()
    });
    let old_one =
        !phrase_at(&lower, "old one").is_empty() || !phrase_at(&lower, "old number").is_empty();
    let home = !home_at(&lower).is_empty();
    for kind in KINDS {
        // A phone number, or a car by its make, is its own cue in what a speaker says of
        // themselves.
        let by_shape = match kind.shape {
            // A number given in a message that speaks of no one else is the speaker's.
            Shape::Phone => (mine || !third) && phone_by_shape(c),
            Shape::Car => mine && car_by_make(&ws, true).is_some(),
            _ => false,
        };
        let Some(cue) = any_at(&ws, &lower, kind.cues).or(by_shape.then_some(0)) else {
            continue;
        };
        let mut value = value_of(kind, c, &ws, &lower, cue, who, ends);
        // A person or an animal is not an organisation ("I'm with Silverline Media now"); an
        // acronym is no value ("LGBTQ"); being a fan of something is no job ("I'm a big fan of
        // Juventus").
        if (kind.shape == Shape::Name && value.as_deref().is_some_and(is_org))
            || value.as_deref().is_some_and(no_value)
            || (kind.key == "works at" && lower.iter().any(|w| w == "fan" || w == "fans"))
        {
            continue;
        }
        if let Some((old, new)) = &change
            && value
                .as_deref()
                .is_some_and(|v| names(old, v) || names(v, old))
        {
            value = Some(new.clone());
        }
        // An organisation is where one works, not where one lives; a car is no place,
        // employer or person ("I drive a white Toyota to the office").
        if (kind.key == "lives in" && value.as_deref().is_some_and(is_org))
            || (kind.shape != Shape::Car
                && value
                    .as_deref()
                    .is_some_and(|v| a_car.as_deref().is_some_and(|c| names(c, v))))
        {
            continue;
        }
        // "I no longer live in a place where …" speaks of some place, not of where one lives.
        let indefinite = value.is_none()
            && kind.shape == Shape::Proper
            && kind.cues.iter().any(|p| {
                let n = p.split(' ').count();
                phrase_at(&lower, p).into_iter().any(|i| {
                    lower.get(i + n).is_some_and(|w| {
                        ["a", "an", "somewhere", "anywhere", "any"].contains(&w.as_str())
                    })
                })
            });
        if indefinite {
            continue;
        }
        // After a renewal's word (or beside "the old one"), the ending is the old thing's and
        // the value new: the one said after that word ("… I take the bus now" names none).
        let renewed_value = renewal.and_then(|r| match kind.shape {
            Shape::Proper | Shape::Name => (r..ws.len()).find_map(|i| proper_at(&ws, i, 4)),
            Shape::Phone => phone(&c[ws[r].0..]),
            Shape::Car => car_by_make(&ws[r..], true),
        });
        let renewed = value.is_some() && (renewed_value.is_some() || old_one);
        if let Some(v) = renewed_value {
            value = Some(v);
        }
        if ends && !renewed && (mine || value.is_some()) {
            out.push(Said {
                key: kind.key.to_string(),
                value: value.unwrap_or_default(),
                act: Act::Ends,
                sentence: sentence.to_string(),
            });
            return;
        }
        // A number is the speaker's when they give it ("New number: …"), a place that "is home
        // now" is theirs ("The move is done: Utrecht is home now"), and an announcement is the
        // speaker's own when it speaks of no one else ("First day at Meridian Bank went well",
        // "Relocation done, new city: Aachen").
        let announced = kind.cues.iter().any(|p| {
            (p.starts_with("new ") || p.starts_with("first ")) && !phrase_at(&lower, p).is_empty()
        }) && !third
            && named
                .iter()
                .all(|p| value.as_deref().is_some_and(|v| names(v, p) || names(p, v)));
        let theirs = mine || announced || kind.shape == Shape::Phone;
        if !(theirs || (kind.key == "lives in" && home)) {
            continue;
        }
        if let Some(value) = value {
            // A loose ending beside the value ends it if it is the value now, when the clause
            // names no other ("We said goodbye to Porto and settled in Lyon" ends nothing).
            let others = named.iter().any(|p| !names(&value, p) && !names(p, &value));
            let act = if weak && !renewed && !others {
                Act::Ends
            } else {
                Act::Holds
            };
            out.push(Said {
                key: if act == Act::Ends {
                    String::new()
                } else {
                    kind.key.to_string()
                },
                value,
                act,
                sentence: sentence.to_string(),
            });
            return;
        }
    }
    // A change that names the value it replaces rather than the fact: "I moved from Blue
    // Harbor to Wayne Health", "We finally left Valencia, we're in Split now".
    if mine && let Some((old, new)) = change {
        out.push(Said {
            key: format!("{FROM_VALUE}{old}"),
            value: new,
            act: Act::Holds,
            sentence: sentence.to_string(),
        });
        return;
    }
    // Leaving names the value that ends: "I left Keller Systems".
    if mine
        && let Some(v) = phrase_at(&lower, "left")
            .into_iter()
            .find_map(|i| proper_at(&ws, i + 1, 4))
    {
        out.push(Said {
            key: String::new(),
            value: v,
            act: Act::Ends,
            sentence: sentence.to_string(),
        });
        return;
    }
    // An organisation named by a speaker of themselves is their employer: "I do accounting for
    // Horizon Retail", "Today I signed with Crescent Studios".
    if mine && let Some(v) = org {
        let weak_only = weak && !ends;
        out.push(Said {
            key: if weak_only {
                String::new()
            } else {
                "works at".to_string()
            },
            value: v,
            act: if ends || weak { Act::Ends } else { Act::Holds },
            sentence: sentence.to_string(),
        });
        return;
    }
    // An ending that names only a value: "Biscuit passed away" (or a car by its make).
    if (ends || weak)
        && let Some(v) = (0..ws.len())
            .find_map(|i| proper_at(&ws, i, 2))
            .or_else(|| car_by_make(&ws, true))
            .or_else(|| opening_name(&ws, who))
    {
        out.push(Said {
            key: String::new(),
            value: v,
            act: Act::Ends,
            sentence: sentence.to_string(),
        });
    }
}

/// The mark before a value in a statement's key that names the value it replaces, not the fact
/// ("=Blue Harbor": whichever of the speaker's facts holds Blue Harbor now).
pub const FROM_VALUE: char = '=';

/// A change from one value to another in a clause (its words `ws`, in lower case `lower`):
/// "from X to Y", or "left X" and then "in", "at", "to" or "for" Y; both capitalised.
fn change_of_value(ws: &[(usize, &str)], lower: &[String]) -> Option<(String, String)> {
    let run = |i: usize| proper_at(ws, i, 4).map(|v| (v.split(' ').count(), v));
    // "Viktor Sousa replaced Helen Park", "Ana took over from Tom": the new one first.
    for verb in [
        "replaced",
        "succeeded",
        "took over from",
        "taken over from",
        "take over from",
    ] {
        let n = verb.split(' ').count();
        for i in phrase_at(lower, verb) {
            // "Peter Lang has taken over from …".
            let at = if i > 0 && ["has", "have", "had", "just"].contains(&lower[i - 1].as_str()) {
                i - 1
            } else {
                i
            };
            if let Some(new) = proper_before(ws, at, 4)
                && let Some((_, old)) = run(i + n)
                && !new.eq_ignore_ascii_case(&old)
            {
                return Some((old, new));
            }
        }
    }
    for (opener, joins) in [
        ("move from", &["to"][..]),
        ("jumped ship from", &["to"][..]),
        ("switched from", &["to"][..]),
        ("changed from", &["to"][..]),
        ("transferred from", &["to"][..]),
        ("went from", &["to"][..]),
        ("relocated from", &["to"][..]),
        ("left", &["in", "at", "to", "for"][..]),
        ("swapped", &["for"][..]),
        ("traded", &["for"][..]),
        ("exchanged", &["for"][..]),
        ("replaced", &["with"][..]),
        ("goodbye to", &["hello", "to", "in"][..]),
        ("goodbyes to", &["hello", "to", "in"][..]),
        ("goodbye", &["hello"][..]),
        ("farewell", &["hello"][..]),
        ("bye", &["hello"][..]),
    ] {
        let m = opener.split(' ').count();
        for i in phrase_at(lower, opener) {
            let Some((n, old)) = run(i + m) else {
                continue;
            };
            let after = i + m + n;
            if let Some(new) = (after..lower.len())
                .filter(|&k| joins.contains(&lower[k].as_str()))
                .find_map(|k| run(k + 1).map(|(_, v)| v))
                .filter(|v| !v.eq_ignore_ascii_case(&old))
            {
                return Some((old, new));
            }
        }
    }
    None
}

/// Whether `named` names `value`: every word of it is one of the value's (any case).
pub(crate) fn names(value: &str, named: &str) -> bool {
    let v: Vec<String> = value.split_whitespace().map(str::to_lowercase).collect();
    let n: Vec<String> = named.split_whitespace().map(str::to_lowercase).collect();
    !n.is_empty() && n.iter().all(|w| v.contains(w))
}

/// The facts' time lines from `events` (in the order they were said).
pub fn timeline(events: &[Event]) -> Vec<Fact> {
    let mut facts: BTreeMap<(String, String), Fact> = BTreeMap::new();
    // A speaker's name is a partner or a manager, never a place, an employer or a pet.
    let speakers: std::collections::BTreeSet<String> =
        events.iter().map(|e| e.who.to_lowercase()).collect();
    for e in events {
        if e.said.act == Act::Holds
            && !["partner", "manager"].contains(&e.said.key.as_str())
            && speakers.contains(&e.said.value.to_lowercase())
        {
            continue;
        }
        if e.said.act == Act::Mentions {
            mention(&mut facts, e);
            continue;
        }
        let mut key = e.said.key.clone();
        // "League night is Friday now" is the day of the one activity the speaker has one of
        // ("Bowling league on Mondays").
        if let Some(general) = key.strip_suffix(" day")
            && GENERAL_ACTIVITIES.contains(&general)
        {
            let mut theirs = facts.values().filter(|f| {
                f.who == e.who
                    && f.key
                        .strip_suffix(" day")
                        .is_some_and(|a| !GENERAL_ACTIVITIES.contains(&a))
            });
            if let (Some(one), None) = (theirs.next(), theirs.next()) {
                key = one.key.clone();
            }
        }
        if key.is_empty() || key.starts_with(FROM_VALUE) {
            // The speaker's fact whose current value this names ("the Skoda" names "blue
            // Skoda"; a change names the value it replaces).
            let named = key.strip_prefix(FROM_VALUE).unwrap_or(&e.said.value);
            match facts
                .values()
                .find(|f| f.who == e.who && f.current().is_some_and(|c| names(&c.value, named)))
            {
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
                later: None,
            });
        f.later = None;
        match e.said.act {
            Act::Mentions => {}
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
                // Ended already, it stays ended since the first time it was said ("I lost my
                // job" told again months later).
                if !f.values.is_empty() && f.ended.is_none() {
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

/// A mention laid on the time line: it is kept as what was said later of the speaker's fact of
/// its kind when it names a value that fact never had, or (with no kind) of the fact whose
/// value now it names.
fn mention(facts: &mut BTreeMap<(String, String), Fact>, e: &Event) {
    let v = &e.said.value;
    let f = if e.said.key.is_empty() {
        facts
            .values_mut()
            .find(|f| f.who == e.who && f.current().is_some_and(|c| names(&c.value, v)))
    } else {
        facts
            .get_mut(&(e.who.clone(), e.said.key.clone()))
            .filter(|f| {
                !f.values
                    .iter()
                    .any(|s| names(&s.value, v) || names(v, &s.value))
            })
    };
    if let Some(f) = f {
        f.later = Some((e.at_ms, e.episode, e.said.sentence.clone()));
    }
}

/// What a sentence the rules read no statement in says of a fact (see [`Act::Mentions`]): a
/// value of a kind's shape beside its cue, or a name beside an ending's word, in a sentence
/// that speaks of no one else.
fn mentioned(who: &str, sentence: &str) -> Option<Said> {
    if markup(sentence) {
        return None;
    }
    let ws = words(sentence);
    let lower: Vec<String> = ws.iter().map(|(_, w)| w.to_lowercase()).collect();
    if !worth_reading(&lower) || lower.iter().any(|w| THIRD_PERSON.contains(&w.as_str())) {
        return None;
    }
    let cue = KINDS
        .iter()
        .filter_map(|k| any_at(&ws, &lower, k.cues).map(|at| (at, k)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, k)| k);
    let ending =
        any_at(&ws, &lower, ENDINGS).is_some() || any_at(&ws, &lower, WEAK_ENDINGS).is_some();
    // Only what sounds like news: an ending's word, or a cue beside a word of change.
    let change = lower.iter().any(|w| CHANGE_WORDS.contains(&w.as_str()));
    if !(ending || (cue.is_some() && change)) {
        return None;
    }
    let value = match cue.map(|k| k.shape) {
        Some(Shape::Phone) => phone(sentence),
        Some(Shape::Car) => car_by_make(&ws, true),
        _ => None,
    }
    // The last name said: a new value comes after the one it replaces ("Tina Marsh is out,
    // Gary Hughes is in charge of the team now").
    .or_else(|| (0..ws.len()).rev().find_map(|i| proper_at(&ws, i, 4)))
    .or_else(|| opening_name(&ws, who).filter(|_| ending))
    .filter(|v| !v.eq_ignore_ascii_case(who))?;
    let key = match cue {
        Some(k) if !ending => k.key.to_string(),
        _ => String::new(),
    };
    Some(Said {
        key,
        value,
        act: Act::Mentions,
        sentence: sentence.to_string(),
    })
}

/// The separator of an event's fields in a ledger entry's text (a control character no field
/// keeps: [`clean`] takes them out).
const FIELD: char = '\u{1e}';

/// A field without control characters (and within bounds: a sentence of 240 characters).
fn clean(s: &str, max: usize) -> String {
    let t: String = s.chars().filter(|c| !c.is_control()).take(max).collect();
    t.trim().to_string()
}

/// Who said an episode, as its facts name them: the speaker's name, else `the user` or `the
/// assistant`.
pub fn who_of(speaker: Option<&str>, role: crate::types::Role) -> String {
    match speaker.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => clean(s, 60),
        None => match role {
            crate::types::Role::Assistant => "the assistant".into(),
            _ => "the user".into(),
        },
    }
}

/// An event as a ledger entry's text: `who␞key␞+|-␞value␞ms␞sentence` (the episode is the
/// entry's own).
pub fn encode(e: &Event) -> String {
    let act = match e.said.act {
        Act::Holds => "+",
        Act::Ends => "-",
        Act::Mentions => "~",
    };
    let ms = e.at_ms.map(|m| m.to_string()).unwrap_or_default();
    [
        clean(&e.who, 60),
        clean(&e.said.key, 40),
        act.to_string(),
        clean(&e.said.value, 80),
        ms,
        clean(&e.said.sentence, 240),
    ]
    .join(&FIELD.to_string())
}

/// An event back from a ledger entry's text and episode (`None`: not an event's text).
pub fn decode(text: &str, episode: u64) -> Option<Event> {
    let f: Vec<&str> = text.split(FIELD).collect();
    let [who, key, act, value, ms, sentence] = f[..] else {
        return None;
    };
    Some(Event {
        who: who.to_string(),
        said: Said {
            key: key.to_string(),
            value: value.to_string(),
            act: match act {
                "+" => Act::Holds,
                "-" => Act::Ends,
                "~" => Act::Mentions,
                _ => return None,
            },
            sentence: sentence.to_string(),
        },
        episode,
        at_ms: ms.parse().ok(),
    })
}

/// The events of one episode: what `who` said in `text` at `at_ms`.
pub fn events(who: &str, text: &str, episode: u64, at_ms: Option<i64>) -> Vec<Event> {
    read(who, text, true)
        .into_iter()
        .map(|said| Event {
            who: who.to_string(),
            said,
            episode,
            at_ms,
        })
        .collect()
}

/// The events a ledger's fact entries hold, in the order they were said (by episode).
pub fn of_entries<'a>(entries: impl IntoIterator<Item = &'a crate::ledger::Entry>) -> Vec<Event> {
    let mut out: Vec<Event> = entries
        .into_iter()
        .filter(|e| e.kind == crate::ledger::Kind::Fact)
        .filter_map(|e| decode(&e.text, e.episode))
        .collect();
    out.sort_by_key(|e| e.episode);
    out
}

/// The heading of the facts block of a context's summary: the facts as the summary's rows
/// hold them.
pub const HEADING: &str =
    "Facts as of the summary (the current value first, then what it replaced):";

/// The heading of the facts a query asks about, as they stand now.
pub const ASKED_HEADING: &str = "Facts the question is about, as they stand now (the current value first, then what it replaced):";

/// The heading of the facts the turns after the summary changed, when the context cannot show
/// those turns.
pub const CHANGED_HEADING: &str =
    "Facts changed since the summary (the current value first, then what it replaced):";

/// The facts block under `heading` (empty when there are none) within `room` tokens: the
/// facts in the order given (the most important first), as many as fit, each line as [`line`]
/// writes it.
pub fn block<'a>(heading: &str, facts: impl IntoIterator<Item = &'a Fact>, room: u32) -> String {
    let mut used = crate::tokens::estimate_tokens(heading) + 1;
    let mut body = Vec::new();
    for f in facts {
        let l = line(f);
        if l.is_empty() {
            continue;
        }
        let l = format!("- {}", crate::prompt::neutralize(&l));
        let c = crate::tokens::estimate_tokens(&l) + 1;
        if used + c <= room {
            used += c;
            body.push(l);
        }
    }
    if body.is_empty() {
        return String::new();
    }
    format!("{heading}\n{}", body.join("\n"))
}

/// `facts` by their latest change, newest first (what a block keeps first).
pub fn newest_first(facts: &[Fact]) -> Vec<&Fact> {
    let mut v: Vec<&Fact> = facts.iter().collect();
    v.sort_by_key(|f| std::cmp::Reverse(latest(f)));
    v
}

/// The facts a query's terms (the full-text index's, [`crate::search::query`]) name: those
/// sharing the most terms with their person, what they are and their values first, then the
/// newest; a fact sharing none is left out.
pub fn about<'a>(facts: &'a [Fact], query: &[String]) -> Vec<&'a Fact> {
    let mut v: Vec<(usize, u64, &Fact)> = facts
        .iter()
        .filter_map(|f| {
            let values: Vec<&str> = f.values.iter().map(|s| s.value.as_str()).collect();
            let terms = crate::search::terms(&format!("{} {} {}", f.who, f.key, values.join(" ")));
            let shared = query.iter().filter(|q| terms.contains(q)).count();
            (shared > 0).then_some((shared, latest(f), f))
        })
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    v.into_iter().map(|(_, _, f)| f).collect()
}

/// The values of `facts` that no longer hold (none of them is a fact's current value): an
/// identifier list leaves them out, since a bare value reads as current.
pub fn obsolete_values(facts: &[Fact]) -> std::collections::BTreeSet<String> {
    let current: std::collections::BTreeSet<String> = facts
        .iter()
        .filter_map(|f| f.current().map(|c| c.value.to_lowercase()))
        .collect();
    facts
        .iter()
        .flat_map(|f| {
            let upto = if f.ended.is_some() {
                f.values.len()
            } else {
                f.values.len().saturating_sub(1)
            };
            f.values[..upto].iter().map(|s| s.value.to_lowercase())
        })
        .filter(|v| !current.contains(v))
        .collect()
}

/// Lines `- Speaker: text` (an offline summary's, as `extractive` renders them) with a mark
/// after each that states a fact's value no longer current (see [`stale`]); other lines as
/// they are.
pub fn mark_lines(text: &str, facts: &[Fact]) -> String {
    if facts.is_empty() {
        return text.to_string();
    }
    text.lines()
        .map(
            |l| match l.strip_prefix("- ").and_then(|r| r.split_once(": ")) {
                Some((who, said)) => format!("{l}{}", stale(who, said, facts)),
                None => l.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `text`, said by `who`, states of a fact that no longer holds as it says, as a mark
/// after it: ` (earlier; now: Lyon)`, ` (earlier; no longer so)`; empty when it states none.
pub fn stale(who: &str, text: &str, facts: &[Fact]) -> String {
    let mut marks = Vec::new();
    let said = said(who, text);
    // The facts the message states something of: by their key, or by a value they have had
    // (an ending or a change that names only a value).
    let read: Vec<&str> = said
        .iter()
        .filter_map(|s| {
            let named = s.key.strip_prefix(FROM_VALUE).unwrap_or(&s.value);
            facts
                .iter()
                .find(|f| {
                    f.who == who
                        && (f.key == s.key
                            || ((s.key.is_empty() || s.key.starts_with(FROM_VALUE))
                                && f.values.iter().any(|v| names(&v.value, named))))
                })
                .map(|f| f.key.as_str())
        })
        .collect();
    for s in said {
        if s.act != Act::Holds {
            continue;
        }
        let Some(f) = facts.iter().find(|f| f.who == who && f.key == s.key) else {
            continue;
        };
        match f.current() {
            Some(now) if names(&now.value, &s.value) => {}
            Some(now) => marks.push(format!("now: {}", now.value)),
            None => marks.push("no longer so".to_string()),
        }
    }
    // A value the speaker's fact no longer has, named in words the rules do not read ("The
    // blue Volkswagen is parked outside"), unless the message names the value now too.
    for f in facts
        .iter()
        .filter(|f| f.who == who && !read.contains(&f.key.as_str()))
    {
        let now = f.current();
        let earlier = &f.values[..f.values.len() - usize::from(now.is_some())];
        if now.is_some_and(|n| names_in(text, &n.value))
            || !earlier.iter().any(|v| names_in(text, &v.value))
        {
            continue;
        }
        marks.push(match now {
            Some(n) => format!("now: {}", n.value),
            None => "no longer so".to_string(),
        });
    }
    if marks.is_empty() {
        String::new()
    } else {
        format!(" (earlier; {})", marks.join("; "))
    }
}

/// A time as a day (`14 Apr 2025`).
fn day(ms: Option<i64>) -> Option<String> {
    crate::dates::known(ms).map(|t| crate::dates::Day::of_ms(t).render_short())
}

/// The part of an ending's sentence that says it ended, and the value it ended when it
/// names it: the clauses from the one holding the ending's word to the one naming the value
/// (either first), at most sixteen words ("I don't have a car anymore, the green Mini is
/// gone"; not what follows). A sentence that does not name the value is preceded by it ("was
/// Pepper: …").
fn ending_clause(sentence: &str, value: &str) -> String {
    let clauses: Vec<&str> = sentence.split(", ").collect();
    let named = |c: &str| names_in(c, value);
    let end = clauses
        .iter()
        .position(|c| {
            let l = c.to_lowercase();
            ENDINGS.iter().any(|e| l.contains(e))
        })
        .unwrap_or(0);
    let text = match clauses.iter().position(|c| named(c)) {
        Some(v) => clauses[end.min(v)..=end.max(v)].join(", "),
        None if value.is_empty() => clauses[end].to_string(),
        None => format!("was {value}: {}", clauses[end]),
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() > 16 {
        format!("{} …", words[..16].join(" "))
    } else {
        words.join(" ")
    }
}

/// Whether `text` holds `value` as whole words (any case).
fn names_in(text: &str, value: &str) -> bool {
    let t = text.to_lowercase();
    let v = value.to_lowercase();
    !v.is_empty()
        && t.match_indices(&v).any(|(at, _)| {
            !t[..at]
                .chars()
                .next_back()
                .is_some_and(char::is_alphanumeric)
                && !t[at + v.len()..]
                    .chars()
                    .next()
                    .is_some_and(char::is_alphanumeric)
        })
}

/// One fact as a line: the current value first, then what it replaced, dated: `Robin lives
/// in: Lyon (since 14 Apr 2025; before: Porto)`, `Robin's car: none since 3 May 2025 (sold
/// the blue Skoda)`.
pub fn line(f: &Fact) -> String {
    let base = value_line(f);
    match &f.later {
        Some((at, _, sentence)) if !base.is_empty() => {
            let when = day(*at).map(|d| format!(" ({d})")).unwrap_or_default();
            format!("{base}; said later{when}: \"{}\"", clean(sentence, 160))
        }
        _ => base,
    }
}

/// A fact's values as a line (see [`line`]), without what was said later.
fn value_line(f: &Fact) -> String {
    let earlier = |upto: usize| -> String {
        f.values[..upto]
            .iter()
            .rev()
            .map(|s| s.value.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (&f.ended, f.values.last()) {
        (Some((at, _, sentence)), _) => {
            let since = day(*at).map(|d| format!(" since {d}")).unwrap_or_default();
            let last = f.values.last().map_or("", |s| s.value.as_str());
            format!(
                "{} {}: none{since} ({})",
                f.who,
                f.key,
                ending_clause(sentence, last)
            )
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

/// A sentence about `names` (a memory's user or key, "the user", "he", "she") rewritten in the
/// first person, so the rules read "Alice moved to Lyon" as "I moved to Lyon": its subject
/// becomes "I" (and its verb "move"s form of "I"), and the person's possessives "my". A
/// sentence not about them is left as it is.
fn in_first_person(sentence: &str, names: &[&str]) -> String {
    let lower = sentence.to_lowercase();
    let subjects = names
        .iter()
        .map(|n| n.trim().to_lowercase())
        .filter(|n| !n.is_empty())
        .chain(["the user", "user", "he", "she", "they"].map(String::from));
    let mut best: Option<usize> = None;
    for s in subjects {
        if lower.starts_with(&s)
            && lower[s.len()..].starts_with(' ')
            && best.is_none_or(|b| s.len() > b)
        {
            best = Some(s.len());
        }
    }
    let Some(cut) = best else {
        // A possessive opening: "Alice's manager is …", "Her number is …".
        let first = lower.split(' ').next().unwrap_or("");
        let owns = ["her", "his", "their", "user's"].contains(&first)
            || names
                .iter()
                .any(|n| !n.trim().is_empty() && first == format!("{}'s", n.trim().to_lowercase()))
            || lower.starts_with("the user's ");
        if owns {
            let skip = if lower.starts_with("the user's ") {
                2
            } else {
                1
            };
            let rest: Vec<&str> = sentence.split_whitespace().skip(skip).collect();
            return format!("My {}", rest.join(" "));
        }
        return sentence.to_string();
    };
    let mut rest: Vec<String> = sentence[cut..]
        .split_whitespace()
        .map(String::from)
        .collect();
    // The verb after the subject (past adverbs such as "no longer"), in the first person.
    let verb = rest.iter().position(|w| {
        ![
            "no", "longer", "now", "still", "also", "just", "recently", "finally", "never", "only",
        ]
        .contains(&w.to_lowercase().as_str())
    });
    if let Some(v) = verb.and_then(|i| rest.get_mut(i)) {
        let w = v.to_lowercase();
        *v = match w.as_str() {
            "is" => "am".into(),
            "was" => "was".into(),
            "has" => "have".into(),
            "does" => "do".into(),
            "doesn't" => "don't".into(),
            "isn't" => "am not".into(),
            "hasn't" => "haven't".into(),
            _ if w.ends_with("ies") && w.len() > 4 => format!("{}y", &w[..w.len() - 3]),
            _ if ["shes", "ches", "xes", "sses"]
                .iter()
                .any(|e| w.ends_with(e)) =>
            {
                w[..w.len() - 2].to_string()
            }
            _ if w.ends_with('s') && !w.ends_with("ss") && w.len() > 2 => {
                w[..w.len() - 1].to_string()
            }
            _ => v.clone(),
        };
    }
    let owner: Vec<String> = names
        .iter()
        .map(|n| format!("{}'s", n.trim().to_lowercase()))
        .chain(["user's".to_string()])
        .collect();
    for w in rest.iter_mut().skip(1) {
        let l = w.to_lowercase();
        let bare = l.trim_end_matches(|c: char| !c.is_alphanumeric() && c != '\'');
        if ["her", "his", "their"].contains(&bare) || owner.iter().any(|o| o == bare) {
            let tail = &w[bare.len().min(w.len())..];
            *w = format!("my{tail}");
        }
    }
    format!("I {}", rest.join(" "))
}

/// The statements of facts in a memory's text, which may speak of its user (or its key) in
/// the first or the third person ("I moved to Lyon", "Alice moved to Lyon", "The user sold
/// her car").
pub fn said_of(names: &[&str], text: &str) -> Vec<Said> {
    let text = first_page(text).replace('\u{2019}', "'");
    let owner = names.first().copied().unwrap_or("");
    let mut out = Vec::new();
    for sentence in sentences(&text) {
        let s = in_first_person(sentence, names);
        out.extend(said(owner, &s));
    }
    out
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
            (
                "I'm with Marcus now, we met at a friend's party.",
                holds("partner", "Marcus"),
            ),
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
                ends("car", "grey Volvo"),
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
            ("Meet Bruno, our new kitten.", holds("pet", "Bruno")),
            (
                "So long Lyon, I now call Bergen home.",
                holds("lives in", "Bergen"),
            ),
            (
                "We adopted a dog and called him Milo.",
                holds("pet", "Milo"),
            ),
            (
                "I left Initech last Friday and I'm job hunting now.",
                ends("", "Initech"),
            ),
            (
                "We gave Luna to a family with a big garden.",
                ends("", "Luna"),
            ),
            (
                "I report directly to Paul Novak.",
                holds("manager", "Paul Novak"),
            ),
            (
                "We've lived in Bergen since last spring.",
                holds("lives in", "Bergen"),
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
    fn an_event_reads_back_from_its_ledger_text_and_the_block_keeps_the_newest_changes() {
        let e = &ev(4, "We moved to Lyon last weekend!")[0];
        let text = encode(e);
        assert_eq!(decode(&text, 4).as_ref(), Some(e));
        assert_eq!(decode("src/main.rs", 1), None);
        let dirty = Event {
            who: "Ro\u{1e}bin".into(),
            ..e.clone()
        };
        assert_eq!(decode(&encode(&dirty), 4).unwrap().who, "Robin");
        let mut events = ev(1, "I live in Porto.");
        events.extend(ev(2, "I drive a blue Skoda."));
        events.extend(ev(3, "We moved to Lyon!"));
        let facts = timeline(&events);
        let all = block(HEADING, newest_first(&facts), 200);
        assert!(all.starts_with(HEADING), "{all}");
        assert!(all.contains("- Robin lives in: Lyon") && all.contains("- Robin car: blue Skoda"));
        let lyon = all.lines().find(|l| l.contains("Lyon")).unwrap();
        let room =
            crate::tokens::estimate_tokens(HEADING) + crate::tokens::estimate_tokens(lyon) + 2;
        let one = block(HEADING, newest_first(&facts), room);
        assert!(
            one.contains("Lyon") && !one.contains("Skoda"),
            "the newest change first: {one}"
        );
        assert_eq!(block(HEADING, newest_first(&facts), 5), "");
        assert_eq!(
            obsolete_values(&facts).into_iter().collect::<Vec<_>>(),
            ["porto"]
        );
        assert_eq!(
            mark_lines("- Robin: I live in Porto.\n- Robin: hello", &facts),
            "- Robin: I live in Porto. (earlier; now: Lyon)\n- Robin: hello"
        );
        let q = crate::search::query("Where does Robin live now?");
        assert_eq!(about(&facts, &q)[0].key, "lives in");
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
            "Robin lives in: Lyon (since 5 Jan 2025; before: Porto)"
        );
        let car = facts.iter().find(|f| f.key == "car").unwrap();
        assert!(car.current().is_none());
        assert_eq!(
            line(car),
            "Robin car: none since 7 Jan 2025 (I sold the blue Skoda)"
        );
        assert_eq!(
            ending_clause(
                "I don't have a car anymore, the green Mini is gone, sadly",
                "green Mini"
            ),
            "I don't have a car anymore, the green Mini is gone"
        );
        assert_eq!(
            ending_clause(
                "I cancelled my membership, no more Tuesday sessions",
                "Tuesday"
            ),
            "I cancelled my membership, no more Tuesday sessions"
        );
        assert_eq!(
            ending_clause("I sold my car", "red Fiat"),
            "was red Fiat: I sold my car"
        );
        let pet = facts.iter().find(|f| f.key == "pet").unwrap();
        assert!(pet.ended.is_some(), "ended by naming its value");
    }
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    fn one(text: &str) -> Option<(String, String, Act)> {
        said_of(&["alice", "home"], text)
            .into_iter()
            .next()
            .map(|s| (s.key, s.value, s.act))
    }

    #[test]
    fn a_memory_in_the_third_person_states_its_users_facts() {
        let holds = |k: &str, v: &str| Some((k.to_string(), v.to_string(), Act::Holds));
        let ends = |k: &str, v: &str| Some((k.to_string(), v.to_string(), Act::Ends));
        assert_eq!(one("I live in Porto"), holds("lives in", "Porto"));
        assert_eq!(one("Alice lives in Porto"), holds("lives in", "Porto"));
        assert_eq!(one("The user moved to Lyon"), holds("lives in", "Lyon"));
        assert_eq!(one("alice works at Acme"), holds("works at", "Acme"));
        assert_eq!(
            one("Alice's manager is Bob Stone"),
            holds("manager", "Bob Stone")
        );
        assert_eq!(
            one("Her number is 555-123-4567"),
            holds("phone number", "555-123-4567")
        );
        assert_eq!(one("She has a dog named Rex"), holds("pet", "Rex"));
        assert_eq!(one("Alice drives a red Audi"), holds("car", "red Audi"));
        assert_eq!(
            one("Alice reports to Dana Whitfield now"),
            holds("manager", "Dana Whitfield")
        );
        assert_eq!(one("Alice sold her car"), ends("car", ""));
        assert_eq!(
            one("Alice no longer works at Acme"),
            ends("works at", "Acme")
        );
        assert_eq!(one("Biscuit passed away"), ends("", "Biscuit"));
        assert_eq!(
            one("I also lost my job at Door Dash this month"),
            ends("works at", "Door Dash")
        );
        // Travel is no move, and some place is not where one lives.
        assert_eq!(one("I flew from Miami to Los Angeles for the week"), None);
        assert_eq!(
            one("I no longer live in a place where that's possible"),
            None
        );
        assert_eq!(one("Brightline let me go today"), ends("", "Brightline"));
        // A question about a fact takes the fact's words; any other is left alone.
        assert!(with_fact_words("Where does Robin live now?").contains("moved to"));
        assert_eq!(
            with_fact_words("the dark editor theme"),
            "the dark editor theme"
        );
        // A long paste is read for its first page only.
        let long = format!("{} I live in Porto.", "Logs. ".repeat(READ_CHARS));
        assert_eq!(one(&long), None);
        let short = format!("I live in Porto. {}", "Logs. ".repeat(READ_CHARS));
        assert_eq!(one(&short), holds("lives in", "Porto"));
        assert_eq!(
            one("My old phone died, new number is 0612 555 014"),
            holds("phone number", "0612 555 014")
        );
        assert_eq!(one("We found a new home for Bean"), ends("", "Bean"));
        assert_eq!(
            one("I left the choir, so Tuesdays are free"),
            ends("choir day", "Tuesday")
        );
        // Without "I": diary style, and a place that is home now.
        assert_eq!(
            one("Just picked up a blue Skoda from the dealer"),
            holds("car", "blue Skoda")
        );
        assert_eq!(
            one("Work at Acme Freight is busy as always"),
            holds("works at", "Acme Freight")
        );
        assert_eq!(
            one("The move is done: Utrecht is home now"),
            holds("lives in", "Utrecht")
        );
        assert_eq!(one("Paris is home to the Louvre"), None);
        // A change that names the value it replaces.
        assert_eq!(
            one("I moved from Blue Harbor to Wayne Health"),
            holds("=Blue Harbor", "Wayne Health")
        );
        assert_eq!(
            one("We finally left Valencia, we're in Split now"),
            holds("=Valencia", "Split")
        );
        // About someone else, or no fact: nothing.
        assert_eq!(one("Bob lives in Rome"), None);
        assert_eq!(one("Alice prefers the dark theme"), None);
    }
}

#[cfg(test)]
mod weak_ending_tests {
    use super::*;

    fn lines(said: &[&str]) -> Vec<Fact> {
        let evs: Vec<Event> = said
            .iter()
            .enumerate()
            .flat_map(|(i, t)| events("Robin", t, i as u64 + 1, None))
            .collect();
        timeline(&evs)
    }

    #[test]
    fn a_loose_ending_ends_only_the_value_it_names_while_it_holds() {
        let f = lines(&[
            "My girlfriend Rosie says hi.",
            "Things with Rosie are finished.",
        ]);
        assert!(f[0].ended.is_some(), "{f:?}");
        // Another name, or a value the fact no longer has, ends nothing.
        let f = lines(&[
            "My girlfriend Rosie says hi.",
            "Things with Anna are finished.",
        ]);
        assert!(f[0].ended.is_none(), "{f:?}");
        let f = lines(&[
            "I drive a blue Skoda.",
            "My old blue Skoda got scrapped, no regrets.",
        ]);
        assert!(f[0].ended.is_some(), "{f:?}");
        let f = lines(&["We have a dog named Max.", "We lost Max to old age."]);
        assert!(f[0].ended.is_some(), "{f:?}");
    }
}

#[cfg(test)]
mod reading_tests {
    use super::*;

    /// Robin's facts after `said`, one message a day: (key, values, ended).
    fn after(said: &[&str]) -> Vec<(String, Vec<String>, bool)> {
        let evs: Vec<Event> = said
            .iter()
            .enumerate()
            .flat_map(|(i, t)| events("Robin", t, i as u64 + 1, Some(i as i64 * 86_400_000)))
            .collect();
        timeline(&evs)
            .into_iter()
            .map(|f| {
                let ended = f.ended.is_some();
                (
                    f.key,
                    f.values.into_iter().map(|s| s.value).collect(),
                    ended,
                )
            })
            .collect()
    }

    fn fact(key: &str, values: &[&str], ended: bool) -> (String, Vec<String>, bool) {
        (
            key.to_string(),
            values.iter().map(|v| v.to_string()).collect(),
            ended,
        )
    }

    #[test]
    fn a_phrase_is_read_in_any_of_its_regular_forms() {
        assert!(inflects("partner", "partners"));
        assert!(inflects("move", "moved"));
        assert!(inflects("move", "moving"));
        assert!(inflects("work", "works"));
        assert!(!inflects("car", "card"), "short words only as they are");
        assert!(!inflects("new", "news"));
        assert_eq!(
            after(&["Marie and I have become partners."]),
            vec![fact("partner", &["Marie"], false)]
        );
    }

    #[test]
    fn an_organisation_is_an_employer_whatever_the_words_around_it() {
        assert_eq!(
            after(&[
                "I do accounting for Horizon Retail.",
                "I moved over to Birchwood Bank this month.",
                "Another day at Ironclad Security.",
            ]),
            vec![fact(
                "works at",
                &["Horizon Retail", "Birchwood Bank", "Ironclad Security"],
                false
            )]
        );
        // Never a place, a partner or a pet.
        assert_eq!(
            after(&["I'm with Silverline Media from today, wish me luck."]),
            vec![fact("works at", &["Silverline Media"], false)]
        );
        // A car is no employer ("to the office").
        assert_eq!(
            after(&["I drive a white Toyota to the office."]),
            vec![fact("car", &["white Toyota"], false)]
        );
    }

    #[test]
    fn a_statement_of_no_one_else_is_the_speakers() {
        assert_eq!(
            after(&["First day at Meridian Bank went well, everyone's friendly."]),
            vec![fact("works at", &["Meridian Bank"], false)]
        );
        assert_eq!(
            after(&["Update: new place in Tampa!"]),
            vec![fact("lives in", &["Tampa"], false)]
        );
        assert_eq!(
            after(&["Texts to 555 201 3344 please."]),
            vec![fact("phone number", &["555 201 3344"], false)]
        );
        assert_eq!(
            after(&["We're Avignon-based now, the move is done."]),
            vec![fact("lives in", &["Avignon"], false)]
        );
        // Said of someone else: by a name as its subject, or in the third person.
        assert_eq!(after(&["Bob lives in Rome."]), vec![]);
        assert_eq!(after(&["She moved to Lyon last week."]), vec![]);
        // A heading is not a name: "Official: Jake …".
        assert_eq!(
            after(&["Official: Jake is my boyfriend."]),
            vec![fact("partner", &["Jake"], false)]
        );
    }

    #[test]
    fn a_change_and_an_ending_in_the_words_people_use() {
        assert_eq!(
            after(&[
                "I have been married to Anton for nine years.",
                "Met Jonas at a friend's wedding and we're together now.",
            ]),
            vec![fact("partner", &["Anton", "Jonas"], false)]
        );
        assert_eq!(
            after(&[
                "My line manager, Eleanor Voss, is very supportive.",
                "Peter Lang has taken over from Eleanor Voss as head of my team.",
            ]),
            vec![fact("manager", &["Eleanor Voss", "Peter Lang"], false)]
        );
        assert_eq!(
            after(&[
                "I rent a flat in Bergen.",
                "The lease in Bergen ran out, so we found a place in Odense.",
            ]),
            vec![fact("lives in", &["Bergen", "Odense"], false)]
        );
        assert_eq!(
            after(&[
                "Reach me at 0644 551 200 any evening.",
                "Call 0152 987 6543 from now on, the old one is cancelled.",
            ]),
            vec![fact(
                "phone number",
                &["0644 551 200", "0152 987 6543"],
                false
            )]
        );
        // The new value is the one after the renewal's word; with none, the ending stands.
        assert_eq!(
            after(&[
                "I drive a red Fiat.",
                "I sold the red Fiat, I take the bus now."
            ]),
            vec![fact("car", &["red Fiat"], true)]
        );
        assert_eq!(
            after(&[
                "Our bunny Rusty chewed the charger.",
                "We have a new kitten! Pixel!",
                "Welcome to the family, Gizmo the hamster.",
                "Gizmo crossed the rainbow bridge.",
            ]),
            vec![fact("pet", &["Rusty", "Pixel", "Gizmo"], true)]
        );
        // "Put down roots" puts no pet down; "a couple of days" is no couple.
        assert_eq!(
            after(&["We put down roots in Szeged when the children were born."]),
            vec![fact("lives in", &["Szeged"], false)]
        );
        assert_eq!(
            after(&["I flew from Miami to Turks and Caicos for a couple of days."]),
            vec![]
        );
    }

    #[test]
    fn an_activity_keeps_its_day_whatever_it_is_set_in() {
        assert_eq!(
            after(&[
                "Bowling league on Mondays.",
                "League night is Wednesday now.",
                "They moved choir practice to Saturday.",
                "Done with bowling.",
            ]),
            vec![
                fact("bowling day", &["Monday", "Wednesday"], true),
                fact("choir day", &["Saturday"], false),
            ]
        );
    }

    #[test]
    fn what_no_rule_reads_is_shown_as_said_later() {
        let evs: Vec<Event> = [
            "My manager is Tina Marsh.",
            "Tina Marsh is out, Gary Hughes is in charge of the team now.",
        ]
        .iter()
        .enumerate()
        .flat_map(|(i, t)| events("Robin", t, i as u64 + 1, Some(1_735_689_600_000)))
        .collect();
        let facts = timeline(&evs);
        assert_eq!(facts.len(), 1, "{facts:?}");
        let l = line(&facts[0]);
        assert_eq!(
            l,
            "Robin manager: Tina Marsh; said later (1 Jan 2025): \"Tina Marsh is out, Gary \
             Hughes is in charge of the team now\""
        );
        // A later statement the rules read replaces it.
        let mut evs = evs;
        evs.extend(events("Robin", "My manager is Gary Hughes.", 3, None));
        let facts = timeline(&evs);
        assert!(facts[0].later.is_none(), "{facts:?}");
        // It survives the ledger.
        let back: Vec<Event> = evs
            .iter()
            .filter_map(|e| decode(&encode(e), e.episode))
            .collect();
        assert_eq!(back, evs);
    }

    #[test]
    fn a_quoted_earlier_value_is_marked_even_in_words_no_rule_reads() {
        let facts = timeline(
            &[
                "I drive a blue Volkswagen.",
                "Bought a green Renault last weekend.",
            ]
            .iter()
            .enumerate()
            .flat_map(|(i, t)| events("Robin", t, i as u64 + 1, None))
            .collect::<Vec<_>>(),
        );
        assert_eq!(
            stale("Robin", "The blue Volkswagen is parked outside.", &facts),
            " (earlier; now: green Renault)"
        );
        assert_eq!(
            stale("Robin", "The green Renault is parked outside.", &facts),
            ""
        );
        // A statement of the change or of an ending is no earlier value.
        assert_eq!(
            stale(
                "Robin",
                "I swapped the blue Volkswagen for a green Renault.",
                &facts
            ),
            ""
        );
        let ended = timeline(&events("Robin", "I sold the green Renault.", 1, None));
        assert_eq!(stale("Robin", "I sold the green Renault.", &ended), "");
    }
}
