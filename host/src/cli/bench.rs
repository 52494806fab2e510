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
    /// What to measure: `agents` (coding-agent sessions), `context` (what a context keeps of
    /// a long chat, on LoCoMo, REALTALK or BEAM conversations and coding sessions' `.jsonl`
    /// transcripts), `cache` (what a context sent on every turn costs with prompt caching,
    /// on such conversations, coding sessions written a line at a time, and a generated chat)
    /// or `facts` (whether a context shows facts as they are now, on generated dated chats in
    /// which facts change and end)
    what: String,
    /// Session files, or folders searched for `.jsonl` files (`agents`); conversation files,
    /// or a BEAM chat's folder (`context`, `cache`), or a coding session's `.jsonl` (`context`,
    /// `cache`); for `facts`, an optional templates file (the chats' wording: see
    /// `--print-templates`)
    paths: Vec<PathBuf>,
    /// SessionStart runs per session (for the latency percentiles)
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// `facts`: chats of each kind (a person with an assistant, a group of three)
    #[arg(long, default_value_t = 2)]
    chats: usize,
    /// `facts`: the first chat's seed (the next ones count up)
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `facts`: print the built-in templates as JSON (a file to edit and pass back) and stop
    #[arg(long)]
    print_templates: bool,
    /// `facts`: the paths are real conversations (as `context` reads them): list the facts
    /// that change in each and what a context shows of them
    #[arg(long)]
    real: bool,
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
    /// The noise among the identifiers the start shows.
    noise: super::bench_noise::Noise,
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
    let parsed = parse(&engine, file).await?;
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
        if e.role == abridge_app::engine::types::Role::User
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
    let vocabulary = super::bench_noise::Vocabulary::of(
        conv.episodes
            .iter()
            .map(|e| (is_tool(e.role), e.content.as_str())),
    );
    let noise = super::bench_noise::noise(&ctx, &vocabulary);
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
        // A request is kept when its opening is in the context: the digest keeps a request
        // trimmed of padding, a pasted log as its first lines (whitespace aside, the same
        // words).
        requests: {
            let norm = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            let have = norm(&ctx);
            (
                requests
                    .iter()
                    .filter(|r| {
                        let r: String = norm(r).chars().take(120).collect();
                        have.contains(&r)
                    })
                    .count(),
                requests.len(),
            )
        },
        import_ms: import.as_secs_f64() * 1000.0,
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
        noise,
    })
}

