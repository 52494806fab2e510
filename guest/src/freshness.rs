//! Whether a session needs a refresh now: the two modes (eager, idle), the provisional
//! summary, and the backoff after failures. Pure: every input, the time included, is given.

use crate::policy::{Config, Mode};
use crate::types::{FailureMarker, Stats};

/// `n` and a noun in the number it takes: "1 new episode", "3 new episodes".
pub fn count(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

fn new_episodes(n: u64) -> String {
    count(n, "new episode", "new episodes")
}

/// The verdict (mirrors the WIT `fresh-state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No episodes.
    Empty,
    /// Every episode is covered.
    Fresh,
    /// New episodes wait for the trigger or for quiet.
    Waiting,
    /// A refresh would run now.
    Due,
    /// The last refresh failed; wait until `due_at_ms`.
    BackingOff,
    /// Too many failures in a row; only an explicit summarize tries again.
    GaveUp,
}

/// A session's freshness (mirrors the WIT `freshness`).
#[derive(Clone, Debug, PartialEq)]
pub struct Freshness {
    /// The verdict.
    pub state: State,
    /// Why.
    pub reason: String,
    /// Episodes stored.
    pub episodes: u64,
    /// Episodes covered.
    pub covered: u64,
    /// Estimated tokens not yet covered.
    pub backlog_tokens: u64,
    /// The newest episode's timestamp.
    pub last_activity_ms: Option<i64>,
    /// The newest covered episode's timestamp.
    pub covered_until_ms: Option<i64>,
    /// When it becomes due, if known.
    pub due_at_ms: Option<u64>,
    /// Consecutive failures.
    pub failures: u32,
    /// The last failure's reason.
    pub last_error: Option<String>,
    /// The episode a refresh now folds up to (see [`fold_upto`]).
    pub fold_upto: u64,
    /// Active rows the offline summarizer wrote that the configured model would rewrite (0
    /// when the configuration names no model).
    pub fallback_rows: u32,
}

/// The episode a refresh folds up to: the newest, or in window mode the newest that has left
/// the recent window (the context keeps the window verbatim).
pub fn fold_upto(cfg: &Config, last_episode: u64) -> u64 {
    if cfg.mode == Mode::Window {
        last_episode.saturating_sub(u64::from(cfg.window_messages))
    } else {
        last_episode
    }
}

/// What the verdict is computed from.
pub struct Inputs {
    /// Session figures.
    pub stats: Stats,
    /// Episodes covered by the chain.
    pub covered: u64,
    /// Estimated tokens after the covered ones.
    pub backlog_tokens: u64,
    /// The newest episode's timestamp.
    pub last_activity_ms: Option<i64>,
    /// The newest covered episode's timestamp.
    pub covered_until_ms: Option<i64>,
    /// Now, from the clock import.
    pub now_ms: u64,
    /// The failure marker, if any.
    pub marker: Option<FailureMarker>,
    /// Window mode: estimated tokens of the unsummarized episodes that have left the recent
    /// window, and the fold size they must reach ([`crate::policy::window_batch`]).
    pub window: Option<(u64, u64)>,
    /// Active rows the offline summarizer wrote that the configured model would rewrite.
    pub fallback_rows: u32,
}

/// Longest backoff between automatic attempts: six hours.
pub const MAX_BACKOFF_MS: u64 = 6 * 3_600_000;

/// When the next automatic attempt may run after the `failures`-th failure in a row at `now`:
/// `retry_base_secs`, doubled per further failure, capped at six hours.
pub fn retry_after(now_ms: u64, failures: u32, cfg: &Config) -> u64 {
    let base = u64::from(cfg.retry_base_secs.max(1)) * 1000;
    let backoff = base
        .saturating_mul(1u64 << failures.saturating_sub(1).min(30))
        .min(MAX_BACKOFF_MS);
    now_ms.saturating_add(backoff)
}

fn minutes(ms: u64) -> String {
    let s = ms / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 7200 {
        format!("{} min", s / 60)
    } else {
        format!("{:.1} h", s as f64 / 3600.0)
    }
}

