//! The commands.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use clap::Args;
use serde_json::json;

use abridge_app::engine::types::{Config, Engine, Error, SummaryRow, describe};
use abridge_app::transcript::{self, Format, Options};
use abridge_app::{AppError, Bring, ImportRequest};

use super::app::{Show, shown};
use super::progress::Mode;
use super::settings::BackendChoice;
use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct SummarizeArgs {
    /// Transcript file
    file: PathBuf,
    /// Input format
    #[arg(long, default_value = "auto", value_parser = ["auto", "jsonl", "openai", "claude-code", "chatgpt"])]
    format: String,
    /// Session id [default: the transcript's own id, else the file name]
    #[arg(long, value_parser = super::session_id)]
    session: Option<String>,
    /// Print JSON instead of the summary text
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    read: ReadArgs,
    /// Print the plan (path, chunks, reduce levels, calls, tokens, cost) for summarizing the
    /// file from scratch, without calling a model or touching the database
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    prices: Prices,
}

/// How transcript files are read (summarize and backfill).
#[derive(Args, Debug, Clone, Copy)]
pub struct ReadArgs {
    /// Skip malformed lines (with a warning) instead of refusing the file
    #[arg(long)]
    pub skip_invalid: bool,
    /// Keep tool calls and tool results as episodes
    #[arg(long)]
    pub include_tools: bool,
    /// Refuse files larger than this many bytes
    #[arg(long, default_value_t = transcript::DEFAULT_MAX_BYTES)]
    pub max_bytes: u64,
}

impl ReadArgs {
    /// The parser options.
    pub fn options(&self) -> Options {
        Options {
            include_tools: self.include_tools,
            skip_invalid: self.skip_invalid,
            first_line: 0,
            // A file on the command line is bounded by --max-bytes.
            max_episodes: 0,
            format_flag: None,
            // A file read whole: its messages are dated by themselves, not by the import.
            arrived: false,
        }
    }
}

/// Prices for a dry run's cost estimate.
#[derive(Args, Debug, Clone, Copy)]
pub struct Prices {
    /// Price of a million input tokens, for --dry-run's cost estimate
    #[arg(
        long,
        env = "ABRIDGE_PRICE_IN",
        default_value_t = 0.0,
        value_name = "USD"
    )]
    pub price_in: f64,
    /// Price of a million output tokens, for --dry-run's cost estimate
    #[arg(
        long,
        env = "ABRIDGE_PRICE_OUT",
        default_value_t = 0.0,
        value_name = "USD"
    )]
    pub price_out: f64,
}

impl Prices {
    /// The cost of `input` and `output` tokens, in USD.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        input as f64 / 1e6 * self.price_in + output as f64 / 1e6 * self.price_out
    }
}

#[derive(Args, Debug)]
pub struct IngestArgs {
    /// Session to append to
    #[arg(long, value_parser = super::session_id)]
    session: String,
    /// JSON-lines file, or - for standard input
    #[arg(default_value = "-")]
    file: PathBuf,
    /// Keep tool lines as episodes
    #[arg(long)]
    include_tools: bool,
    /// Print one JSON object per written summary on stdout
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct SummariesArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Every row ever written, the ones compacted into "earlier" rows included
    #[arg(long)]
    all: bool,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct FactsArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Print JSON (every value with the episode that said it)
    #[arg(long)]
    json: bool,
    /// Under each fact, the messages that said its values and its end
    #[arg(long)]
    messages: bool,
}

/// `abridge facts SESSION`: the facts the session's people stated, as they stand, each with
/// what it replaced and the episodes that said it (with `--messages`, those messages).
pub async fn facts(s: &Settings, mut a: FactsArgs) -> Result<(), Failure> {
    let local = super::app::local_read(s)?;
    a.session = local.resolve(&a.session).await?;
    let facts = local.facts(&a.session).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "session": a.session, "facts": facts }))
                .expect("facts serialize")
        );
        return Ok(());
    }
    if facts.is_empty() {
        eprintln!(
            "abridge: session '{}' states no facts the rules read (where someone lives, works, their number, manager, partner, pet, car or a regular day)",
            a.session
        );
        return Ok(());
    }
    for f in &facts {
        let episodes: Vec<String> = f.episodes().map(|e| format!("#{e}")).collect();
        println!(
            "{}  [{}]",
            abridge_app::engine::text::printable(&f.line),
            episodes.join(", ")
        );
        if a.messages {
            for id in f.episodes() {
                let page = local.messages(&a.session, id.saturating_sub(1), 1).await?;
                for m in page.messages.iter().filter(|m| m.id == id) {
                    println!(
                        "    #{} {}: {}",
                        m.id,
                        m.speaker.as_deref().unwrap_or(&m.role),
                        abridge_app::engine::text::printable(&m.content)
                    );
                }
            }
        }
    }
    Ok(())
}