pub async fn bench_cmd(s: &Settings, a: BenchArgs) -> Result<(), Failure> {
    if a.what == "facts" {
        if a.print_templates {
            let t = super::bench_facts::built_in();
            println!(
                "{}",
                serde_json::to_string_pretty(&t).expect("templates serialize")
            );
            return Ok(());
        }
        if a.real {
            if a.paths.is_empty() {
                return Err(Failure::new(
                    Exit::Input,
                    anyhow!(
                        "abridge bench facts --real needs conversation files: abridge bench facts --real FILE…"
                    ),
                ));
            }
            return super::bench_facts::run_real(s, &a.paths).await;
        }
        if a.paths.len() > 1 {
            return Err(Failure::new(
                Exit::Input,
                anyhow!(
                    "abridge bench facts takes at most one templates file (conversations: --real FILE…)"
                ),
            ));
        }
        return super::bench_facts::run(s, a.paths.first(), a.chats, a.seed).await;
    }
    if a.paths.is_empty() {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "abridge bench {} needs files to measure: abridge bench {} FILE…",
                a.what,
                a.what
            ),
        ));
    }
    if a.what == "context" {
        return super::bench_context::run(s, &a.paths, a.runs).await;
    }
    if a.what == "cache" {
        return super::bench_cache::run(s, &a.paths).await;
    }
    if a.what != "agents" {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "unknown benchmark '{}'; abridge bench agents FILE|DIR…, abridge bench context FILE…, abridge bench cache FILE… or abridge bench facts [TEMPLATES.json] (cargo bench runs the others)",
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
        "{:<36} {:>8} {:>11} {:>9} {:>7} {:>9} {:>9} {:>8} {:>10} {:>8} {:>8}",
        "session file",
        "episodes",
        "transcript",
        "context",
        "ratio",
        "edited",
        "requests",
        "noise",
        "import ms",
        "p50 ms",
        "p99 ms"
    );
    // Each start's noise, by name, and all of it.
    let mut starts: Vec<(String, super::bench_noise::Noise)> = Vec::new();
    for f in &files {
        match measure(s, &exe, f, a.runs).await {
            Ok(r) => {
                let name: String = r.name.chars().take(36).collect();
                println!(
                    "{:<36} {:>8} {:>11} {:>9} {:>7.3} {:>9} {:>9} {:>8} {:>10.0} {:>8.0} {:>8.0}",
                    name,
                    r.episodes,
                    r.transcript_tokens,
                    r.context_tokens,
                    r.context_tokens as f64 / r.transcript_tokens.max(1) as f64,
                    format!("{}/{}", r.edited.0, r.edited.1),
                    format!("{}/{}", r.requests.0, r.requests.1),
                    format!("{}/{}", r.noise.noisy.len(), r.noise.shown),
                    r.import_ms,
                    r.p50_ms,
                    r.p99_ms
                );
                starts.push((r.name, r.noise));
            }
            Err(e) => println!("{}: not measured ({e:#})", f.display()),
        }
    }
    println!(
        "transcript/context: estimated tokens; edited, requests: present in the SessionStart context after a compaction ÷ in the session; noise: identifiers shown there that are a tool's name, a timing, ordinary words in capitals or shown twice ÷ identifiers shown; latency: abridge hook as a new process, {} runs",
        a.runs
    );
    starts.extend(
        next_sessions(s, &exe, &files)
            .await
            .map_err(|e| Failure::new(Exit::Internal, e))?,
    );
    let mut all = super::bench_noise::Noise::default();
    for (name, n) in &starts {
        all.add(n);
        if !n.noisy.is_empty() {
            let list: Vec<String> = n
                .noisy
                .iter()
                .map(|(e, why)| format!("{e} ({why})"))
                .collect();
            println!("noise in {name}: {}", list.join(" · "));
        }
    }
    println!(
        "noise: {}/{} = {:.3} of the identifiers shown at a start (after a compaction, and a next session's) are noise",
        all.noisy.len(),
        all.shown,
        all.noisy.len() as f64 / all.shown.max(1) as f64
    );
    Ok(())
}

fn is_tool(role: abridge_app::engine::types::Role) -> bool {
    role == abridge_app::engine::types::Role::Tool
}

/// A session file as abridge parses it (whatever its format).
pub(super) async fn parse(
    engine: &abridge_app::Pure,
    file: &Path,
) -> anyhow::Result<abridge_app::transcript::Parsed> {
    abridge_app::transcript::read_file(
        engine,
        file,
        None,
        abridge_app::transcript::Options::default(),
        1 << 30,
    )
    .await
    .map_err(|e| anyhow!("{e}"))
}

/// A session file's first user request (its text as abridge parses it) and when the session
/// began.
async fn first_request(
    engine: &abridge_app::Pure,
    file: &Path,
) -> anyhow::Result<Option<(Option<i64>, String, String)>> {
    let parsed = parse(engine, file).await?;
    let Some(conv) = parsed.conversations.first() else {
        return Ok(None);
    };
    let began = conv.episodes.iter().find_map(|e| e.timestamp_ms);
    let first = conv.episodes.iter().find(|e| {
        e.role == abridge_app::engine::types::Role::User
            && !e.content.starts_with("[Request interrupted")
            && !e.content.trim().is_empty()
    });
    Ok(first.map(|e| {
        (
            began,
            conv.id.clone().unwrap_or_else(|| "bench".into()),
            e.content.clone(),
        )
    }))
}

/// A session of a project: when it began, its id, its first request and its file.
type Started = (Option<i64>, String, String, PathBuf);

