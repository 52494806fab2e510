//! Dates as people write them: the calendar day of a timestamp, relative dates ("yesterday",
//! "last Saturday", "next month") resolved against the time a message was said, and the
//! written dates a ledger keeps ("8 May, 2023", "May 8th", "2023-05-08"). Pure arithmetic on
//! the proleptic Gregorian calendar in UTC; no clock is read here.

/// A calendar day.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Day {
    /// Year.
    pub year: i64,
    /// Month, 1–12.
    pub month: u32,
    /// Day of the month, 1–31.
    pub day: u32,
}

/// Month names, January first.
pub const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Weekday names, Sunday first.
pub(crate) const WEEKDAYS: [&str; 7] = [
    "sunday",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
];

/// Milliseconds in a day.
pub const MS_PER_DAY: i64 = 86_400_000;

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`); the one copy
/// of it (the transcript's timestamp reader uses it too).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a count of days since 1970-01-01 (`civil_from_days`).
fn civil_from_days(z: i64) -> Day {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    Day { year, month, day }
}

impl Day {
    /// The UTC day of a timestamp in ms since the epoch.
    pub fn of_ms(ms: i64) -> Day {
        civil_from_days(ms.div_euclid(MS_PER_DAY))
    }

    fn days(self) -> i64 {
        days_from_civil(self.year, self.month, self.day)
    }

    /// This day moved by `n` days.
    pub fn plus(self, n: i64) -> Day {
        civil_from_days(self.days() + n)
    }

    /// 0 for Sunday … 6 for Saturday.
    pub fn weekday(self) -> usize {
        (self.days() + 4).rem_euclid(7) as usize
    }

    /// "8 May 2023".
    pub fn render(self) -> String {
        format!(
            "{} {} {}",
            self.day,
            MONTHS[(self.month - 1) as usize],
            self.year
        )
    }

    /// "8 May 2023", "14 Apr 2025": the month's first three letters.
    pub fn render_short(self) -> String {
        let m = MONTHS[(self.month - 1) as usize];
        format!("{} {} {}", self.day, &m[..3], self.year)
    }

    /// "May 2023" for the month `delta` months away.
    fn month_name(self, delta: i64) -> String {
        let m = self.year * 12 + i64::from(self.month) - 1 + delta;
        format!("{} {}", MONTHS[m.rem_euclid(12) as usize], m.div_euclid(12))
    }
}

/// Small numbers written as words ("two days ago").
fn count_word(w: &str) -> Option<i64> {
    Some(match w {
        "a" | "an" | "one" => 1,
        "two" | "couple" => 2,
        "three" | "few" => 3,
        "four" => 4,
        "five" => 5,
        "six" => 6,
        "seven" => 7,
        "eight" => 8,
        "nine" => 9,
        "ten" => 10,
        _ => return w.parse().ok().filter(|n| (1..=1000).contains(n)),
    })
}

/// A word of `text`: its lower-case letters and digits and where it ends.
struct Word {
    text: String,
    end: usize,
}

fn words(text: &str) -> Vec<Word> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut end = 0;
    for (i, c) in text.char_indices() {
        if c.is_alphanumeric() {
            cur.extend(c.to_lowercase());
            end = i + c.len_utf8();
        } else if !cur.is_empty() {
            out.push(Word {
                text: std::mem::take(&mut cur),
                end,
            });
        }
    }
    if !cur.is_empty() {
        out.push(Word { text: cur, end });
    }
    out
}

/// What a relative phrase starting at word `i` means on `day`: the words it spans and the
/// absolute date it stands for.
fn relative_at(w: &[Word], i: usize, day: Day) -> Option<(usize, String)> {
    let at = |k: usize| w.get(i + k).map(|x| x.text.as_str()).unwrap_or("");
    let week = |dir: &str| format!("the week {dir} {}", day.render());
    match at(0) {
        "yesterday" => return Some((1, day.plus(-1).render())),
        "today" | "tonight" => return Some((1, day.render())),
        "tomorrow" => return Some((1, day.plus(1).render())),
        _ => {}
    }
    if at(0) == "this" {
        return match at(1) {
            "morning" | "afternoon" | "evening" => Some((2, day.render())),
            "month" => Some((2, day.month_name(0))),
            "year" => Some((2, day.year.to_string())),
            _ => None,
        };
    }
    if at(0) == "last" || at(0) == "next" {
        let back = at(0) == "last";
        let dir = if back { "before" } else { "after" };
        let sign = if back { -1 } else { 1 };
        return match at(1) {
            "night" if back => Some((2, day.plus(-1).render())),
            "week" => Some((2, week(dir))),
            "weekend" => Some((2, format!("the weekend {dir} {}", day.render()))),
            "month" => Some((2, day.month_name(sign))),
            "year" => Some((2, (day.year + sign).to_string())),
            d => {
                let target = WEEKDAYS.iter().position(|x| *x == d)?;
                let today = day.weekday() as i64;
                let delta = if back {
                    -((today - target as i64 - 1).rem_euclid(7) + 1)
                } else {
                    (target as i64 - today - 1).rem_euclid(7) + 1
                };
                Some((2, day.plus(delta).render()))
            }
        };
    }
    // "two days ago", "a few weeks ago", "a couple of months ago".
    let mut k = 0;
    if matches!(at(0), "a" | "an") && matches!(at(1), "few" | "couple") {
        k = 1;
    }
    let n = count_word(at(k))?;
    let mut unit_at = k + 1;
    if at(unit_at) == "of" {
        unit_at += 1;
    }
    let unit = at(unit_at);
    if at(unit_at + 1) != "ago" {
        return None;
    }
    let span = unit_at + 2;
    match unit.trim_end_matches('s') {
        "day" => Some((span, day.plus(-n).render())),
        "week" => Some((span, format!("about {}", day.plus(-7 * n).render()))),
        "month" => Some((span, day.month_name(-n))),
        "year" => Some((span, (day.year - n).to_string())),
        _ => None,
    }
}

/// A message's time when it has one: a time of 0 or before is a missing one (a store
/// default), not 1 January 1970.
pub fn known(ms: Option<i64>) -> Option<i64> {
    ms.filter(|&t| t > 0)
}

/// `text` with each relative date it names followed by the absolute one it stands for, as
/// said at `ms`: "I went yesterday" → "I went yesterday (= 7 May 2023)". Unchanged without a
/// time.
pub fn resolve(text: &str, ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return text.to_string();
    };
    let day = Day::of_ms(ms);
    let w = words(text);
    let mut out = String::with_capacity(text.len() + 24);
    let mut copied = 0;
    let mut i = 0;
    while i < w.len() {
        match relative_at(&w, i, day) {
            Some((span, date)) => {
                let end = w[i + span - 1].end;
                out.push_str(&text[copied..end]);
                out.push_str(&format!(" (= {date})"));
                copied = end;
                i += span;
            }
            None => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// A month's or weekday's name or abbreviation ("May", "Saturday", "Fri", "Tues"): a date's
/// word, not a name's.
pub fn is_calendar_word(w: &str) -> bool {
    const SHORT: &[&str] = &[
        "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun",
    ];
    month_of(w).is_some()
        || weekday_of(w).is_some()
        || SHORT.contains(&w.to_lowercase().trim_end_matches('.'))
}

/// The weekday a weekday's name names ("Saturday", "saturday"; not abbreviations).
fn weekday_of(w: &str) -> Option<usize> {
    let w = w.to_lowercase();
    WEEKDAYS
        .iter()
        .position(|d| *d == w || format!("{d}s") == w)
}

/// The month a capitalised month name or abbreviation names ("May", "Sept.", "Jan").
fn month_of(w: &str) -> Option<u32> {
    if !w.chars().next().is_some_and(char::is_uppercase) {
        return None;
    }
    let w = w.to_lowercase();
    let w = w.trim_end_matches('.');
    if w.len() < 3 {
        return None;
    }
    MONTHS
        .iter()
        .position(|m| {
            // (`w` is lower case, the months ASCII: no copy of each month is made.)
            let (m, b) = (m.as_bytes(), w.as_bytes());
            m.eq_ignore_ascii_case(b)
                || (b.len() == 3 && m.len() >= 3 && m[..3].eq_ignore_ascii_case(b))
                || (w == "sept" && m.eq_ignore_ascii_case(b"september"))
        })
        .map(|i| i as u32 + 1)
}

fn day_number(w: &str) -> Option<u32> {
    // A number opens with a digit (or the sign `parse` accepts): most words end here.
    if !w.starts_with(|c: char| c.is_ascii_digit() || c == '+') {
        return None;
    }
    let w = w.to_lowercase();
    let digits = w
        .strip_suffix("st")
        .or_else(|| w.strip_suffix("nd"))
        .or_else(|| w.strip_suffix("rd"))
        .or_else(|| w.strip_suffix("th"))
        .unwrap_or(&w);
    let n: u32 = digits.parse().ok()?;
    (1..=31).contains(&n).then_some(n)
}

fn year_number(w: &str) -> Option<i64> {
    (w.len() == 4 && w.chars().all(|c| c.is_ascii_digit()))
        .then(|| w.parse().ok())
        .flatten()
        .filter(|y| (1000..=2999).contains(y))
}

/// The dates written out in `text` ("8 May, 2023", "8 May", "May 8th", "May 8, 2023",
/// "May 2023"), verbatim as written (trailing commas trimmed), in order, each once. ISO and
/// numeric dates are the ledger's token rule's.
pub fn written(text: &str) -> Vec<String> {
    let toks: Vec<(usize, usize)> = {
        let mut v = Vec::new();
        let mut start = None;
        for (i, c) in text.char_indices() {
            if c.is_whitespace() {
                if let Some(s) = start.take() {
                    v.push((s, i));
                }
            } else if start.is_none() {
                start = Some(i);
            }
        }
        if let Some(s) = start {
            v.push((s, text.len()));
        }
        v
    };
    let word = |k: usize| -> &str {
        toks.get(k)
            .map(|&(a, b)| text[a..b].trim_matches(|c: char| !c.is_alphanumeric()))
            .unwrap_or("")
    };
    let mut out: Vec<String> = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        let span = if day_number(word(k)).is_some() && month_of(word(k + 1)).is_some() {
            // 8 May[,] [2023]
            Some(if year_number(word(k + 2)).is_some() {
                3
            } else {
                2
            })
        } else if month_of(word(k)).is_some() {
            if day_number(word(k + 1)).is_some() {
                // May 8th[,] [2023]
                Some(if year_number(word(k + 2)).is_some() {
                    3
                } else {
                    2
                })
            } else if year_number(word(k + 1)).is_some() {
                Some(2)
            } else {
                None
            }
        } else {
            None
        };
        match span {
            Some(n) => {
                let (a, _) = toks[k];
                let (_, b) = toks[k + n - 1];
                let s = text[a..b]
                    .trim_matches(|c: char| !c.is_alphanumeric())
                    .to_string();
                if !out.contains(&s) {
                    out.push(s);
                }
                k += n;
            }
            None => k += 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 May 2023, 13:56 UTC (a Monday).
    const MAY_8: i64 = 1_683_554_160_000;

    #[test]
    fn calendar_arithmetic() {
        let d = Day::of_ms(MAY_8);
        assert_eq!(
            d,
            Day {
                year: 2023,
                month: 5,
                day: 8
            }
        );
        assert_eq!(d.render(), "8 May 2023");
        assert_eq!(WEEKDAYS[d.weekday()], "monday");
        assert_eq!(d.plus(-8).render(), "30 April 2023");
        assert_eq!(Day::of_ms(0).render(), "1 January 1970");
        assert_eq!(Day::of_ms(951_782_400_000).render(), "29 February 2000");
        assert_eq!(d.month_name(-5), "December 2022");
    }

    #[test]
    fn relative_dates_are_resolved_against_the_time_said() {
        let r = |t: &str| resolve(t, Some(MAY_8));
        assert_eq!(
            r("I went to a support group yesterday."),
            "I went to a support group yesterday (= 7 May 2023)."
        );
        assert_eq!(
            r("Last Saturday we ran a charity race"),
            "Last Saturday (= 6 May 2023) we ran a charity race"
        );
        assert_eq!(
            r("see you next Monday"),
            "see you next Monday (= 15 May 2023)"
        );
        assert_eq!(
            r("We moved two years ago, and next month I start."),
            "We moved two years ago (= 2021), and next month (= June 2023) I start."
        );
        assert_eq!(
            r("last week I painted"),
            "last week (= the week before 8 May 2023) I painted"
        );
        assert_eq!(
            r("a couple of days ago"),
            "a couple of days ago (= 6 May 2023)"
        );
        assert_eq!(r("the last one"), "the last one");
        assert_eq!(resolve("yesterday", None), "yesterday");
    }

    #[test]
    fn written_dates_are_found() {
        assert_eq!(
            written(
                "(conversation of 1:56 pm on 8 May, 2023) and May 8th, and in March 2022; may I?"
            ),
            vec!["8 May, 2023", "May 8th", "March 2022"]
        );
        assert_eq!(written("on 25 May"), vec!["25 May"]);
        assert!(written("I may go. 3 may come").is_empty());
    }
}
