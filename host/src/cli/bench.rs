//! `abridge bench agents FILE|DIR…`: what the coding-agent path gives back, measured on real
//! transcripts. For each Claude Code or Codex session file: it is imported through `abridge
//! hook` (PreCompact, as Claude Code runs it: a new process reading the payload on stdin)
//! into a fresh database, then a SessionStart after a compaction is run `--runs` times; the
//! context it prints is compared with the transcript — its tokens against the whole
//! transcript's, and how many of the session's edited files and user requests it holds — and
//! the hook's latency is reported (p50, p99 over the runs).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use serde_json::{Value, json};

use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to measure: `agents` (coding-agent sessions) or `context` (what a context keeps
    /// of a long chat, on LoCoMo conversations)
    what: String,
    /// Session files, or folders searched for `.jsonl` files
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// SessionStart runs per session (for the latency percentiles)
    #[arg(long, default_value_t = 20)]
    runs: usize,
}

/// One session's figures.
struct Row {
    name: String,
    episodes: usize,
    transcript_tokens: u64,
    context_tokens: u64,
    edited: (usize, usize),
    requests: (usize, usize),
    import_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// The session files named: files as given, folders walked (the walk `backfill` uses).
fn files(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            if let Ok(w) = abridge_app::walk::transcript_files(p, &["jsonl"], false) {
                out.extend(w.files.into_iter().map(|f| f.path));
            }
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// Run `abridge hook` once with `payload`; its stdout and how long it took.
fn hook(exe: &Path, db: &Path, payload: &Value) -> anyhow::Result<(String, Duration)> {
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args(["--db"])
        .arg(db)
        .args(["-q", "hook"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting abridge hook")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(payload.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let took = started.elapsed();
    if !out.status.success() {
        return Err(anyhow!("abridge hook exited with {}", out.status));
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), took))
}

/// The `p` quantile of `sorted` (nearest rank).
pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn measure(s: &Settings, exe: &Path, file: &Path, runs: usize) -> anyhow::Result<Row> {
    let tmp = std::env::temp_dir().join(format!(
        "abridge-bench-{}-{}",
        std::process::id(),
        file.file_stem().map_or("x".into(), |n| n.to_string_lossy())
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let db = tmp.join("bench.db");
    // The transcript as abridge parses it: its episodes, edited files and requests.
    let engine = super::commands::pure_engine(s).map_err(|f| f.error)?;
    let parsed = abridge_app::transcript::read_file(
        &engine,
        file,
        None,
        abridge_app::transcript::Options::default(),
        1 << 30,
    )
    .await
    .map_err(|e| anyhow!("{e}"))?;
    let conv = parsed
        .conversations
        .first()
        .ok_or_else(|| anyhow!("no conversation"))?;
    let session = conv.id.clone().unwrap_or_else(|| "bench".into());
    let mut transcript_tokens = 0u64;
    let mut edited: Vec<String> = Vec::new();
    let mut requests: Vec<String> = Vec::new();
    for e in &conv.episodes {
        transcript_tokens += u64::from(engine.estimate_tokens(&e.content).await?) + 3;
        if let Some(rest) = e.content.strip_prefix("[action] ") {
            for tool in ["Edit ", "MultiEdit ", "Write ", "NotebookEdit "] {
                if let Some(p) = rest.strip_prefix(tool)
                    && !edited.iter().any(|x| x == p)
                {
                    edited.push(p.to_string());
                }
            }
        }
        if e.role == abridge_engine::types::Role::User
            && !e.content.starts_with("[Request interrupted")
        {
            requests.push(e.content.trim().to_string());
        }
    }
    let payload = |event: &str, extra: Value| {
        let mut p = json!({"session_id": session, "transcript_path": file, "cwd": "/",
            "hook_event_name": event});
        for (k, v) in extra.as_object().expect("an object") {
            p[k] = v.clone();
        }
        p
    };
    let (_, import) = hook(exe, &db, &payload("PreCompact", json!({"trigger": "auto"})))?;
    let mut times = Vec::with_capacity(runs);
    let mut ctx = String::new();
    for _ in 0..runs.max(1) {
        let (out, took) = hook(
            exe,
            &db,
            &payload("SessionStart", json!({"source": "compact"})),
        )?;
        times.push(took.as_secs_f64() * 1000.0);
        if let Ok(v) = serde_json::from_str::<Value>(out.trim()) {
            ctx = v["hookSpecificOutput"]["additionalContext"]
                .as_str()
                .unwrap_or("")
                .to_string();
        }
    }
    times.sort_by(f64::total_cmp);
    let context_tokens = u64::from(engine.estimate_tokens(&ctx).await?);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(Row {
        name: file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        episodes: conv.episodes.len(),
        transcript_tokens,
        context_tokens,
        edited: (
            edited
                .iter()
                .filter(|p| abridge_app::hook::names_file(&ctx, p))
                .count(),
            edited.len(),
        ),
        requests: (
            requests.iter().filter(|r| ctx.contains(r.as_str())).count(),
            requests.len(),
        ),
        import_ms: import.as_secs_f64() * 1000.0,
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
    })
}

pub async fn bench_cmd(s: &Settings, a: BenchArgs) -> Result<(), Failure> {
    if a.what == "context" {
        return super::bench_context::run(s, &a.paths, a.runs).await;
    }
    if a.what != "agents" {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "unknown benchmark '{}'; abridge bench agents FILE|DIR… or abridge bench context FILE… (cargo bench runs the others)",
                a.what
            ),
        ));
    }
    let exe = std::env::current_exe().map_err(|e| Failure::new(Exit::Internal, e))?;
    let files = files(&a.paths);
    if files.is_empty() {
        return Err(Failure::new(
            Exit::Input,
            anyhow!("no .jsonl session files under the paths given"),
        ));
    }
    println!(
        "{:<36} {:>8} {:>11} {:>9} {:>7} {:>9} {:>9} {:>10} {:>8} {:>8}",
        "session file",
        "episodes",
        "transcript",
        "context",
        "ratio",
        "edited",
        "requests",
        "import ms",
        "p50 ms",
        "p99 ms"
    );
    for f in files {
        match measure(s, &exe, &f, a.runs).await {
            Ok(r) => {
                let name: String = r.name.chars().take(36).collect();
                println!(
                    "{:<36} {:>8} {:>11} {:>9} {:>7.3} {:>9} {:>9} {:>10.0} {:>8.0} {:>8.0}",
                    name,
                    r.episodes,
                    r.transcript_tokens,
                    r.context_tokens,
                    r.context_tokens as f64 / r.transcript_tokens.max(1) as f64,
                    format!("{}/{}", r.edited.0, r.edited.1),
                    format!("{}/{}", r.requests.0, r.requests.1),
                    r.import_ms,
                    r.p50_ms,
                    r.p99_ms
                );
            }
            Err(e) => println!("{}: not measured ({e:#})", f.display()),
        }
    }
    println!(
        "transcript/context: estimated tokens; edited, requests: present in the SessionStart context after a compaction ÷ in the session; latency: abridge hook as a new process, {} runs",
        a.runs
    );
    Ok(())
}