pub(super) fn note(s: &Settings, msg: &str) {
    if !s.quiet {
        eprintln!(
            "abridge: {}",
            abridge_app::engine::text::printable_lines(msg)
        );
    }
}

/// The chosen backend (see [`abridge_backend::open`]).
pub(super) type Backend = abridge_backend::Opened;

fn model_failure(e: Error) -> Failure {
    let exit = if matches!(e, Error::InvalidInput(_)) {
        Exit::Input
    } else {
        Exit::Model
    };
    Failure::new(exit, anyhow!(describe(&e)))
}

/// Open the backend the settings ask for (the one rule every front end uses), telling the
/// user what it notes.
pub(super) async fn choose_backend(s: &Settings) -> Result<Backend, Failure> {
    let choice = match s.backend {
        BackendChoice::Auto => abridge_backend::Choice::Auto,
        BackendChoice::Ollama => abridge_backend::Choice::Ollama,
        BackendChoice::Openai => abridge_backend::Choice::Openai,
        BackendChoice::Extractive => abridge_backend::Choice::Extractive,
    };
    let settings = abridge_backend::open::Settings {
        choice,
        model: s.config.model.clone(),
        ollama_url: s.url.clone(),
        openai_base_url: s.openai_base_url.clone(),
        openai_api_key: s.openai_api_key.clone(),
        timeout: s.timeout,
        retry: s.retry,
    };
    let opened = abridge_backend::open(&settings)
        .await
        .map_err(model_failure)?;
    // Auto fell back to the extractive summarizer: its notice is said once a day on this
    // machine, not on every ingest, hook and MCP start.
    let fallback = matches!(s.backend, BackendChoice::Auto) && opened.engine == Engine::Extractive;
    if !(fallback && said_today("ollama-unreachable")) {
        for n in &opened.notes {
            note(s, n);
        }
    }
    Ok(opened)
}

/// Whether the notice `name` was said already today (UTC) to this user on this machine; if
/// not, it is marked as said now (`$XDG_STATE_HOME/abridge/notices/NAME`, else
/// `~/.local/state/abridge/notices/NAME`, holding the day). Without either every notice is
/// said.
fn said_today(name: &str) -> bool {
    use abridge_app::engine::Clock;
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".local/state"))
        });
    let Some(dir) = state.map(|d| d.join("abridge/notices")) else {
        return false;
    };
    let day = (abridge_app::engine::SystemClock.now_ms() / 86_400_000).to_string();
    let file = dir.join(name);
    if std::fs::read_to_string(&file).is_ok_and(|d| d.trim() == day) {
        return true;
    }
    let _ = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, &day));
    false
}

/// The engine configuration for the chosen backend.
pub(super) fn engine_config(s: &Settings, b: &Backend) -> Config {
    b.config(&s.config)
}

/// The compiled guest, loaded once per process and shared by every engine it builds (and by
/// the defaults, which the component answers: see `abridge_app::engine::defaults`).
pub(super) fn runtime() -> Result<Arc<abridge_app::engine::Runtime>, Failure> {
    abridge_app::engine::Runtime::embedded()
        .map_err(|e| Failure::new(Exit::Internal, e.context("loading the engine component")))
}

/// An engine for the pure calls (parsing, counting, planning): no database and no model.
pub(super) fn pure_engine(s: &Settings) -> Result<abridge_app::Pure, Failure> {
    Ok(abridge_app::Pure::new(
        runtime()?,
        super::app::stderr_log(s),
    )?)
}

/// A summary row as JSON: the same record the HTTP API answers with.
pub(super) fn row_json(r: &SummaryRow) -> serde_json::Value {
    serde_json::to_value(abridge_app::SummaryView::from(r)).expect("a summary row serializes")
}

