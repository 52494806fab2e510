//! `abridge backfill DIR`: import and summarize every transcript under a directory (the Claude
//! Code projects layout: a folder per project, a JSONL file per session), passing over files
//! that have not changed since the last run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use serde_json::json;
use sha2::{Digest, Sha256};

use abridge::sources::{Source, Sources};
use abridge::transcript::{self, TranscriptError};
use abridge::types::{Engine, PlanPath};
use abridge::{NoModel, Progress, SqliteStore};

use super::app::{Show, run_or_join};
use super::commands::{Backend, build, choose_backend, engine_config, note};
use super::jobs::storage;
use super::progress::{Mode, bar, duration_text};
use super::settings::BackendChoice;
use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct BackfillArgs {
    /// Directory to walk (e.g. ~/.claude/projects): every *.jsonl and *.json file under it
    dir: PathBuf,
    /// Only files whose path under DIR matches: a glob (`*`, `?`, e.g. '*myproject*') or,
    /// without wildcards, a substring
    #[arg(long = "match", value_name = "PATTERN")]
    pattern: Option<String>,
    /// Only files modified since: a date (2026-11-01), a time (2026-11-01T12:00:00Z) or an age
    /// (90m, 12h, 7d)
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// At most this many files, the most recently modified first
    #[arg(long)]
    limit: Option<usize>,
    /// Skip sessions with fewer episodes than this
    #[arg(long = "min-episodes", default_value_t = 1, value_name = "N")]
    min_session_episodes: u64,
    /// Print what would be done (files, sessions, calls, tokens, cost) without calling a model
    /// or storing anything
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object (results and totals) instead of the table
    #[arg(long)]
    json: bool,
    /// Follow symbolic links that lead out of DIR (links inside it are always followed;
    /// link loops are always cut)
    #[arg(long)]
    follow_links: bool,
    #[command(flatten)]
    read: super::commands::ReadArgs,
    #[command(flatten)]
    prices: super::commands::Prices,
}

/// Why a JSON file that holds no conversation is skipped.
const NOT_TRANSCRIPT: &str = "not a transcript (no known format, or no messages)";

/// A candidate file.
struct File {
    path: PathBuf,
    rel: String,
    size: u64,
    mtime_ms: u64,
}

/// One line of the final table.
struct Outcome {
    status: &'static str,
    file: String,
    session: String,
    episodes: u64,
    detail: String,
}

/// Now, from the clock (the app's when there is one: it is the same system clock).
fn now_ms() -> u64 {
    use abridge::Clock;
    abridge::SystemClock.now_ms()
}

