//! The console's pages: askama templates (`host/templates/console/`, HTML-escaped by default)
//! over display records made from the API's answers, and the formatting they share.

use askama::Template;

use super::client::{self, enc};

/// What every page has: its title, the current section, the form token, a notice.
pub(crate) struct Layout {
    pub title: String,
    /// `sessions`, `jobs`, `memories`, `usage` or empty.
    pub nav: &'static str,
    /// The hidden field every form posts (see `super::csrf_of`).
    pub csrf: String,
    /// Whether the visitor signed in with a token (else the server is open on loopback).
    pub signed_in: bool,
    /// A line shown above the content (what the last action did).
    pub notice: Option<String>,
}

/// A number with thousands separators.
pub(crate) fn num(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count for people.
pub(crate) fn bytes(n: u64) -> String {
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        _ => format!("{:.1} MB", n as f64 / 1e6),
    }
}

/// A time as `YYYY-MM-DD HH:MM UTC`.
pub(crate) fn at(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(t) => t.strftime("%Y-%m-%d %H:%M UTC").to_string(),
        Err(_) => "—".into(),
    }
}

/// How long ago (or, for a future time, in how long) `ms` is from `now`.
pub(crate) fn ago(ms: i64, now: u64) -> String {
    let d = now as i64 - ms;
    let s = d.unsigned_abs() / 1000;
    let span = match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    };
    if d >= 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// A time and how long ago it was.
pub(crate) fn when(ms: Option<i64>, now: u64) -> String {
    ms.map_or_else(|| "—".into(), |ms| format!("{} ({})", at(ms), ago(ms, now)))
}

/// A session's state in words: the state, and for a waiting or backing-off one, until when.
pub(crate) fn state_text(s: &client::Session, now: u64) -> String {
    let label = match s.state.as_str() {
        "backing-off" => "backing off",
        "gave-up" => "gave up",
        other => other,
    };
    match (s.state.as_str(), s.due_at_ms) {
        ("waiting" | "backing-off", Some(due)) => {
            format!(
                "{label} until {} ({})",
                at(due as i64),
                ago(due as i64, now)
            )
        }
        _ => label.to_string(),
    }
}

/// The console's link to a session.
pub(crate) fn session_href(id: &str) -> String {
    format!("/sessions/{}", enc(id))
}

/// One line of the sessions list.
pub(crate) struct SessionLine {
    pub id: String,
    /// Title and project folder, when known.
    pub label: String,
    pub href: String,
    pub state: String,
    pub state_text: String,
    pub reason: String,
    pub mode: String,
    pub messages: String,
    pub last_activity: String,
    pub tokens_saved: String,
    pub history_tokens: String,
}

impl SessionLine {
    pub fn new(s: &client::Session, now: u64) -> Self {
        SessionLine {
            id: s.id.clone(),
            label: s.label(),
            href: session_href(&s.id),
            state: s.state.clone(),
            state_text: state_text(s, now),
            reason: s.reason.clone(),
            mode: if s.own_mode {
                s.mode.clone()
            } else {
                format!("{} (server)", s.mode)
            },
            messages: num(s.episodes),
            last_activity: s
                .last_activity_ms
                .map_or_else(|| "—".into(), |ms| ago(ms, now)),
            tokens_saved: num(s.tokens_saved),
            history_tokens: num(s.history_tokens),
        }
    }
}

/// The sessions list.
#[derive(Template)]
#[template(path = "console/sessions.html")]
pub(crate) struct SessionsPage {
    pub layout: Layout,
    pub q: String,
    pub lines: Vec<SessionLine>,
    pub total: usize,
    pub first: usize,
    pub last: usize,
    pub prev: Option<String>,
    pub next: Option<String>,
}

/// A summary row as a card.
pub(crate) struct Card {
    pub id: u64,
    pub range: String,
    pub level: u32,
    pub skipped: Vec<String>,
    pub last_exchange: String,
    pub transcript: String,
    pub messages: String,
    pub model: String,
    pub tokens: String,
    pub prompt_tokens: String,
    pub output_tokens: String,
    pub identifiers: usize,
    pub content: String,
}