pub async fn summarize(s: &Settings, a: SummarizeArgs) -> Result<(), Failure> {
    let format = Format::parse(&a.format).map_err(|e| Failure::new(Exit::Input, anyhow!(e)))?;
    let name = a.file.display().to_string();
    let opts = a.read.options();
    // Two passes, neither holding the file: the first checks every line and counts, the
    // second stores one read at a time (standard input is spooled to a temporary file).
    let input = transcript::Input::open(&a.file, a.read.max_bytes)?;
    if a.dry_run {
        return dry_run(s, &a, input, format).await;
    }
    let mode = Mode::detect(a.json, s.quiet);
    let backend = choose_backend(s).await?;
    let cfg = engine_config(s, &backend);
    let local = super::app::local(s, Some(&backend))?;
    let model = backend.model_name(&cfg);
    let req = ImportRequest {
        format,
        session: a.session.as_deref(),
        file: Some(&a.file),
        opts,
        max_bytes: a.read.max_bytes,
        ..ImportRequest::new(&name, input)
    };
    let done = shown(s, &local, a.session.as_deref(), Show::Own(mode), async {
        local
            .import(req, Bring::Now(&cfg))
            .await
            .map_err(AppError::from)
    })
    .await?;
    for w in &done.warnings {
        note(s, w);
    }
    let many = done.conversations.len() > 1;
    for conv in done.conversations {
        let (session, added) = (conv.session, conv.added);
        note(
            s,
            &format!(
                "session {session}: {} read ({}), {added} new",
                super::count(conv.read, "episode", "episodes"),
                done.format
            ),
        );
        if let Some(e) = conv.failure {
            let f = super::app::run_failure(e);
            return Err(Failure::new(
                f.exit,
                anyhow!(
                    "session {session}: {:#} (the {added} new episodes are stored)",
                    f.error
                ),
            ));
        }
        if let Some(job) = conv.job {
            note(
                s,
                &format!(
                    "session {session}: job {} succeeded with {} ({} attempt(s))",
                    job.id, backend.name, job.attempts
                ),
            );
        }
        if a.json {
            let chain = local.summaries(&session).await?;
            let v = json!({
                "session": session,
                "backend": backend.name,
                "model": model,
                "episodes": conv.episodes,
                "new_episodes": added,
                "summaries": chain,
            });
            println!("{v}");
        } else {
            if many {
                let title = conv
                    .title
                    .as_deref()
                    .map(|t| format!(" ({t})"))
                    .unwrap_or_default();
                println!("== {session}{title} ==");
            }
            match local.latest_summary(&session).await? {
                Some(r) => println!("{}", r.content),
                None => println!("(no summary yet)"),
            }
        }
    }
    Ok(())
}

/// The plan for summarizing each conversation from scratch: imported into a database in
/// memory by the same rules as a real run, planned there, no model called.
async fn dry_run(
    s: &Settings,
    a: &SummarizeArgs,
    input: transcript::Input<'_>,
    format: Option<Format>,
) -> Result<(), Failure> {
    let scratch = super::app::in_memory(s)?;
    let name = a.file.display().to_string();
    let req = ImportRequest {
        format,
        session: a.session.as_deref(),
        file: Some(&a.file),
        opts: a.read.options(),
        max_bytes: a.read.max_bytes,
        ..ImportRequest::new(&name, input)
    };
    let done = scratch
        .import(req, Bring::Later)
        .await
        .map_err(AppError::from)?;
    for w in &done.warnings {
        note(s, w);
    }
    let mut cfg = s.config.clone();
    cfg.engine = if s.backend == BackendChoice::Extractive {
        Engine::Extractive
    } else {
        Engine::Llm
    };
    for session in done.conversations.into_iter().map(|c| c.session) {
        let p = scratch.plan(&session, &cfg).await?;
        let path = match p.path {
            abridge_app::engine::types::PlanPath::Nothing => "nothing",
            abridge_app::engine::types::PlanPath::Single => "single",
            abridge_app::engine::types::PlanPath::Rolling => "rolling",
            abridge_app::engine::types::PlanPath::MapReduce => "map-reduce",
        };
        let cost = a.prices.cost(p.input_tokens, p.output_tokens);
        if a.json {
            let v = json!({
                "session": session, "dry_run": true, "model": cfg.model, "context_length": cfg.context_length,
                "path": path, "episodes": p.episodes, "backlog_tokens": p.backlog_tokens, "chunks": p.chunks,
                "levels": p.levels, "calls": p.calls, "input_tokens": p.input_tokens, "output_tokens": p.output_tokens,
                "cost_usd": cost,
            });
            println!("{v}");
        } else {
            println!(
                "dry run for session {session} (from scratch; no model is called and nothing is stored)"
            );
            println!(
                "  {}, ~{} tokens; model {} with a {}-token context",
                super::count(p.episodes, "episode", "episodes"),
                p.backlog_tokens,
                cfg.model,
                cfg.context_length
            );
            match p.path {
                abridge_app::engine::types::PlanPath::MapReduce => println!(
                    "  path map-reduce: {} chunks, then about {:?} reduce calls per level, about {} calls",
                    p.chunks, p.levels, p.calls
                ),
                _ => println!("  path {path}: {} call(s)", p.calls),
            }
            println!(
                "  tokens: ~{} in, at most {} out",
                p.input_tokens, p.output_tokens
            );
            println!(
                "  cost: ${cost:.4} at ${}/M in and ${}/M out (set --price-in/--price-out)",
                a.prices.price_in, a.prices.price_out
            );
        }
    }
    Ok(())
}

