//! Command-line interface: parsing, backend selection, commands, exit codes.

// `println!`/`print!` for every command below: a closed stdout (`abridge summaries S | head`)
// ends the process quietly with exit 0 instead of std's panic (exit 101).
macro_rules! println {
    () => { $crate::cli::out(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out(format_args!("{}\n", format_args!($($t)*))) };
}
macro_rules! print {
    ($($t:tt)*) => { $crate::cli::out(format_args!($($t)*)) };
}

mod app;
mod backfill;
mod bench;
mod bench_cache;
mod bench_context;
mod bench_facts;
mod bench_noise;
mod commands;
mod component;
mod fresh;
mod hook;
mod jobs;
mod mcp;
mod memory;
mod progress;
mod serve;
mod settings;
mod setup;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use settings::{Common, Settings};

/// Write to stdout, control characters escaped; when the reader has gone (a closed pipe), stop quietly: everything the
/// command stores is stored before it prints.
pub fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    // Whatever a command prints may carry text from outside (transcripts, model output):
    // control characters are shown as escapes, never obeyed by the terminal.
    let text = args.to_string();
    let safe = abridge_app::engine::text::printable_lines(&text);
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(safe.as_bytes()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("abridge: cannot write to standard output: {e}");
        std::process::exit(Exit::Internal as i32);
    }
}

/// `n` and a noun in the number it takes: "1 episode", "3 episodes", "1 summary pass".
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// clap's parser for a session id argument (see [`abridge_app::engine::text::check_session_id`]).
pub fn session_id(s: &str) -> Result<String, String> {
    abridge_app::engine::text::check_session_id(s).map(|()| s.to_string())
}

/// Exit statuses (documented in the README).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Something unexpected (a bug, a guest trap).
    Internal = 1,
    /// Bad input or usage: the file, a flag, the configuration.
    Input = 2,
    /// The model or its server failed.
    Model = 3,
    /// The database failed.
    Storage = 4,
}

/// An error with the exit status it maps to. Its message says what happened and how to fix it.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn new(exit: Exit, error: impl Into<anyhow::Error>) -> Self {
        Failure {
            exit,
            error: error.into(),
        }
    }
}

impl From<abridge_app::engine::CallError> for Failure {
    fn from(e: abridge_app::engine::CallError) -> Self {
        use abridge_app::engine::types::Error as E;
        let exit = match &e {
            abridge_app::engine::CallError::Engine(E::InvalidInput(_)) => Exit::Input,
            abridge_app::engine::CallError::Engine(E::Storage(_) | E::Conflict(_)) => Exit::Storage,
            abridge_app::engine::CallError::Engine(_) => Exit::Model,
            abridge_app::engine::CallError::Host(_) => Exit::Internal,
            abridge_app::engine::CallError::Cancelled => Exit::Model,
        };
        Failure::new(exit, e)
    }
}

impl From<abridge_app::transcript::TranscriptError> for Failure {
    fn from(e: abridge_app::transcript::TranscriptError) -> Self {
        Failure::new(Exit::Input, e)
    }
}