/// What a context of some budget cannot carry beside the summary (see
/// [`crate::engine::overflow_cut`]): the estimated cost of what lies beyond the summary, and
/// the episode a fold must reach so the rest fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow {
    /// Estimated context tokens beyond the summary.
    pub tokens: u64,
    /// The context's budget.
    pub budget: u32,
    /// The share of it, in percent, the turns since a fold may take (the high-water mark).
    pub high: u32,
    /// The newest episode a fold covers: the turns after it fit the low-water mark.
    pub upto: u64,
    /// The newest episode a fold must cover: the turns after it fit the high-water mark (a
    /// fold that covers this in one prompt may leave the rest before `upto` for the next).
    pub least: u64,
}

/// The verdict `f` as a context that keeps at most `refresh_after` messages beyond the summary
/// sees it: in eager mode, more than that many waiting messages are due now (the context
/// would otherwise drop them), whatever the trigger thresholds say. In eager and window
/// modes, a backlog the context's budget cannot carry (`overflow`) is due too, folding at
/// least up to `overflow.upto`. Idle mode waits for quiet (the caller sees `refresh-due`);
/// backing off and giving up stay as they are.
pub fn for_context(
    mut f: Freshness,
    cfg: &Config,
    refresh_after: u32,
    overflow: Option<Overflow>,
    unshown: Option<u64>,
) -> Freshness {
    let waiting = f.episodes.saturating_sub(f.covered);
    if cfg.mode == Mode::Eager && f.state == State::Waiting && waiting > u64::from(refresh_after) {
        f.state = State::Due;
        f.reason = format!(
            "{waiting} messages wait beyond the summary, more than the {refresh_after} a context keeps"
        );
    }
    // What a context could not show is due now (when nothing holds refreshes back), folded
    // at least as far as `upto`.
    let mut fold = |upto: u64, why: &dyn Fn() -> String| {
        if matches!(f.state, State::Waiting | State::Due) {
            if f.state == State::Waiting {
                f.state = State::Due;
                f.reason = why();
            }
            f.fold_upto = f.fold_upto.max(upto);
        }
    };
    if let Some(o) = overflow
        && cfg.mode != Mode::Idle
    {
        fold(o.upto, &|| {
            format!(
                "{} tokens wait beyond the summary, more than the {} % of a {}-token context the turns since a fold may take",
                o.tokens, o.high, o.budget
            )
        });
    }
    // Window mode promises the recent turns verbatim, but a context shows only the dialogue:
    // tool output beyond the summary is folded rather than left out.
    if let Some(upto) = unshown
        && cfg.mode == Mode::Window
    {
        fold(upto, &|| {
            format!(
                "tool output up to episode {upto} lies beyond the summary, and a context shows only the dialogue"
            )
        });
    }
    f
}

