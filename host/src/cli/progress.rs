//! Progress of long work on stderr: a redrawn bar on a terminal, plain log lines otherwise,
//! nothing with `--json` or `--quiet`.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use abridge_app::engine::Progress;

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A bar redrawn in place (stderr is a terminal).
    Bar,
    /// A log line now and then (stderr is a file or pipe).
    Lines,
    /// Nothing.
    Off,
}

impl Mode {
    /// The mode for this process: off with `--json` or `--quiet`, else by stderr.
    pub fn detect(json: bool, quiet: bool) -> Mode {
        if json || quiet {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines
        }
    }
}

struct State {
    started: Instant,
    first_answer: Option<(Instant, u64)>,
    last_draw: Option<Instant>,
    last_line: Option<(Instant, u32, u32)>,
    drawn: bool,
}

/// Progress of one map-reduce job. `levels` are the plan's reduce calls per level, for the
/// ETA of the stages still to come.
pub struct JobProgress {
    mode: Mode,
    label: String,
    levels: Vec<u32>,
    state: Mutex<State>,
}

/// `1h02m`, `3m05s`, `12s`.
pub fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A Unix time in ms as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn utc_text(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        )
}

/// Text of a bar `width` cells wide, `done` of `total` full.
pub fn bar(done: u64, total: u64, width: usize) -> String {
    let full = if total == 0 {
        width
    } else {
        (done.min(total) as usize * width) / total as usize
    };
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

impl JobProgress {
    /// Progress for `label` (e.g. `job 3 (session x)`).
    pub fn new(mode: Mode, label: String, levels: Vec<u32>) -> Self {
        JobProgress {
            mode,
            label,
            levels,
            state: Mutex::new(State {
                started: Instant::now(),
                first_answer: None,
                last_draw: None,
                last_line: None,
                drawn: false,
            }),
        }
    }

    /// The status text for `p`: stage, counts, percentage, ETA.
    fn text(&self, p: &Progress, st: &mut State, width: usize) -> String {
        let stage = if p.level == 0 {
            "map".to_string()
        } else {
            format!("reduce level {}", p.level)
        };
        if p.answers > 0 && st.first_answer.is_none() {
            st.first_answer = Some((Instant::now(), p.answers));
        }
        // Throughput since the first answer (the sliding window keeps it steady), applied to
        // what is left of this stage and the stages the plan expects after it.
        let eta = st.first_answer.and_then(|(t0, a0)| {
            let (secs, n) = (t0.elapsed().as_secs_f64(), p.answers.saturating_sub(a0));
            (n >= 2 && secs > 0.0).then(|| {
                let later: u32 = self.levels.iter().skip(p.level as usize).sum();
                let left = u64::from(p.total - p.done.min(p.total)) + u64::from(later);
                Duration::from_secs_f64(left as f64 * secs / n as f64)
            })
        });
        let pct = if p.total == 0 {
            100
        } else {
            u64::from(p.done) * 100 / u64::from(p.total)
        };
        let eta = eta.map_or_else(String::new, |d| format!(" · ETA {}", duration_text(d)));
        let bar = if width > 0 {
            format!("{} ", bar(p.done.into(), p.total.into(), width))
        } else {
            String::new()
        };
        format!(
            "{}: {stage} {bar}{}/{} chunks {pct}%{eta} · {} elapsed",
            self.label,
            p.done,
            p.total,
            duration_text(st.started.elapsed())
        )
    }

    /// Show `p` (rate-limited: the bar redraws at most every 100 ms; lines come at each
    /// stage, every 10 % and at most every 5 s otherwise).
    pub fn update(&self, p: &Progress) {
        if self.mode == Mode::Off || p.total <= 1 {
            return;
        }
        let mut st = self.state.lock().expect("progress lock");
        let now = Instant::now();
        match self.mode {
            Mode::Bar => {
                if st
                    .last_draw
                    .is_some_and(|t| now - t < Duration::from_millis(100))
                {
                    return;
                }
                st.last_draw = Some(now);
                st.drawn = true;
                let text = self.text(p, &mut st, 24);
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{text}");
                let _ = err.flush();
            }
            Mode::Lines => {
                let decile = p.done * 10 / p.total.max(1);
                let due = match st.last_line {
                    None => true,
                    Some((t, level, d)) => {
                        level != p.level
                            || decile != d
                            || (now - t >= Duration::from_secs(5) && p.done < p.total)
                    }
                };
                if due {
                    st.last_line = Some((now, p.level, decile));
                    let text = self.text(p, &mut st, 0);
                    eprintln!("abridge: {text}");
                } else if st.first_answer.is_none() && p.answers > 0 {
                    st.first_answer = Some((now, p.answers));
                }
            }
            Mode::Off => {}
        }
    }

    /// Clear the bar (a terminal keeps the final line of normal output clean).
    pub fn finish(&self) {
        let st = self.state.lock().expect("progress lock");
        if self.mode == Mode::Bar && st.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts() {
        assert_eq!(duration_text(Duration::from_secs(12)), "12s");
        assert_eq!(duration_text(Duration::from_secs(185)), "3m05s");
        assert_eq!(duration_text(Duration::from_secs(3720)), "1h02m");
        assert_eq!(bar(3, 10, 10), "[###.......]");
        assert_eq!(utc_text(0), "1970-01-01 00:00:00");
        assert_eq!(utc_text(1_795_324_561_453), "2026-11-22 05:16:01");
        assert_eq!(utc_text(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(bar(0, 0, 4), "[####]");
        let jp = JobProgress::new(Mode::Lines, "job 1".into(), vec![3, 1]);
        let mut st = jp.state.lock().unwrap();
        let p = Progress {
            level: 0,
            done: 5,
            total: 20,
            answers: 5,
        };
        let t = jp.text(&p, &mut st, 0);
        assert!(t.starts_with("job 1: map 5/20 chunks 25%"), "{t}");
        let p = Progress {
            level: 1,
            done: 1,
            total: 3,
            answers: 21,
        };
        let t = jp.text(&p, &mut st, 4);
        assert!(
            t.starts_with("job 1: reduce level 1 [#...] 1/3 chunks 33%"),
            "{t}"
        );
    }
}
