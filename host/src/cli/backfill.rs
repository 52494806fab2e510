//! `abridge backfill DIR`: import and summarize every transcript under a directory (the Claude
//! Code projects layout: a folder per project, a JSONL file per session), passing over files
//! that have not changed since the last run.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use serde_json::json;

use abridge_app::backfill::{self as bf, ScannedFile};
use abridge_app::engine::Progress;
use abridge_app::engine::types::{Config, Engine, PlanPath};

use super::app::{Show, shown};
use super::commands::{Backend, choose_backend, engine_config, note};
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

/// One line of the final table.
struct Outcome {
    status: &'static str,
    file: String,
    session: String,
    episodes: u64,
    detail: String,
}

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
    let now = {
        use abridge_app::engine::Clock;
        abridge_app::engine::SystemClock.now_ms()
    };
    let since = a
        .since
        .as_deref()
        .map(|x| bf::since_ms(x, now))
        .transpose()
        .map_err(|e| Failure::new(Exit::Input, anyhow!("--since {e}")))?;
    let filter = bf::ScanFilter {
        pattern: a.pattern.clone(),
        since_ms: since,
        limit: a.limit,
        follow_links: a.follow_links,
    };
    let scan = bf::scan(&dir, &filter).map_err(|e| Failure::from(e.hint("check the path")))?;
    for line in &scan.skipped {
        note(
            s,
            &format!("backfill: {}", abridge_app::engine::text::printable(line)),
        );
    }
    let files = scan.files;
    if files.is_empty() {
        note(
            s,
            &format!(
                "no transcript files (*.jsonl, *.json) under {} match",
                dir.display()
            ),
        );
    }
    let mode = Mode::detect(a.json, s.quiet);
    let overall = Arc::new(Overall {
        mode,
        total: files.len(),
        state: Mutex::new(OverallState::default()),
        started: std::time::Instant::now(),
    });
    let opts = bf::BackfillOptions {
        min_episodes: a.min_session_episodes,
        read: a.read.options(),
        max_bytes: a.read.max_bytes,
    };
    let mut results: Vec<Outcome> = Vec::new();
    let mut totals = Totals::default();
    let (backend, cfg) = if a.dry_run {
        let mut cfg = s.config.clone();
        cfg.engine = if s.backend == BackendChoice::Extractive {
            Engine::Extractive
        } else {
            Engine::Llm
        };
        dry_run(s, &files, &opts, &cfg, &overall, &mut results, &mut totals).await?;
        (None, cfg)
    } else {
        // Each file through the app; its jobs' progress feeds the overall bar.
        let backend: Backend = choose_backend(s).await?;
        let cfg = engine_config(s, &backend);
        let local = super::app::local(s, Some(&backend))?;
        for f in &files {
            let o = overall.clone();
            let show = Show::Into(Arc::new(move |label: &str, p: &Progress| o.job(label, p)));
            let work = local.backfill_file(f, &opts, &cfg);
            let done = shown(s, &local, None, show, work).await?;
            for w in &done.warnings {
                note(s, &format!("backfill: {w}"));
            }
            let o = Outcome {
                status: done.status,
                file: f.rel.clone(),
                session: done.sessions.join(" "),
                episodes: done.episodes,
                detail: done.detail,
            };
            overall.file_done(&o);
            results.push(o);
        }
        (Some(backend), cfg)
    };
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

/// A dry run through the app's [`bf::DryRun`]: what each file would bring, planned on an
/// in-memory copy (no model, nothing stored; an existing database is only read, for the files
/// it knows). One row per planned session, then one per file that brings none.
async fn dry_run(
    s: &Settings,
    files: &[ScannedFile],
    opts: &bf::BackfillOptions,
    cfg: &Config,
    overall: &Overall,
    results: &mut Vec<Outcome>,
    totals: &mut Totals,
) -> Result<(), Failure> {
    let dry = super::commands::pure_engine(s)?.dry_run(&s.db)?;
    for f in files {
        let plan = dry.plan_file(f, opts, cfg).await?;
        for w in &plan.outcome.warnings {
            note(s, &format!("backfill: {w}"));
        }
        for ps in &plan.sessions {
            let p = &ps.plan;
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
                session: ps.session.clone(),
                episodes: ps.episodes,
                detail: format!("{path}, {} calls, ~{} tokens in", p.calls, p.input_tokens),
            });
        }
        let o = Outcome {
            status: plan.outcome.status,
            file: f.rel.clone(),
            session: plan.outcome.sessions.join(" "),
            episodes: plan.outcome.episodes,
            detail: plan.outcome.detail,
        };
        overall.file_done(&o);
        if plan.sessions.is_empty() {
            results.push(o);
        }
    }
    Ok(())
}