/// The verdict for `inp` under `cfg`.
pub fn verdict(inp: Inputs, cfg: &Config) -> Freshness {
    let mut f = Freshness {
        state: State::Waiting,
        reason: String::new(),
        episodes: inp.stats.episodes,
        covered: inp.covered,
        backlog_tokens: inp.backlog_tokens,
        last_activity_ms: inp.last_activity_ms,
        covered_until_ms: inp.covered_until_ms,
        due_at_ms: None,
        failures: inp.marker.as_ref().map_or(0, |m| m.failures),
        last_error: inp.marker.as_ref().map(|m| m.last_error.clone()),
        fold_upto: fold_upto(cfg, inp.stats.last_episode),
        fallback_rows: inp.fallback_rows,
    };
    let upgrade = cfg.engine == crate::policy::Engine::Llm && inp.fallback_rows > 0;
    let set = |f: &mut Freshness, state, reason: String| {
        f.state = state;
        f.reason = reason;
    };
    let new = inp.stats.last_episode.saturating_sub(inp.covered);
    if inp.stats.episodes == 0 {
        set(&mut f, State::Empty, "no episodes".into());
        return f;
    }
    if new == 0 && !upgrade {
        set(
            &mut f,
            State::Fresh,
            if inp.covered == 1 {
                "the summary covers the 1 episode".into()
            } else {
                format!("the summary covers all {} episodes", inp.covered)
            },
        );
        return f;
    }
    if let Some(m) = &inp.marker {
        if m.failures >= cfg.max_attempts.max(1) {
            let why = format!(
                "{} refreshes failed in a row (last: {}); automatic refreshes stopped — run summarize to try again",
                m.failures, m.last_error
            );
            set(&mut f, State::GaveUp, why);
            return f;
        }
        if inp.now_ms < m.retry_after_ms {
            f.due_at_ms = Some(m.retry_after_ms);
            let why = format!(
                "the last refresh failed ({}); next attempt in {}",
                m.last_error,
                minutes(m.retry_after_ms - inp.now_ms)
            );
            set(&mut f, State::BackingOff, why);
            return f;
        }
    }
    if upgrade {
        let why = format!(
            "{} summary row(s) were written by the offline summarizer; {} rewrites them",
            inp.fallback_rows, cfg.model
        );
        set(&mut f, State::Due, why);
        return f;
    }
    if inp.stats.total_tokens <= u64::from(cfg.threshold_tokens) {
        let why = format!(
            "{} tokens, under the {}-token threshold",
            inp.stats.total_tokens, cfg.threshold_tokens
        );
        set(&mut f, State::Waiting, why);
        return f;
    }
    match cfg.mode {
        Mode::Eager => {
            if new >= u64::from(cfg.min_episodes_since) {
                set(&mut f, State::Due, new_episodes(new));
            } else if crate::policy::backlog_over(inp.backlog_tokens, cfg) {
                let why = format!(
                    "{} of {} tokens, at or over the {}-token backlog limit",
                    new_episodes(new),
                    inp.backlog_tokens,
                    cfg.max_backlog_tokens
                );
                set(&mut f, State::Due, why);
            } else {
                let why = format!(
                    "{}, waiting for {}",
                    new_episodes(new),
                    cfg.min_episodes_since
                );
                set(&mut f, State::Waiting, why);
            }
        }
        Mode::Window => {
            let (left, batch) = inp.window.unwrap_or((0, 1));
            if left >= batch {
                let why = format!(
                    "{left} tokens have left the recent window of the last {} messages: at least {batch}, so they are summarized now",
                    cfg.window_messages
                );
                set(&mut f, State::Due, why);
            } else {
                let why = format!(
                    "{left} tokens have left the recent window of the last {} messages; they are summarized once {batch} have",
                    cfg.window_messages
                );
                set(&mut f, State::Waiting, why);
            }
        }
        Mode::Idle => {
            let quiet_ms = u64::from(cfg.quiescence_secs) * 1000;
            let Some(last) = inp.last_activity_ms else {
                set(
                    &mut f,
                    State::Due,
                    format!("{} without timestamps (taken as idle)", new_episodes(new)),
                );
                return f;
            };
            let until = (last.max(0) as u64).saturating_add(quiet_ms);
            if inp.now_ms >= until {
                let why = format!(
                    "{}, quiet for {}",
                    new_episodes(new),
                    minutes(inp.now_ms - last.max(0) as u64)
                );
                set(&mut f, State::Due, why);
            } else if cfg.provisional_tokens > 0
                && inp.backlog_tokens >= u64::from(cfg.provisional_tokens)
            {
                let why = format!(
                    "active, but {} unsummarized tokens reach the {}-token provisional limit",
                    inp.backlog_tokens, cfg.provisional_tokens
                );
                set(&mut f, State::Due, why);
            } else {
                f.due_at_ms = Some(until);
                let why = format!(
                    "{}; active {} ago, idle after {}",
                    new_episodes(new),
                    minutes(inp.now_ms.saturating_sub(last.max(0) as u64)),
                    minutes(quiet_ms)
                );
                set(&mut f, State::Waiting, why);
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_makes_an_eager_backlog_beyond_its_limit_due() {
        let mut f = verdict(inputs(10, 7, None, 0), &eager());
        assert_eq!(f.state, State::Waiting);
        f.covered = 0;
        let e = eager();
        assert_eq!(
            for_context(f.clone(), &e, 20, None, None).state,
            State::Waiting
        );
        let due = for_context(f.clone(), &e, 8, None, None);
        assert_eq!(due.state, State::Due);
        assert!(due.reason.contains("more than the 8"), "{}", due.reason);
        let idle = Config {
            mode: Mode::Idle,
            ..eager()
        };
        assert_eq!(for_context(f, &idle, 8, None, None).state, State::Waiting);
    }

    #[test]
    fn a_backlog_the_budget_cannot_carry_is_due_in_eager_and_window_modes() {
        let over = Overflow {
            tokens: 3_000,
            budget: 2_000,
            high: 20,
            upto: 9,
            least: 9,
        };
        for mode in [Mode::Eager, Mode::Window] {
            let cfg = Config {
                mode,
                threshold_tokens: 100_000,
                ..Config::default()
            };
            let f = verdict(inputs(10, 0, None, 0), &cfg);
            assert_eq!(f.state, State::Waiting, "{mode:?}: under the threshold");
            assert_eq!(
                for_context(f.clone(), &cfg, u32::MAX, None, None).state,
                State::Waiting
            );
            let due = for_context(f, &cfg, u32::MAX, Some(over), None);
            assert_eq!(due.state, State::Due, "{mode:?}");
            assert!(due.reason.contains("2000-token context"), "{}", due.reason);
            assert!(due.fold_upto >= 9, "{mode:?}: {}", due.fold_upto);
        }
        // Tool output beyond the summary: window mode folds it, eager mode's count decides.
        let cfg = Config {
            threshold_tokens: 100_000,
            ..Config::default()
        };
        let f = verdict(inputs(10, 0, None, 0), &cfg);
        let due = for_context(f.clone(), &cfg, u32::MAX, None, Some(7));
        assert_eq!(
            (due.state, due.fold_upto >= 7),
            (State::Due, true),
            "{}",
            due.reason
        );
        assert_eq!(
            for_context(f, &eager(), u32::MAX, None, Some(7)).state,
            State::Waiting
        );
        // Idle mode waits for quiet; a failing model's backoff holds.
        let idle = Config {
            mode: Mode::Idle,
            ..Config::default()
        };
        let f = verdict(inputs(10, 0, Some(0), 0), &idle);
        assert_eq!(
            for_context(f, &idle, u32::MAX, Some(over), Some(5)).state,
            State::Waiting
        );
        let mut backing = inputs(10, 0, None, 0);
        backing.marker = Some(FailureMarker {
            failures: 1,
            last_error: "down".into(),
            retry_after_ms: 60_000,
            failed_ms: 0,
        });
        let f = verdict(backing, &Config::default());
        assert_eq!(
            for_context(f, &Config::default(), u32::MAX, Some(over), Some(5)).state,
            State::BackingOff
        );
    }

    const H: u64 = 3_600_000;

    /// Eager mode (the default is window).
    fn eager() -> Config {
        Config {
            mode: Mode::Eager,
            ..Config::default()
        }
    }

    fn inputs(episodes: u64, covered: u64, last: Option<i64>, now: u64) -> Inputs {
        Inputs {
            stats: Stats {
                episodes,
                total_tokens: episodes * 100,
                last_episode: episodes,
            },
            covered,
            backlog_tokens: (episodes - covered) * 100,
            last_activity_ms: last,
            covered_until_ms: None,
            now_ms: now,
            marker: None,
            fallback_rows: 0,
            window: None,
        }
    }

    fn idle() -> Config {
        Config {
            mode: Mode::Idle,
            ..eager()
        }
    }

    #[test]
    fn one_episode_is_said_as_one() {
        let c = eager();
        assert_eq!(
            verdict(inputs(1, 1, None, 0), &c).reason,
            "the summary covers the 1 episode"
        );
        assert_eq!(
            verdict(inputs(10, 10, None, 0), &c).reason,
            "the summary covers all 10 episodes"
        );
        let r = verdict(inputs(10, 9, None, 0), &c).reason;
        assert!(r.starts_with("1 new episode,"), "{r}");
    }

    #[test]
    fn eager_follows_the_trigger() {
        let c = eager();
        assert_eq!(verdict(inputs(0, 0, None, 0), &c).state, State::Empty);
        assert_eq!(verdict(inputs(10, 10, None, 0), &c).state, State::Fresh);
        assert_eq!(verdict(inputs(10, 7, None, 0), &c).state, State::Waiting);
        assert_eq!(verdict(inputs(10, 5, None, 0), &c).state, State::Due);
        // Under the token threshold nothing is due in either mode.
        let small = Inputs {
            stats: Stats {
                episodes: 10,
                total_tokens: 150,
                last_episode: 10,
            },
            ..inputs(10, 0, Some(0), 10 * H)
        };
        assert_eq!(verdict(small, &idle()).state, State::Waiting);
    }

    #[test]
    fn idle_waits_for_quiet_measured_from_the_last_episode() {
        let c = idle();
        let last = 5 * H as i64;
        let v = verdict(inputs(10, 0, Some(last), 5 * H + H / 2), &c);
        assert_eq!(v.state, State::Waiting, "{}", v.reason);
        assert_eq!(v.due_at_ms, Some(6 * H));
        assert_eq!(
            verdict(inputs(10, 0, Some(last), 6 * H), &c).state,
            State::Due
        );
        // One new episode is enough once idle (min-episodes is an eager rule).
        assert_eq!(
            verdict(inputs(10, 9, Some(last), 7 * H), &c).state,
            State::Due
        );
        // A provisional summary for a large, active conversation.
        let p = Config {
            provisional_tokens: 800,
            ..idle()
        };
        assert_eq!(
            verdict(inputs(10, 0, Some(last), 5 * H), &p).state,
            State::Due
        );
        assert_eq!(
            verdict(inputs(10, 5, Some(last), 5 * H), &p).state,
            State::Waiting
        );
    }

    #[test]
    fn a_large_backlog_is_due_whatever_its_count_and_window_mode_waits_for_a_batch() {
        let c = eager();
        // Two messages of 3,500 tokens each: under min-episodes, over the backlog limit.
        let big = Inputs {
            stats: Stats {
                episodes: 2,
                total_tokens: 7000,
                last_episode: 2,
            },
            backlog_tokens: 7000,
            ..inputs(2, 0, None, 0)
        };
        let v = verdict(big, &c);
        assert_eq!(v.state, State::Due, "{}", v.reason);
        let w = Config {
            mode: Mode::Window,
            ..eager()
        };
        let at = |left, batch| {
            verdict(
                Inputs {
                    window: Some((left, batch)),
                    ..inputs(30, 0, None, 0)
                },
                &w,
            )
            .state
        };
        assert_eq!(at(100, 1200), State::Waiting);
        assert_eq!(at(1200, 1200), State::Due);
    }

    #[test]
    fn failures_back_off_then_give_up() {
        let c = eager();
        assert_eq!(retry_after(0, 1, &c), 60_000);
        assert_eq!(retry_after(0, 3, &c), 240_000);
        assert_eq!(retry_after(0, 40, &c), MAX_BACKOFF_MS);
        let marked = |failures, retry_after_ms, now| Inputs {
            marker: Some(FailureMarker {
                failures,
                last_error: "HTTP 503".into(),
                retry_after_ms,
                failed_ms: 0,
            }),
            ..inputs(10, 0, None, now)
        };
        let v = verdict(marked(1, 60_000, 1_000), &c);
        assert_eq!((v.state, v.due_at_ms), (State::BackingOff, Some(60_000)));
        assert!(v.reason.contains("HTTP 503"), "{}", v.reason);
        assert_eq!(verdict(marked(1, 60_000, 60_000), &c).state, State::Due);
        let v = verdict(marked(5, 0, 10 * H), &c);
        assert_eq!(v.state, State::GaveUp);
        assert_eq!(v.failures, 5);
        // A covered session is fresh whatever the marker says.
        let fresh = Inputs {
            covered: 10,
            ..marked(5, 0, 0)
        };
        assert_eq!(verdict(fresh, &c).state, State::Fresh);
    }
}