/// abridge keeps accurate, bounded summaries of conversation history, local-first against Ollama.
#[derive(Parser, Debug)]
#[command(
    name = "abridge",
    version = version_line(),
    about = "Summarization engine for conversation memory: keeps accurate, bounded summaries of a chat's or a coding agent's history, with exact provenance, and hands back a compact context for the next model call (local-first, against Ollama or with no model at all)",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    common: Common,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Import a transcript into a session (idempotent), bring its summaries up to date and
    /// print the latest summary.
    Summarize(commands::SummarizeArgs),
    /// Append episodes (JSON lines {"role","content","timestamp"?,"id"?}) from FILE or stdin,
    /// running the summary trigger after each one, as a chat app would.
    Ingest(commands::IngestArgs),
    /// Print a session's summary chain with the episode range each row covers.
    Summaries(commands::SummariesArgs),
    /// Print the facts a session's people stated, as they stand: each current value first,
    /// what it replaced, how it ended, and the episodes that said so.
    Facts(commands::FactsArgs),
    /// Import and summarize every transcript under a directory (Claude Code projects layout),
    /// passing over files unchanged since the last run.
    Backfill(backfill::BackfillArgs),
    /// Where each session stands: fresh, waiting (and until when), due, backing off after a
    /// failure, or stopped after repeated failures.
    Status(fresh::StatusArgs),
    /// Print the context for the next model call: a system message with the summary, then the
    /// latest turns, within a token budget, and the saving against the full history.
    Context(fresh::ContextArgs),
    /// Full-text search of every stored message (or one session's): the best matches, each
    /// with its session, episode number, time and the matching words marked.
    Search(fresh::SearchArgs),
    /// Summarize a stored session now, whatever its mode or backoff.
    Refresh(fresh::RefreshArgs),
    /// Show or set a session's own refresh mode (eager, idle or window), overriding the
    /// global one.
    Mode(fresh::ModeArgs),
    /// Show or set a session's focus instructions, added to every fold prompt.
    Focus(fresh::FocusArgs),
    /// Run as a Claude Code hook: read its JSON payload on stdin; SessionStart prints the
    /// session's context, PreCompact/Stop/SessionEnd import the transcript's new lines and
    /// summarize within the budget. Never blocks or fails the agent's turn.
    Hook(hook::HookArgs),
    /// Install abridge into a coding agent: Claude Code's hooks and MCP server, or Codex's
    /// MCP server (merged into its settings, a backup kept; --dry-run shows the diff,
    /// --remove takes it out again).
    Setup(setup::SetupArgs),
    /// Serve the MCP tools (context, search, expand, recall, remember, forget, pin)
    /// over standard input and output, for a coding agent; `abridge serve` offers them at
    /// /mcp over HTTP.
    Mcp(mcp::McpArgs),
    /// Measure on real transcripts (`agents`: context vs transcript tokens, edited files and
    /// requests kept after a compaction, hook latency). `cargo bench` runs the others.
    Bench(bench::BenchArgs),
    /// Pin an episode (always in the context verbatim, within the budget), unpin it, or list
    /// the pins.
    Pin(fresh::PinArgs),
    /// Provenance: print a summary row and exactly the episodes it covers (or, with
    /// --identifier, the episode a ledger entry came from).
    Expand(fresh::ExpandArgs),
    /// Delete a session's episodes and summaries.
    Reset(fresh::ResetArgs),
    /// Take a session's newest message back (an undo): the summary rows that covered it are
    /// deleted and what they covered besides it is folded again.
    Pop(fresh::PopArgs),
    /// Follow a directory of Claude Code / JSON-lines transcripts: import appended lines and
    /// keep each session's summary fresh (per --mode) until Ctrl-C.
    Watch(watch::WatchArgs),
    /// List summarization jobs, show or cancel one, or run the queued and interrupted ones.
    Jobs(jobs::JobsArgs),
    /// Run the HTTP service: per-tenant sessions, messages, context, jobs and live events
    /// (see docs/serve.md). Stops cleanly on SIGTERM or Ctrl-C.
    Serve(serve::ServeArgs),
    /// Create, list or revoke the API tokens `abridge serve` accepts.
    Tokens(serve::TokensArgs),
    /// Store, list, show, delete or import memories (small facts); related ones are grouped
    /// into clusters and summarized.
    Memory(memory::MemoryArgs),
    /// The memories and cluster summaries most related to a query.
    Recall(memory::RecallArgs),
    /// List memory clusters, show a cluster summary with its sources, or run the sweeper once.
    Clusters(memory::ClustersArgs),
    /// Make a master key for encryption at rest, or rotate to a new one.
    Keys(memory::KeysArgs),
    /// This month's model usage for cluster summaries, against the monthly ceiling.
    Usage(memory::UsageArgs),
    /// Delete a tenant and everything it has (its data keys included).
    Tenants(memory::TenantsArgs),
    /// Write the exact WebAssembly component this binary embeds and its WIT package, for a
    /// host written in another language or runtime (see docs/component.md).
    Component(component::ComponentArgs),
}

/// Structured logs on stderr: `RUST_LOG` filters (default: `info` for `serve`, `warn`
/// otherwise); `--log-format json` writes one JSON object per line for log collectors.
fn init_logs(cli: &Cli) {
    use tracing_subscriber::EnvFilter;
    // A command says a job's failure in its own message, once: the app's log line for it
    // (a server's record of a background job) is left to `serve`.
    let default = if matches!(cli.cmd, Cmd::Serve(_)) {
        "info"
    } else {
        "warn,abridge_app::run=error"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match cli.common.log_format {
        settings::LogFormat::Json => b.json().try_init(),
        settings::LogFormat::Text => b.with_ansi(false).try_init(),
    };
}

/// `abridge --version`: the release and the exact component it embeds.
fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        format!(
            "{} (component sha256 {})",
            env!("CARGO_PKG_VERSION"),
            abridge_app::engine::EMBEDDED_SHA256
        )
    })
}