/// "A new session in the project": the sessions of each folder (one project), oldest first;
/// for each but the first, the earlier ones are imported through `abridge hook` (Stop, with
/// the project's cwd) into a fresh database, a new session starts there (SessionStart,
/// `startup`), and the next session's first request is looked up in what the start
/// injected: the share of its files and identifiers (the ledger's rules) found there.
/// Returns each start's noise (see [`super::bench_noise`]), by name.
async fn next_sessions(
    s: &Settings,
    exe: &Path,
    files: &[PathBuf],
) -> anyhow::Result<Vec<(String, super::bench_noise::Noise)>> {
    let mut noise = Vec::new();
    // Each file's episodes as `(is a tool's, text)`, read once for every start it precedes.
    let mut read: std::collections::BTreeMap<PathBuf, Vec<(bool, String)>> = Default::default();
    let engine = super::commands::pure_engine(s).map_err(|f| f.error)?;
    let mut projects: std::collections::BTreeMap<PathBuf, Vec<Started>> = Default::default();
    for f in files {
        if let Some((began, id, first)) = first_request(&engine, f).await? {
            let dir = f.parent().map(Path::to_path_buf).unwrap_or_default();
            projects
                .entry(dir)
                .or_default()
                .push((began, id, first, f.clone()));
        }
    }
    println!();
    println!(
        "{:<36} {:<36} {:>11} {:>9} {:>8}",
        "next session (project)", "after", "identifiers", "injected", "p50 ms"
    );
    let (mut found_all, mut total_all) = (0usize, 0usize);
    for (dir, mut sessions) in projects {
        if sessions.len() < 2 {
            continue;
        }
        sessions.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let cwd = format!(
            "/bench/{}",
            dir.file_name().map_or("p".into(), |n| n.to_string_lossy())
        );
        for k in 1..sessions.len() {
            let tmp =
                std::env::temp_dir().join(format!("abridge-bench-next-{}-{k}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp)?;
            let db = tmp.join("bench.db");
            for (_, id, _, f) in &sessions[..k] {
                hook(
                    exe,
                    &db,
                    &json!({"session_id": id, "transcript_path": f, "cwd": cwd, "hook_event_name": "Stop"}),
                )?;
            }
            let mut times = Vec::new();
            let mut injected = String::new();
            for _ in 0..5 {
                let (out, took) = hook(
                    exe,
                    &db,
                    &json!({"session_id": "00000000-0000-4000-8000-000000000000", "cwd": cwd,
                            "hook_event_name": "SessionStart", "source": "startup"}),
                )?;
                times.push(took.as_secs_f64() * 1000.0);
                injected = serde_json::from_str::<Value>(out.trim())
                    .ok()
                    .and_then(|v| {
                        v["hookSpecificOutput"]["additionalContext"]
                            .as_str()
                            .map(String::from)
                    })
                    .unwrap_or_default();
            }
            times.sort_by(f64::total_cmp);
            let (_, id, first, f) = &sessions[k];
            let wanted = engine.identifiers(first).await?;
            let found = wanted
                .iter()
                .filter(|e| {
                    injected.contains(&e.text) || abridge_app::hook::names_file(&injected, &e.text)
                })
                .count();
            found_all += found;
            total_all += wanted.len();
            let name: String = f
                .file_name()
                .map_or_else(|| id.clone(), |n| n.to_string_lossy().into_owned())
                .chars()
                .take(36)
                .collect();
            let after: String = sessions[..k]
                .iter()
                .map(|x| {
                    x.3.file_name()
                        .map_or(String::new(), |n| n.to_string_lossy().into_owned())
                })
                .collect::<Vec<_>>()
                .join(", ")
                .chars()
                .take(36)
                .collect();
            println!(
                "{name:<36} {after:<36} {:>11} {:>9} {:>8.0}",
                format!("{found}/{}", wanted.len()),
                engine.estimate_tokens(&injected).await?,
                percentile(&times, 0.5)
            );
            for (_, _, _, f) in &sessions[..k] {
                if !read.contains_key(f) {
                    let c = parse(&engine, f).await?.conversations.into_iter().next();
                    let texts = c.map_or_else(Vec::new, |c| {
                        c.episodes
                            .into_iter()
                            .map(|e| (is_tool(e.role), e.content))
                            .collect()
                    });
                    read.insert(f.clone(), texts);
                }
            }
            let vocabulary = super::bench_noise::Vocabulary::of(
                sessions[..k]
                    .iter()
                    .flat_map(|(_, _, _, f)| &read[f])
                    .map(|(t, s)| (*t, s.as_str())),
            );
            let n = super::bench_noise::noise(&injected, &vocabulary);
            noise.push((format!("the start of {name}"), n));
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    if total_all > 0 {
        println!(
            "next session: {found_all}/{total_all} = {:.2} of the files and identifiers of a next session's first request are in what its start injected (SessionStart, source startup; injected: estimated tokens)",
            found_all as f64 / total_all as f64
        );
    } else {
        println!(
            "next session: no folder holds two sessions with a first request (one project's sessions share a folder)"
        );
    }
    Ok(noise)
}