pub async fn ingest(s: &Settings, a: IngestArgs) -> Result<(), Failure> {
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    let cfg = local.session_config(&a.session).await?;
    let name = a.file.display().to_string();
    let mut reader: Box<dyn std::io::Read> = if name == "-" {
        Box::new(std::io::stdin())
    } else {
        let f = std::fs::File::open(&a.file).map_err(|e| {
            Failure::new(
                Exit::Input,
                anyhow!("cannot read {name}: {e} — check the path"),
            )
        })?;
        Box::new(f)
    };
    let (mut appended, mut passes) = (0u64, 0u32);
    let mut refresh_failure: Option<abridge_app::AppError> = None;
    let mut n = 0usize;
    // The lines are parsed in the sandbox, as they arrive: memory holds one read and one line.
    let parser = pure_engine(s)?;
    let opts = Options {
        include_tools: a.include_tools,
        ..Options::default()
    };
    let mut feeder =
        transcript::Feeder::streaming(&parser, &name, Some(Format::Jsonl), opts).await?;
    let mut buf = vec![0u8; 64 << 10];
    let mut eof = false;
    while !eof {
        let got = match reader.read(&mut buf) {
            Ok(0) => {
                eof = true;
                0
            }
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::new(Exit::Input, anyhow!("reading {name}: {e}"))),
        };
        let parsed = if eof {
            // The last line may lack its newline: end the parse with it.
            feeder.feed(b"\n").await
        } else {
            feeder.feed(&buf[..got]).await
        };
        if let Err(e) = parsed {
            return Err(Failure::new(
                Exit::Input,
                anyhow!("{e}; the {appended} earlier episodes are stored"),
            ));
        }
        let mut episodes = feeder.drain();
        local.keyed(&mut episodes);
        for ep in episodes {
            n += 1;
            // The app decides whether a refresh is due and runs it here (a job running on
            // this session elsewhere covers the work). A failed refresh keeps the previous
            // summary and backs off; the messages keep coming and are stored all the same.
            let outcome = local
                .append_inline(&a.session, std::slice::from_ref(&ep), &cfg)
                .await?;
            appended += u64::from(outcome.stored);
            if let Some(e) = outcome.failure {
                note(
                    s,
                    &format!(
                        "{name}:{n}: the summary was not refreshed ({}); the previous one is kept and the next attempt backs off",
                        e.message
                    ),
                );
                refresh_failure = Some(e);
                continue;
            }
            if outcome.passes > 0 {
                refresh_failure = None;
            }
            passes += outcome.passes;
            for r in &outcome.written {
                note(
                    s,
                    &format!(
                        "session {}: summary {} now covers episodes {}-{}",
                        a.session, r.id, r.first_episode, r.last_episode
                    ),
                );
                if a.json {
                    println!("{}", row_json(r));
                }
            }
        }
    }
    for w in feeder.finish_warnings() {
        note(s, &w);
    }
    note(
        s,
        &format!(
            "session {}: {} appended, {}",
            a.session,
            super::count(appended, "episode", "episodes"),
            super::count(passes as u64, "summary pass", "summary passes")
        ),
    );
    // Say why nothing was summarized when a failure holds refreshes back.
    let f = local.freshness(&a.session, &cfg).await?;
    if matches!(
        f.state,
        abridge_app::engine::types::FreshState::BackingOff
            | abridge_app::engine::types::FreshState::GaveUp
    ) {
        note(s, &format!("session {}: {}", a.session, f.reason));
    }
    match refresh_failure {
        None => Ok(()),
        Some(e) => Err(Failure::new(
            Exit::Model,
            anyhow!(
                "the summary could not be refreshed: {} — all {appended} episodes are stored and the previous summary is kept",
                e.message
            ),
        )),
    }
}