/// The help of the command `argv` names, with the global options (the database, the model
/// and the refresh settings) listed once, by `abridge --help`: a subcommand's help names them
/// in a line instead of repeating thirty of them (they are accepted anywhere on the line all
/// the same). Parsing uses the plain command; this one only shows help.
fn help_for(argv: &[String]) -> String {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    cmd.build();
    let globals: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().clone())
        .collect();
    // The subcommands named, in order ("abridge help jobs show" names them too), past the
    // options and their values.
    let mut path: Vec<String> = Vec::new();
    {
        let mut at = &cmd;
        let mut words = argv.iter().skip(1);
        while let Some(w) = words.next() {
            if let Some(flag) = w.strip_prefix('-') {
                let takes_value = |a: &clap::Arg| a.get_action().takes_values();
                let arg = match flag.strip_prefix('-') {
                    Some(long) if !long.contains('=') => {
                        at.get_arguments().find(|a| a.get_long() == Some(long))
                    }
                    Some(_) => None,
                    None if flag.chars().count() == 1 => {
                        let c = flag.chars().next();
                        at.get_arguments().find(|a| a.get_short() == c)
                    }
                    None => None,
                };
                if arg.is_some_and(takes_value) {
                    words.next();
                }
                continue;
            }
            if path.is_empty() && w == "help" {
                continue;
            }
            match at.find_subcommand(w) {
                Some(sc) => {
                    path.push(sc.get_name().to_string());
                    at = sc;
                }
                None => break,
            }
        }
    }
    let long = argv.iter().any(|w| w == "--help" || w == "help");
    let mut at = cmd;
    for name in &path {
        let mut sc = at.find_subcommand(name).expect("found above").clone();
        for id in &globals {
            if sc.get_arguments().any(|a| a.get_id() == id) {
                sc = sc.mut_arg(id.clone(), |a| a.hide(true));
            }
        }
        at = sc;
    }
    if !path.is_empty() {
        at = at.after_help(
            "Global options (--db, --config, --backend, --model, --url, --mode, the trigger and refresh settings, --log-format, -q…) work here too: see `abridge --help`.",
        );
    }
    if long {
        at.render_long_help().to_string()
    } else {
        at.render_help().to_string()
    }
}