/// Whether `text` matches the glob `pat` (`*` any run, `?` one character).
pub fn glob(pat: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn matches(pattern: &str, rel: &str) -> bool {
    if pattern.contains(['*', '?']) {
        glob(pattern, rel)
    } else {
        rel.contains(pattern)
    }
}

/// `--since`: an age (`90m`, `12h`, `7d`), a date or an RFC 3339 time, as ms since the epoch.
pub fn since_ms(s: &str, now: u64) -> Result<u64, String> {
    let s = s.trim();
    let unit = |c: char| match c {
        's' => Some(1_000u64),
        'm' => Some(60_000),
        'h' => Some(3_600_000),
        'd' => Some(86_400_000),
        'w' => Some(7 * 86_400_000),
        _ => None,
    };
    if let Some(last) = s.chars().last()
        && let Some(ms) = unit(last)
        && let Ok(n) = s[..s.len() - 1].parse::<u64>()
    {
        return Ok(now.saturating_sub(n * ms));
    }
    // A time with an offset (RFC 3339), else a civil date or date-time read as UTC.
    let parsed = s.parse::<jiff::Timestamp>().ok().or_else(|| {
        let civil = s.parse::<jiff::civil::DateTime>().ok().or_else(|| {
            s.parse::<jiff::civil::Date>()
                .ok()
                .map(|d| d.at(0, 0, 0, 0))
        })?;
        jiff::tz::TimeZone::UTC.to_timestamp(civil).ok()
    });
    parsed
        .map(|t| t.as_millisecond().max(0) as u64)
        .ok_or_else(|| {
            format!(
                "--since {s:?} is not a date (2026-11-01), a time (2026-11-01T12:00:00Z) or an age (90m, 12h, 7d)"
            )
        })
}

/// Every *.jsonl and *.json file under `dir` (hidden entries skipped), with size and mtime;
/// link loops and links out of the tree are passed over with a note.
fn walk(s: &Settings, dir: &Path, follow_links: bool) -> Result<Vec<File>, Failure> {
    let w =
        abridge::walk::transcript_files(dir, &["jsonl", "json"], follow_links).map_err(|e| {
            Failure::new(
                Exit::Input,
                anyhow!(
                    "cannot read the directory {}: {e} — check the path",
                    dir.display()
                ),
            )
        })?;
    for line in &w.skipped {
        note(s, &format!("backfill: {}", abridge::text::printable(line)));
    }
    Ok(w.files
        .into_iter()
        .map(|f| File {
            path: f.path,
            rel: f.rel,
            size: f.size,
            mtime_ms: f.mtime_ms,
        })
        .collect())
}

/// The overall progress line: files done, outcomes so far, and the running job.
struct Overall {
    mode: Mode,
    total: usize,
    state: Mutex<OverallState>,
    started: std::time::Instant,
}

/// Files done, outcome counts (ok, unchanged, skipped, failed), the running job's status and
/// when the bar was last drawn.
#[derive(Default)]
struct OverallState {
    done: usize,
    counts: [usize; 4],
    current: String,
    drawn: Option<std::time::Instant>,
}

impl Overall {
    fn draw(&self, st: &OverallState) {
        let (done, counts, current) = (st.done, st.counts, &st.current);
        let text = format!(
            "backfill {} {done}/{} files · ok {} · unchanged {} · skipped {} · failed {} · {}{}",
            bar(done as u64, self.total as u64, 20),
            self.total,
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            duration_text(self.started.elapsed()),
            if current.is_empty() {
                String::new()
            } else {
                format!(" · {current}")
            }
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
    }

    fn job(&self, label: &str, p: &Progress) {
        if self.mode != Mode::Bar {
            return;
        }
        let mut st = self.state.lock().expect("progress lock");
        if st
            .drawn
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        st.drawn = Some(std::time::Instant::now());
        let stage = if p.level == 0 {
            "map".to_string()
        } else {
            format!("reduce {}", p.level)
        };
        st.current = format!("{label}: {stage} {}/{}", p.done, p.total);
        self.draw(&st);
    }

    fn file_done(&self, o: &Outcome) {
        let mut st = self.state.lock().expect("progress lock");
        st.done += 1;
        let i = match o.status {
            "ok" | "planned" => 0,
            "unchanged" => 1,
            "skipped" => 2,
            _ => 3,
        };
        st.counts[i] += 1;
        st.current.clear();
        match self.mode {
            Mode::Bar => self.draw(&st),
            Mode::Lines => eprintln!(
                "abridge: backfill {}/{}: {} {} ({})",
                st.done, self.total, o.status, o.file, o.detail
            ),
            Mode::Off => {}
        }
    }

    fn finish(&self) {
        if self.mode == Mode::Bar {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

fn hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Totals of a dry run.
#[derive(Default)]
struct Totals {
    sessions: u64,
    episodes: u64,
    tokens: u64,
    calls: u64,
    input: u64,
    output: u64,
}

pub async fn backfill(s: &Settings, a: BackfillArgs) -> Result<(), Failure> {
    let dir = std::fs::canonicalize(&a.dir).map_err(|e| {
        Failure::new(
            Exit::Input,
            anyhow!(
                "cannot open the directory {}: {e} — check the path",
                a.dir.display()
            ),
        )
    })?;
    if !dir.is_dir() {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "{} is a file; backfill takes a directory (use 'abridge summarize FILE' for one file)",
                dir.display()
            ),
        ));
    }
    let since = a
        .since
        .as_deref()
        .map(|x| since_ms(x, now_ms()))
        .transpose()
        .map_err(|e| Failure::new(Exit::Input, anyhow!(e)))?;
    let mut files: Vec<File> = walk(s, &dir, a.follow_links)?
        .into_iter()
        .filter(|f| a.pattern.as_deref().is_none_or(|p| matches(p, &f.rel)))
        .filter(|f| since.is_none_or(|t| f.mtime_ms >= t))
        .collect();
    files.sort_by(|x, y| y.mtime_ms.cmp(&x.mtime_ms).then_with(|| x.rel.cmp(&y.rel)));
    if let Some(n) = a.limit {
        files.truncate(n);
    }
    if files.is_empty() {
        note(
            s,
            &format!(
                "no transcript files (*.jsonl, *.json) under {} match",
                dir.display()
            ),
        );
    }

    // A dry run reads what earlier runs recorded but writes nothing (and creates no database).
    let db = if a.dry_run && !s.db.exists() {
        None
    } else {
        Some(Arc::new(SqliteStore::open(&s.db).map_err(storage)?))
    };
    let sources = db
        .clone()
        .map(|d| Sources::new(d as Arc<dyn abridge::store::SourceStore>));
    let (engine, local, backend, cfg) = if a.dry_run {
        let engine = build(s, Arc::new(abridge::MemoryStore::new()), Arc::new(NoModel))?;
        let mut cfg = s.config.clone();
        cfg.engine = if s.backend == BackendChoice::Extractive {
            Engine::Extractive
        } else {
            Engine::Llm
        };
        (Arc::new(engine), None, None, cfg)
    } else {
        let backend: Backend = choose_backend(s).await?;
        let cfg = engine_config(s, &backend);
        let local = super::app::local(s, Some(&backend))?;
        (local.engine().clone(), Some(local), Some(backend), cfg)
    };
    let mode = Mode::detect(a.json, s.quiet);
    let overall = Arc::new(Overall {
        mode,
        total: files.len(),
        state: Mutex::new(OverallState::default()),
        started: std::time::Instant::now(),
    });
    let opts = a.read.options();
    let mut results: Vec<Outcome> = Vec::new();
    let mut totals = Totals::default();
    for f in &files {
        let key = f.path.display().to_string();
        let known = match &sources {
            Some(src) => src.get(&key).await.map_err(storage)?,
            None => None,
        };
        let row = |results: &mut Vec<Outcome>,
                   status: &'static str,
                   session: String,
                   episodes: u64,
                   detail: String| {
            let o = Outcome {
                status,
                file: f.rel.clone(),
                session,
                episodes,
                detail,
            };
            overall.file_done(&o);
            results.push(o);
        };
        // Unchanged since it was summarized (or skipped as too small): no reading at all.
        let still_small = |k: &Source| {
            k.status == "skipped"
                && k.detail.as_deref() == Some("too few episodes")
                && k.episodes < a.min_session_episodes
        };
        if let Some(k) = &known
            && k.size == f.size
            && k.mtime_ms == f.mtime_ms
            && (k.status == "ok" || still_small(k) || k.detail.as_deref() == Some(NOT_TRANSCRIPT))
        {
            row(
                &mut results,
                "unchanged",
                k.sessions.join(" "),
                k.episodes,
                "no change since the last run".into(),
            );
            continue;
        }
        // Read with a bound: the size seen by the walk is only a hint (a growing file).
        let read = std::fs::File::open(&f.path)
            .map_err(|e| format!("cannot read it: {e}"))
            .and_then(|mut file| {
                transcript::read_bounded(&f.rel, &mut file, a.read.max_bytes)
                    .map_err(|e| e.to_string())
            });
        let bytes = match read {
            Ok(b) => b,
            Err(e) => {
                row(&mut results, "failed", String::new(), 0, e);
                continue;
            }
        };
        let sha = hash(&bytes);
        let record =
            async |status: &str, sessions: Vec<String>, episodes: u64, detail: Option<String>| {
                if a.dry_run {
                    return Ok(());
                }
                let src = sources.as_ref().expect("opened unless a dry run");
                src.put(
                    &Source {
                        path: key.clone(),
                        size: f.size,
                        mtime_ms: f.mtime_ms,
                        sha256: sha.clone(),
                        status: status.into(),
                        sessions,
                        episodes,
                        detail,
                    },
                    now_ms(),
                )
                .await
                .map_err(storage)
            };
        if let Some(k) = &known
            && k.sha256 == sha
            && k.status == "ok"
        {
            // Touched but not changed: remember the new time, do nothing else.
            record("ok", k.sessions.clone(), k.episodes, None).await?;
            row(
                &mut results,
                "unchanged",
                k.sessions.join(" "),
                k.episodes,
                "same content".into(),
            );
            continue;
        }
        let parsed = match transcript::parse_bytes(&engine, &f.rel, &bytes, None, opts).await {
            Ok(p) => p,
            Err(
                TranscriptError::UnknownFormat { .. }
                | TranscriptError::Empty { .. }
                | TranscriptError::EmptyFile { .. },
            ) => {
                record("skipped", vec![], 0, Some(NOT_TRANSCRIPT.into())).await?;
                row(
                    &mut results,
                    "skipped",
                    String::new(),
                    0,
                    NOT_TRANSCRIPT.into(),
                );
                continue;
            }
            Err(e) => {
                record("failed", vec![], 0, Some(e.to_string())).await?;
                row(&mut results, "failed", String::new(), 0, e.to_string());
                continue;
            }
        };
        for w in &parsed.warnings {
            note(s, &format!("backfill: {w}"));
        }
        let mut sessions = Vec::new();
        let (mut episodes, mut failure, mut small) = (0u64, None, 0usize);
        let many = parsed.conversations.len() > 1;
        for (i, conv) in parsed.conversations.into_iter().enumerate() {
            let session =
                transcript::session_name(conv.id.as_deref(), Path::new(&f.rel), many.then_some(i));
            let n = conv.episodes.len() as u64;
            episodes += n;
            if n < a.min_session_episodes {
                small += 1;
                continue;
            }
            sessions.push(session.clone());
            if a.dry_run {
                engine.append(&session, &conv.episodes).await?;
                let p = engine.plan(&session, &cfg).await?;
                totals.sessions += 1;
                totals.episodes += p.episodes;
                totals.tokens += p.backlog_tokens;
                totals.calls += u64::from(p.calls);
                totals.input += p.input_tokens;
                totals.output += p.output_tokens;
                let path = match p.path {
                    PlanPath::MapReduce => format!("map-reduce, {} chunks", p.chunks),
                    PlanPath::Single => "one call".into(),
                    PlanPath::Rolling => "rolling".into(),
                    PlanPath::Nothing => "nothing to do".into(),
                };
                results.push(Outcome {
                    status: "planned",
                    file: f.rel.clone(),
                    session,
                    episodes: n,
                    detail: format!("{path}, {} calls, ~{} tokens in", p.calls, p.input_tokens),
                });
                continue;
            }
            let local = local.as_ref().expect("opened unless a dry run");
            let added = engine.append(&session, &conv.episodes).await?;
            let store = engine.store();
            let stats = store.stats(&session).await.map_err(storage)?;
            local
                .mark_source(&session, &key, stats.last_episode, f.size)
                .await?;
            let covered = store
                .latest_summary(&session)
                .await
                .map_err(storage)?
                .map_or(0, |r| r.last_episode);
            if stats.last_episode <= covered {
                continue;
            }
            let o = overall.clone();
            let show = Show::Into(Arc::new(move |label: &str, p: &Progress| o.job(label, p)));
            if let Err(e) = run_or_join(s, local, (&session, stats.last_episode), &cfg, show).await
            {
                failure = Some(format!(
                    "session {session}: {:#} ({added} new episodes stored)",
                    e.error
                ));
                break;
            }
        }
        if a.dry_run {
            let o = Outcome {
                status: if sessions.is_empty() {
                    "skipped"
                } else {
                    "planned"
                },
                file: f.rel.clone(),
                session: sessions.join(" "),
                episodes,
                detail: if sessions.is_empty() {
                    "too few episodes".into()
                } else {
                    format!("{} session(s)", sessions.len())
                },
            };
            overall.file_done(&o);
            if sessions.is_empty() {
                results.push(o);
            }
            continue;
        }
        match failure {
            Some(why) => {
                record("failed", sessions.clone(), episodes, Some(why.clone())).await?;
                row(&mut results, "failed", sessions.join(" "), episodes, why);
            }
            None if sessions.is_empty() => {
                record("skipped", vec![], episodes, Some("too few episodes".into())).await?;
                row(
                    &mut results,
                    "skipped",
                    String::new(),
                    episodes,
                    format!("fewer than {} episodes", a.min_session_episodes),
                );
            }
            None => {
                record("ok", sessions.clone(), episodes, None).await?;
                let detail = if small > 0 {
                    format!("summarized; {small} small conversation(s) skipped")
                } else {
                    "summarized".into()
                };
                row(&mut results, "ok", sessions.join(" "), episodes, detail);
            }
        }
    }
    overall.finish();
    report(
        s,
        &a,
        &results,
        &totals,
        backend.as_ref().map(|b| b.name),
        &cfg.model,
    )
}

fn report(
    s: &Settings,
    a: &BackfillArgs,
    results: &[Outcome],
    t: &Totals,
    backend: Option<&str>,
    model: &str,
) -> Result<(), Failure> {
    let count = |st: &str| results.iter().filter(|r| r.status == st).count();
    let failed = count("failed");
    let cost = a.prices.cost(t.input, t.output);
    if a.json {
        let v = json!({
            "dry_run": a.dry_run,
            "backend": backend,
            "model": model,
            "results": results.iter().map(|r| json!({
                "status": r.status, "file": r.file, "session": r.session,
                "episodes": r.episodes, "detail": r.detail,
            })).collect::<Vec<_>>(),
            "counts": {
                "ok": count("ok"), "unchanged": count("unchanged"), "skipped": count("skipped"),
                "failed": failed, "planned": count("planned"),
            },
            "totals": a.dry_run.then(|| json!({
                "sessions": t.sessions, "episodes": t.episodes, "tokens": t.tokens,
                "calls": t.calls, "input_tokens": t.input, "output_tokens": t.output,
                "cost_usd": cost,
            })),
        });
        println!("{v}");
    } else {
        let width = results
            .iter()
            .map(|r| r.file.len())
            .max()
            .unwrap_or(4)
            .clamp(4, 72);
        println!(
            "{:<9}  {:<width$}  {:>8}  {:<24}  detail",
            "status", "file", "episodes", "session"
        );
        for r in results {
            let session: String = if r.session.chars().count() > 24 {
                r.session.chars().take(23).chain(['…']).collect()
            } else {
                r.session.clone()
            };
            println!(
                "{:<9}  {:<width$}  {:>8}  {:<24}  {}",
                r.status, r.file, r.episodes, session, r.detail
            );
        }
        if a.dry_run {
            println!(
                "dry run: {} file(s), {} session(s), {} episodes, ~{} tokens; about {} calls, ~{} tokens in, at most {} out; cost ${cost:.4} at ${}/M in and ${}/M out (nothing was called or stored)",
                results
                    .iter()
                    .map(|r| &r.file)
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                t.sessions,
                t.episodes,
                t.tokens,
                t.calls,
                t.input,
                t.output,
                a.prices.price_in,
                a.prices.price_out
            );
        } else {
            println!(
                "{} ok, {} unchanged, {} skipped, {} failed",
                count("ok"),
                count("unchanged"),
                count("skipped"),
                failed
            );
        }
    }
    if failed > 0 {
        let _ = s;
        return Err(Failure::new(
            Exit::Model,
            anyhow!(
                "{failed} file(s) failed (see the table); their episodes are stored and a re-run retries only them"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_ages() {
        assert!(glob("*proj*", "a/myproject/x.jsonl"));
        assert!(glob("a/?/*.jsonl", "a/b/c.jsonl"));
        assert!(!glob("*.json", "a/b.jsonl"));
        assert!(matches("proj", "a/myproject/x.jsonl") && !matches("zzz", "a/b"));
        let now = 10 * 86_400_000;
        assert_eq!(since_ms("2d", now), Ok(8 * 86_400_000));
        assert_eq!(since_ms("90m", now), Ok(now - 90 * 60_000));
        assert_eq!(since_ms("1970-01-02", now), Ok(86_400_000));
        assert_eq!(since_ms("1970-01-02T01:00:00", now), Ok(90_000_000));
        assert_eq!(since_ms("1970-01-02T02:00:00+01:00", now), Ok(90_000_000));
        assert!(since_ms("yesterday", now).is_err());
    }
}