pub async fn summaries(s: &Settings, mut a: SummariesArgs) -> Result<(), Failure> {
    let local = super::app::local_read(s)?;
    let listed = match local.resolve(&a.session).await {
        Ok(name) => {
            a.session = name;
            if a.all {
                local.summary_history(&a.session).await
            } else {
                local.summaries(&a.session).await
            }
        }
        Err(e) => Err(e),
    };
    let rows = match listed {
        Ok(rows) => rows,
        Err(e) => return Err(e.into()),
    };
    let episodes = local.session(&a.session).await?.episodes;
    // What each row covers (the app's coverage: its last exchange's time, and how far into
    // the transcript file it reaches when the session came from one), under the names this
    // command has always printed.
    let rows = local.with_coverage(&a.session, rows).await?;
    let full: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut v = json!(r);
            let c = r.coverage.as_ref();
            v["covered_until_ms"] = json!(c.and_then(|c| c.last_exchange_ms));
            v["source"] = json!(c.and_then(|c| c.source.as_ref()));
            v
        })
        .collect();
    let (title, project) = local.label(&a.session).await?;
    if a.json {
        let v = json!({
            "session": a.session,
            "title": title,
            "project": project,
            "episodes": episodes,
            "summaries": full,
        });
        println!("{v}");
        return Ok(());
    }
    if title.is_some() || project.is_some() {
        let t = title.map(|t| format!("\"{t}\"")).unwrap_or_default();
        let p = project.map(|p| format!(" in {p}")).unwrap_or_default();
        println!("{}", format!("{t}{p}").trim());
    }
    let covered = rows
        .iter()
        .filter(|r| r.compacted_into.is_none())
        .map(|r| r.last_episode)
        .max()
        .unwrap_or(0);
    println!(
        "session {}: {}, {}{}, {} unsummarized",
        a.session,
        super::count(episodes, "episode", "episodes"),
        super::count(rows.len() as u64, "summary row", "summary rows"),
        if a.all {
            " (compacted ones included)"
        } else {
            ""
        },
        episodes - covered
    );
    for (r, v) in rows.iter().zip(&full) {
        let mut extra = String::new();
        if let Some(t) = v["covered_until_ms"].as_i64() {
            extra.push_str(&format!(
                "; through {} UTC",
                super::progress::utc_text(t.max(0) as u64)
            ));
        }
        if let (Some(p), Some(b)) = (v["source"]["path"].as_str(), v["source"]["bytes"].as_u64()) {
            extra.push_str(&format!("; {b} bytes of {p}"));
        }
        if r.level > 0 {
            extra.push_str(&format!("; earlier summary, level {}", r.level));
        }
        if let Some(into) = r.compacted_into {
            extra.push_str(&format!("; compacted into #{into}"));
        }
        println!(
            "\n#{} episodes {}-{} ({} tokens, {}{extra})\n{}",
            r.id, r.first_episode, r.last_episode, r.tokens, r.model, r.content
        );
        if !r.ledger.is_empty() {
            let items: Vec<String> = r
                .ledger
                .iter()
                .map(|e| format!("{} (#{})", e.text, e.episode))
                .collect();
            println!(
                "identifiers: {}{}",
                items.join(" · "),
                if r.ledger_dropped > 0 {
                    format!(" ({} dropped for the budget)", r.ledger_dropped)
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