impl Card {
    pub fn new(r: &abridge_app::SummaryView, now: u64) -> Self {
        let c = r.coverage.as_ref();
        Card {
            id: r.id,
            range: if r.first_episode == r.last_episode {
                format!("Episode {}", r.first_episode)
            } else {
                format!("Episodes {}–{}", r.first_episode, r.last_episode)
            },
            level: r.level,
            skipped: r
                .skipped
                .iter()
                .map(|[a, b]| {
                    if a == b {
                        a.to_string()
                    } else {
                        format!("{a}–{b}")
                    }
                })
                .collect(),
            last_exchange: when(c.and_then(|c| c.last_exchange_ms), now),
            transcript: c.map_or_else(|| "—".into(), |c| bytes(c.transcript_bytes)),
            messages: c.map_or_else(|| "—".into(), |c| num(c.messages)),
            model: r.model.clone(),
            tokens: num(u64::from(r.tokens)),
            prompt_tokens: num(u64::from(r.prompt_tokens)),
            output_tokens: num(u64::from(r.output_tokens)),
            identifiers: r.ledger.len(),
            content: r.content.clone(),
        }
    }
}

/// A session's summary chain (a part of the session page, also served alone so the page
/// can replace it after a refresh).
#[derive(Template)]
#[template(path = "console/chain.html")]
pub(crate) struct ChainPart {
    pub cards: Vec<Card>,
    pub covered: u64,
    pub episodes: u64,
}

/// A stored message and the row that covers it.
pub(crate) struct MessageLine {
    pub id: u64,
    pub role: String,
    pub speaker: Option<String>,
    pub time: String,
    pub tokens: u32,
    pub covered_by: Option<u64>,
    pub content: String,
}

/// The context preview.
pub(crate) struct Preview {
    pub tokens: String,
    pub saving: String,
    pub covered: u64,
    pub recent: u32,
    pub omitted: Vec<String>,
    pub messages: Vec<(String, String)>,
    pub refresh_pending: bool,
}

impl Preview {
    pub fn new(c: &client::Context) -> Self {
        Preview {
            tokens: num(u64::from(c.tokens)),
            saving: format!("{:.1}", c.saving_percent),
            covered: c.covered,
            recent: c.recent,
            omitted: c
                .omitted_ranges
                .iter()
                .map(|[a, b]| format!("{a}–{b}"))
                .collect(),
            messages: c
                .messages
                .iter()
                .map(|m| (m.role.clone(), m.content.clone()))
                .collect(),
            refresh_pending: c.refresh_pending,
        }
    }
}

/// A job with its progress bar.
pub(crate) struct JobLine {
    pub id: u64,
    pub session: String,
    pub session_href: String,
    pub state: String,
    pub stage: String,
    pub done: u32,
    pub total: u32,
    pub percent: u32,
    pub eta: String,
    pub attempts: u32,
    pub error: Option<String>,
    pub cancellable: bool,
    pub created: String,
    pub finished: Option<String>,
    pub target: u64,
}

impl JobLine {
    pub fn new(j: &client::Job, now: u64) -> Self {
        let p = &j.progress;
        let finished = j.state == "succeeded";
        let (done, total) = if finished {
            (p.total.max(1), p.total.max(1))
        } else {
            (p.done.min(p.total), p.total)
        };
        let percent = (done * 100).checked_div(total).unwrap_or(0);
        // The rate so far, applied to what is left of the stage in hand.
        let eta = match (j.state.as_str(), j.started_ms) {
            ("running", Some(start)) if done > 0 && done < total => {
                let per = now.saturating_sub(start) / u64::from(done);
                format!(
                    "about {} s left",
                    (per * u64::from(total - done)).div_ceil(1000)
                )
            }
            ("running", _) => "estimating…".into(),
            _ => String::new(),
        };
        JobLine {
            id: j.id,
            session: j.session.clone(),
            session_href: session_href(&j.session),
            state: j.state.clone(),
            stage: if p.level == 0 {
                p.stage.clone()
            } else {
                format!("{} (level {})", p.stage, p.level)
            },
            done,
            total,
            percent,
            eta,
            attempts: j.attempts,
            error: j.error.clone(),
            cancellable: matches!(j.state.as_str(), "queued" | "running") && !j.cancel_requested,
            created: when(Some(j.created_ms as i64), now),
            finished: j.finished_ms.map(|ms| when(Some(ms as i64), now)),
            target: j.target,
        }
    }
}

/// One session.
#[derive(Template)]
#[template(path = "console/session.html")]
pub(crate) struct SessionPage {
    pub layout: Layout,
    pub s: client::Session,
    pub href: String,
    pub state_text: String,
    pub last_activity: String,
    pub history_tokens: String,
    pub summary_tokens: String,
    pub tokens_saved: String,
    pub backlog_tokens: String,
    /// The rendered [`ChainPart`].
    pub chain: String,
    pub messages: Vec<MessageLine>,
    pub messages_total: u64,
    pub messages_next: Option<String>,
    pub messages_first: Option<String>,
    pub budget: u32,
    pub preview: Option<Preview>,
    pub preview_error: Option<String>,
    pub job: Option<JobLine>,
}