pub fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            print!("{}", help_for(&argv));
            return ExitCode::SUCCESS;
        }
        Err(e) => e.exit(),
    };
    init_logs(&cli);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("abridge: cannot start the async runtime: {e}");
            return ExitCode::from(Exit::Internal as u8);
        }
    };
    let result = rt.block_on(run(cli));
    // For benchmarks: the process's own peak resident memory (Linux), on stderr.
    if std::env::var_os("ABRIDGE_REPORT_PEAK_RSS").is_some()
        && let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(line) = status.lines().find(|l| l.starts_with("VmHWM:"))
    {
        eprintln!(
            "abridge: peak RSS {}",
            line.trim_start_matches("VmHWM:").trim()
        );
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("abridge: {:#}", f.error);
            ExitCode::from(f.exit as u8)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let settings = Settings::resolve(&cli.common, &settings::ProcessEnv)
        .map_err(|e| Failure::new(Exit::Input, e))?;
    // Only the long-lived processes read the database through a memory map; a one-shot
    // command's resident memory then follows its work, not the file's size.
    abridge_app::db::memory_map(matches!(cli.cmd, Cmd::Serve(_) | Cmd::Mcp(_)));
    match cli.cmd {
        Cmd::Summarize(a) => commands::summarize(&settings, a).await,
        Cmd::Ingest(a) => commands::ingest(&settings, a).await,
        Cmd::Summaries(a) => commands::summaries(&settings, a).await,
        Cmd::Facts(a) => commands::facts(&settings, a).await,
        Cmd::Backfill(a) => backfill::backfill(&settings, a).await,
        Cmd::Status(a) => fresh::status(&settings, a).await,
        Cmd::Context(a) => fresh::context(&settings, a).await,
        Cmd::Search(a) => fresh::search(&settings, a).await,
        Cmd::Refresh(a) => fresh::refresh(&settings, a).await,
        Cmd::Mode(a) => fresh::mode(&settings, a).await,
        Cmd::Focus(a) => fresh::focus(&settings, a).await,
        Cmd::Pin(a) => fresh::pin(&settings, a).await,
        Cmd::Hook(a) => hook::hook(&settings, a).await,
        Cmd::Setup(a) => setup::setup_cmd(&settings, a).await,
        Cmd::Mcp(a) => mcp::mcp_cmd(&settings, a).await,
        Cmd::Bench(a) => bench::bench_cmd(&settings, a).await,
        Cmd::Expand(a) => fresh::expand(&settings, a).await,
        Cmd::Reset(a) => fresh::reset(&settings, a).await,
        Cmd::Pop(a) => fresh::pop(&settings, a).await,
        Cmd::Watch(a) => watch::watch(&settings, a).await,
        Cmd::Jobs(a) => jobs::jobs(&settings, a).await,
        Cmd::Serve(a) => serve::serve_cmd(&settings, a).await,
        Cmd::Tokens(a) => serve::tokens_cmd(&settings, a).await,
        Cmd::Memory(a) => memory::memory_cmd(&settings, a).await,
        Cmd::Recall(a) => memory::recall_cmd(&settings, a).await,
        Cmd::Clusters(a) => memory::clusters_cmd(&settings, a).await,
        Cmd::Keys(a) => memory::keys_cmd(&settings, a).await,
        Cmd::Usage(a) => memory::usage_cmd(&settings, a).await,
        Cmd::Tenants(a) => memory::tenants_cmd(&settings, a).await,
        Cmd::Component(a) => component::component_cmd(a).await,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
        // Every subcommand parses into its struct (an argument id shared with a global
        // option of another type would panic here).
        for args in [
            &["summarize", "f.jsonl"][..],
            &["ingest", "--session", "s"],
            &["backfill", "d", "--min-episodes", "2", "--dry-run"],
            &["watch", "d", "--once"],
            &["status"],
            &["context", "s", "--budget", "100"],
            &["refresh", "s"],
            &["mode", "s", "idle"],
            &["reset", "s"],
            &["jobs", "show", "1"],
            &["summaries", "s"],
            &["serve", "--listen", "127.0.0.1:0", "--workers", "3"],
            &["tokens", "create", "--tenant", "acme", "--read-only"],
            &["tokens", "revoke", "3"],
            &["status", "--log-format", "json"],
            &[
                "memory", "add", "t", "--user", "u", "--type", "fact", "--key", "k",
            ],
            &["memory", "list", "--user", "u", "--type", "fact"],
            &["recall", "q", "-k", "3", "--project", "p"],
            &["clusters", "sweep"],
            &["keys", "rotate", "--new-key-file", "k"],
            &["tenants", "delete", "acme", "--yes"],
            &["component", "--out", "dir", "--json"],
        ] {
            let argv = std::iter::once("abridge").chain(args.iter().copied());
            <super::Cli as clap::Parser>::try_parse_from(argv)
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    #[test]
    fn help_tells_the_truth_and_lists_the_global_options_once() {
        let help = |args: &[&str]| {
            let argv: Vec<String> = std::iter::once("abridge")
                .chain(args.iter().copied())
                .map(String::from)
                .collect();
            super::help_for(&argv)
        };
        let top = help(&["--help"]);
        assert!(
            top.starts_with("Summarization engine for conversation memory"),
            "{top}"
        );
        assert!(
            top.contains("--temperature") && top.contains("--db <PATH>"),
            "{top}"
        );
        assert!(
            top.contains("[env: ABRIDGE_MODE] [default: window]"),
            "{top}"
        );
        assert!(!top.contains("README: Serve"), "{top}");
        for args in [
            &["summarize", "--help"][..],
            &["summarize", "-h"],
            &["help", "context"],
            &["jobs", "show", "--help"],
            &["--db", "x.db", "memory", "add", "-h"],
        ] {
            let h = help(args);
            assert!(!h.contains("--temperature"), "{args:?}: {h}");
            assert!(h.contains("see `abridge --help`"), "{args:?}: {h}");
            let name = args
                .iter()
                .find(|a| !a.starts_with('-') && **a != "help" && **a != "x.db");
            assert!(
                h.contains(&format!("Usage: abridge {}", name.unwrap())),
                "{args:?}: {h}"
            );
        }
        // Still accepted after the subcommand.
        let cli = <super::Cli as clap::Parser>::try_parse_from([
            "abridge",
            "status",
            "--temperature",
            "0.1",
            "--db",
            "x.db",
        ])
        .expect("globals parse after the subcommand");
        assert_eq!(cli.common.db.as_deref(), Some(std::path::Path::new("x.db")));
    }
}