/// The reset confirmation.
#[derive(Template)]
#[template(path = "console/reset.html")]
pub(crate) struct ResetPage {
    pub layout: Layout,
    pub s: client::Session,
    pub href: String,
    pub summaries: usize,
}

/// The jobs list.
#[derive(Template)]
#[template(path = "console/jobs.html")]
pub(crate) struct JobsPage {
    pub layout: Layout,
    pub jobs: Vec<JobLine>,
    pub next: Option<String>,
}

/// A memory as listed under a cluster.
pub(crate) struct MemoryLine {
    pub id: String,
    pub text: String,
    pub importance: String,
    pub created: String,
    /// The memory that replaced it.
    pub replaced_by: Option<String>,
}

impl MemoryLine {
    pub fn new(m: &client::Memory, now: u64) -> Self {
        MemoryLine {
            id: m.id.clone(),
            text: m.text.clone(),
            importance: format!("{:.2}", m.importance),
            created: when(Some(m.created_ms as i64), now),
            replaced_by: m.superseded_by.clone(),
        }
    }
}

/// A memory in the flat list: its text, whose it is, its key and cluster.
pub(crate) struct FlatMemory {
    pub id: String,
    pub text: String,
    pub user: String,
    pub kind: String,
    pub key: String,
    pub cluster: u64,
    pub created: String,
    /// The delete form's action.
    pub delete: String,
    /// The memory that replaced it.
    pub replaced_by: Option<String>,
}

impl FlatMemory {
    pub fn new(m: &client::Memory, now: u64) -> Self {
        FlatMemory {
            delete: format!("/memories/{}/delete", enc(&m.id)),
            id: m.id.clone(),
            text: m.text.clone(),
            user: m.user.clone(),
            kind: m.kind.clone(),
            key: m.key.clone(),
            cluster: m.cluster,
            created: when(Some(m.created_ms as i64), now),
            replaced_by: m.superseded_by.clone(),
        }
    }
}

/// A cluster with its summary and sources.
pub(crate) struct ClusterCard {
    pub id: u64,
    pub kind: String,
    pub key: String,
    pub summary: Option<String>,
    pub importance: String,
    pub model: String,
    pub updated: String,
    pub note: Option<String>,
    pub sources: Vec<MemoryLine>,
}

/// The clusters of one scope.
pub(crate) struct ScopeGroup {
    pub title: String,
    pub summarized: Vec<ClusterCard>,
    pub sparse: Vec<ClusterCard>,
}

/// A recall result.
pub(crate) struct RecallLine {
    pub kind: String,
    pub id: String,
    pub text: String,
    pub score: String,
    pub importance: String,
    pub sources: Vec<String>,
    /// The memory that replaced it.
    pub superseded_by: Option<String>,
}

/// Memories and clusters.
#[derive(Template)]
#[template(path = "console/memories.html")]
pub(crate) struct MemoriesPage {
    pub layout: Layout,
    pub user: String,
    pub project: String,
    pub q: String,
    pub groups: Vec<ScopeGroup>,
    pub clusters: usize,
    pub shown: usize,
    pub more: Option<String>,
    pub recall: Option<Vec<RecallLine>>,
    pub recall_error: Option<String>,
    /// Every memory of the filter, newest first (at most [`super::MEMORIES`]), and how many
    /// there are.
    pub all: Vec<FlatMemory>,
    pub all_total: usize,
}

/// A bar of the usage chart, in SVG user units.
pub(crate) struct Bar {
    pub x: u32,
    pub y: u32,
    pub h: u32,
    pub label: String,
}

/// A day of the usage table.
pub(crate) struct DayLine {
    pub day: String,
    pub calls: String,
    pub prompt_tokens: String,
    pub output_tokens: String,
    pub cost: String,
}

/// Usage against the ceiling.
#[derive(Template)]
#[template(path = "console/usage.html")]
pub(crate) struct UsagePage {
    pub layout: Layout,
    pub month: String,
    pub calls: String,
    pub tokens: String,
    pub cost: String,
    pub ceiling: String,
    pub spent_percent: Option<u32>,
    pub exhausted: bool,
    pub resets: String,
    pub days: Vec<DayLine>,
    pub chart: Chart,
}

/// The usage chart: tokens per day as bars, the month's running total as a line, and the
/// ceiling, all on one scale.
pub(crate) struct Chart {
    pub width: u32,
    pub height: u32,
    pub bars: Vec<Bar>,
    pub bar_width: u32,
    /// The running total's polyline points.
    pub line: String,
    /// The ceiling's height, when there is one.
    pub ceiling_y: Option<u32>,
    pub max_label: String,
    pub summary: String,
    /// The date axis: a tick under the 1st, 8th, 15th, 22nd and the last day, labelled
    /// ("1 Nov").
    pub ticks: Vec<Tick>,
}

/// A date on the usage chart's axis.
pub(crate) struct Tick {
    pub x: u32,
    pub label: String,
}

impl Chart {
    /// Chart `days` (day of month 1..=31, tokens) of a month of `len` days under `ceiling`;
    /// `month` names it on the date axis ("Nov").
    pub fn new(days: &[(u32, u64)], len: u32, ceiling: Option<u64>, month: &str) -> Self {
        let (width, height, top, base) = (640u32, 240u32, 16u32, 220u32);
        let step = width / len.max(1);
        let total: u64 = days.iter().map(|d| d.1).sum();
        let max = total.max(ceiling.unwrap_or(0)).max(1);
        let scale = |v: u64| ((base - top) as f64 * v as f64 / max as f64).round() as u32;
        let bars = days
            .iter()
            .map(|&(d, v)| {
                let h = scale(v).max(u32::from(v > 0));
                Bar {
                    x: (d - 1) * step + 1,
                    y: base - h,
                    h,
                    label: format!("day {d}: {} tokens", num(v)),
                }
            })
            .collect();
        let mut run = 0u64;
        let mut line = format!("0,{base}");
        for &(d, v) in days {
            run += v;
            line.push_str(&format!(" {},{}", d * step, base - scale(run)));
        }
        let mut ticks: Vec<Tick> = [1, 8, 15, 22]
            .into_iter()
            .filter(|&d| d + 3 < len)
            .chain(std::iter::once(len.max(1)))
            .map(|d| Tick {
                x: (d - 1) * step + step / 2,
                label: format!("{d} {month}"),
            })
            .collect();
        ticks.dedup_by_key(|t| t.x);
        Chart {
            ticks,
            width,
            height,
            bars,
            bar_width: step.saturating_sub(2).max(1),
            line,
            ceiling_y: ceiling.map(|c| base - scale(c)),
            max_label: num(max),
            summary: format!(
                "{} tokens over {} days with usage{}",
                num(total),
                days.len(),
                ceiling.map_or_else(String::new, |c| format!(
                    ", against a ceiling of {}",
                    num(c)
                ))
            ),
        }
    }
}

/// Sign in.
#[derive(Template)]
#[template(path = "console/login.html")]
pub(crate) struct LoginPage {
    pub layout: Layout,
    pub error: Option<String>,
}

/// A failure, with what to do about it.
#[derive(Template)]
#[template(path = "console/error.html")]
pub(crate) struct ErrorPage {
    pub layout: Layout,
    pub status: u16,
    pub message: String,
    pub hint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_bytes_and_times_read_well() {
        assert_eq!(num(0), "0");
        assert_eq!(num(999), "999");
        assert_eq!(num(1000), "1,000");
        assert_eq!(num(1234567), "1,234,567");
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(1500), "1.5 kB");
        assert_eq!(at(0), "1970-01-01 00:00 UTC");
        assert_eq!(ago(0, 120_000), "2 min ago");
        assert_eq!(ago(180_000, 0), "in 3 min");
    }

    #[test]
    fn the_chart_puts_the_running_total_and_the_ceiling_on_one_scale() {
        let c = Chart::new(&[(1, 100), (3, 300)], 30, Some(800), "Nov");
        let labels: Vec<&str> = c.ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["1 Nov", "8 Nov", "15 Nov", "22 Nov", "30 Nov"]);
        assert!(c.ticks.windows(2).all(|w| w[0].x < w[1].x));
        assert_eq!(c.bars.len(), 2);
        // The ceiling is the largest value: it reaches the top.
        assert_eq!(c.ceiling_y, Some(16));
        // 400 of 800: the line ends halfway up.
        assert!(
            c.line
                .ends_with(&format!(" {},{}", 3 * (640 / 30), 220 - 102)),
            "{}",
            c.line
        );
        assert_eq!(c.bars[1].h, 77);
        let none = Chart::new(&[], 31, None, "Dec");
        assert!(none.bars.is_empty() && none.ceiling_y.is_none());
    }
}
