//! Configuration: flags > environment > `abridge.toml` > defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::Deserialize;

use abridge_app::engine::types::{Config, Engine, Mode, Rendering};

/// Which model backend to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// Ollama if it answers, else the extractive summarizer (announced).
    Auto,
    /// Ollama's native API (required to answer).
    Ollama,
    /// An OpenAI-compatible server at OPENAI_BASE_URL.
    Openai,
    /// Sentence selection, no model.
    Extractive,
}

/// How prompts are sent to Ollama.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RenderingChoice {
    /// `/api/chat` with chat messages.
    Chat,
    /// `/api/generate` with a raw ChatML prompt.
    Chatml,
}

/// When automatic refreshes summarize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeChoice {
    /// After each episode write, under the trigger thresholds.
    Eager,
    /// Once the conversation has been quiet for the quiescence window.
    Idle,
    /// Only what has left the context's recent window, in bounded-overhead batches.
    Window,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Options every command accepts.
#[derive(Args, Debug, Default, Clone)]
pub struct Common {
    /// SQLite database file, or a postgres://USER:PASSWORD@HOST:PORT/DB URL of a database
    /// several `abridge serve` instances share [env: ABRIDGE_DB] [default:
    /// ~/.local/share/abridge/abridge.db]
    #[arg(long, global = true, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Configuration file [env: ABRIDGE_CONFIG] [default: ./abridge.toml if present]
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Model backend [env: ABRIDGE_BACKEND] [default: auto]
    #[arg(long, global = true, value_enum)]
    pub backend: Option<BackendChoice>,
    /// Model name [env: EXTRACTION_MODEL] [default: qwen2.5:3b]
    #[arg(long, global = true)]
    pub model: Option<String>,
    /// Ollama URL [env: EXTRACTION_URL] [default: http://localhost:11434]
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// OpenAI-compatible base URL, ending in /v1 [env: OPENAI_BASE_URL] [default: <url>/v1]
    #[arg(long, global = true)]
    pub openai_base_url: Option<String>,
    /// Prompt transport for Ollama [env: ABRIDGE_RENDERING] [default: chat]
    #[arg(long, global = true, value_enum)]
    pub rendering: Option<RenderingChoice>,
    /// Model context window in tokens, sent as num_ctx [env: ABRIDGE_CONTEXT_LENGTH] [default: 4096]
    #[arg(long, global = true)]
    pub context_length: Option<u32>,
    /// Output limit per call in tokens [env: ABRIDGE_MAX_OUTPUT_TOKENS] [default: 500]
    #[arg(long, global = true)]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature [env: ABRIDGE_TEMPERATURE] [default: 0.2]
    #[arg(long, global = true)]
    pub temperature: Option<f32>,
    /// Trigger: session tokens must exceed this [env: SUMMARY_THRESHOLD_TOKENS] [default: 200]
    #[arg(long, global = true)]
    pub threshold_tokens: Option<u32>,
    /// Update the latest summary while it is under this many tokens [env: SUMMARY_MAX_TOKENS] [default: 800]
    #[arg(long, global = true)]
    pub max_summary_tokens: Option<u32>,
    /// Trigger: episodes needed since the last summary [env: SUMMARY_MIN_EPISODES] [default: 5]
    #[arg(long = "min-new-episodes", global = true)]
    pub min_episodes: Option<u32>,
    /// Map-reduce: fail instead of summarizing when more than this percentage of chunks fail
    /// [env: ABRIDGE_MAX_SKIPPED_PERCENT] [default: 50]
    #[arg(long, global = true)]
    pub max_skipped_percent: Option<u32>,
    /// Time limit per model call in seconds [env: ABRIDGE_TIMEOUT_SECS] [default: 300]
    #[arg(long, global = true)]
    pub timeout_secs: Option<u64>,
    /// Map-reduce: cap on a chunk's estimated tokens (0: derived from the context length)
    /// [env: SUMMARIZE_CHUNK_TOKENS] [default: 0]
    #[arg(long, global = true)]
    pub chunk_tokens: Option<u32>,
    /// Map-reduce: model requests in flight at once, as a sliding window
    /// [env: SUMMARIZE_CHUNK_CONCURRENCY] [default: 6]
    #[arg(long, global = true)]
    pub concurrency: Option<usize>,
    /// Attempts per model request; timeouts, connection errors, 429/5xx and unparseable answers
    /// are retried with exponential backoff and jitter [env: ABRIDGE_RETRIES] [default: 3]
    #[arg(long, global = true)]
    pub retries: Option<u32>,
    /// When automatic refreshes summarize: eager (after each write, under the trigger), idle
    /// (once the conversation is quiet) or window (only what left the context's recent
    /// window, in bounded-overhead batches) [env: ABRIDGE_MODE] [default: window]
    #[arg(long, global = true)]
    pub mode: Option<ModeChoice>,
    /// Idle mode: quiet seconds, from the last message's own timestamp, before summarizing
    /// [env: ABRIDGE_QUIESCENCE_SECS] [default: 3600]
    #[arg(long, global = true)]
    pub quiescence_secs: Option<u32>,
    /// Idle mode: an active conversation with this many unsummarized tokens gets a provisional
    /// summary (0: never) [env: ABRIDGE_PROVISIONAL_TOKENS] [default: 0]
    #[arg(long, global = true)]
    pub provisional_tokens: Option<u32>,
    /// Automatic refreshes stop after this many failures in a row
    /// [env: ABRIDGE_MAX_ATTEMPTS] [default: 5]
    #[arg(long, global = true)]
    pub max_attempts: Option<u32>,
    /// Eager mode: unsummarized tokens that are due whatever their message count
    /// [env: SUMMARY_MAX_BACKLOG_TOKENS] [default: 1000]
    #[arg(long, global = true)]
    pub max_backlog_tokens: Option<u32>,
    /// The summary chain's share of a context: over it, the oldest rows are compacted into
    /// one "earlier" row [env: SUMMARY_BUDGET_TOKENS] [default: 1200]
    #[arg(long, global = true)]
    pub summary_budget_tokens: Option<u32>,
    /// The facts ledger's budget (identifiers kept verbatim beside the summary; 0: off)
    /// [env: SUMMARY_LEDGER_TOKENS] [default: 300]
    #[arg(long, global = true)]
    pub ledger_tokens: Option<u32>,
    /// Window mode: messages the context keeps verbatim; only older ones are folded
    /// [env: ABRIDGE_WINDOW_MESSAGES] [default: 8]
    #[arg(long, global = true)]
    pub window_messages: Option<u32>,
    /// More log output (-v: progress, -vv: debug)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors on stderr
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Log line format (filter with RUST_LOG)
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The `abridge.toml` file: every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    db: Option<PathBuf>,
    backend: Option<BackendChoice>,
    model: Option<String>,
    url: Option<String>,
    openai_base_url: Option<String>,
    openai_api_key: Option<String>,
    rendering: Option<RenderingChoice>,
    context_length: Option<u32>,
    max_output_tokens: Option<u32>,
    temperature: Option<f32>,
    threshold_tokens: Option<u32>,
    max_summary_tokens: Option<u32>,
    min_episodes: Option<u32>,
    max_skipped_percent: Option<u32>,
    timeout_secs: Option<u64>,
    retries: Option<u32>,
    retry_base_ms: Option<u64>,
    chunk_concurrency: Option<usize>,
    chunk_tokens: Option<u32>,
    job_lease_secs: Option<u64>,
    mode: Option<ModeChoice>,
    quiescence_secs: Option<u32>,
    provisional_tokens: Option<u32>,
    max_attempts: Option<u32>,
    retry_base_secs: Option<u32>,
    max_backlog_tokens: Option<u32>,
    summary_budget_tokens: Option<u32>,
    ledger_tokens: Option<u32>,
    window_messages: Option<u32>,
    focus: Option<String>,
}

/// Resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub db: PathBuf,
    pub backend: BackendChoice,
    pub url: String,
    pub openai_base_url: String,
    pub openai_api_key: Option<String>,
    pub timeout: Duration,
    pub retry: abridge_backend::RetryPolicy,
    /// Model requests in flight at once in a batch.
    pub concurrency: usize,
    /// How long a job's lease lasts without a heartbeat before another worker may take it.
    pub job_lease: Duration,
    /// Engine settings (engine and rendering are finalised when the backend is chosen).
    pub config: Config,
    pub verbose: u8,
    pub quiet: bool,
}

/// Reads an environment variable (a seam for tests).
pub trait Env {
    fn get(&self, key: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok().filter(|v| !v.is_empty())
    }
}

fn env_parse<T: std::str::FromStr>(env: &dyn Env, key: &str) -> Result<Option<T>> {
    match env.get(key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| anyhow::anyhow!("{key}={v:?} is not a valid value; fix or unset it")),
    }
}

fn env_enum<T: ValueEnum>(env: &dyn Env, key: &str) -> Result<Option<T>> {
    match env.get(key) {
        None => Ok(None),
        Some(v) => T::from_str(v.trim(), true).map(Some).map_err(|_| {
            let names: Vec<String> = T::value_variants()
                .iter()
                .filter_map(|x| x.to_possible_value())
                .map(|p| p.get_name().to_string())
                .collect();
            anyhow::anyhow!(
                "{key}={v:?} is not one of {}; fix or unset it",
                names.join(", ")
            )
        }),
    }
}

fn default_db(env: &dyn Env) -> PathBuf {
    let base = env
        .get("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            env.get("HOME")
                .map(|h| PathBuf::from(h).join(".local").join("share"))
        })
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("abridge").join("abridge.db")
}

fn load_file(common: &Common, env: &dyn Env) -> Result<FileConfig> {
    let explicit = common
        .config
        .clone()
        .or_else(|| env.get("ABRIDGE_CONFIG").map(PathBuf::from));
    let path = match &explicit {
        Some(p) => p.clone(),
        None if Path::new("abridge.toml").exists() => PathBuf::from("abridge.toml"),
        None => return Ok(FileConfig::default()),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    toml::from_str(&text).with_context(|| {
        format!(
            "{} is not a valid abridge.toml (see docs/configure.md)",
            path.display()
        )
    })
}

impl Settings {
    /// Resolve flags, environment, file and defaults.
    pub fn resolve(common: &Common, env: &dyn Env) -> Result<Settings> {
        let file = load_file(common, env)?;
        let d = Config::default();
        macro_rules! pick {
            ($flag:expr, $env:expr, $file:expr, $default:expr) => {
                $flag.or($env).or($file).unwrap_or($default)
            };
        }
        let url: String = pick!(
            common.url.clone(),
            env.get("EXTRACTION_URL"),
            file.url,
            "http://localhost:11434".to_string()
        );
        let url = url.trim_end_matches('/').to_string();
        // The backends' own rule, checked before anything runs.
        abridge_backend::check_base_url(&url, "--url/EXTRACTION_URL")
            .map_err(|e| anyhow::anyhow!(abridge_app::engine::types::describe(&e)))?;
        let openai_base_url = pick!(
            common.openai_base_url.clone(),
            env.get("OPENAI_BASE_URL"),
            file.openai_base_url,
            format!("{url}/v1")
        );
        let rendering = pick!(
            common.rendering,
            env_enum(env, "ABRIDGE_RENDERING")?,
            file.rendering,
            RenderingChoice::Chat
        );
        let config = Config {
            engine: Engine::Llm,
            rendering: match rendering {
                RenderingChoice::Chat => Rendering::Chat,
                RenderingChoice::Chatml => Rendering::Chatml,
            },
            model: pick!(
                common.model.clone(),
                env.get("EXTRACTION_MODEL"),
                file.model,
                d.model
            ),
            context_length: pick!(
                common.context_length,
                env_parse(env, "ABRIDGE_CONTEXT_LENGTH")?,
                file.context_length,
                d.context_length
            ),
            max_output_tokens: pick!(
                common.max_output_tokens,
                env_parse(env, "ABRIDGE_MAX_OUTPUT_TOKENS")?,
                file.max_output_tokens,
                d.max_output_tokens
            ),
            temperature: pick!(
                common.temperature,
                env_parse(env, "ABRIDGE_TEMPERATURE")?,
                file.temperature,
                d.temperature
            ),
            threshold_tokens: pick!(
                common.threshold_tokens,
                env_parse(env, "SUMMARY_THRESHOLD_TOKENS")?,
                file.threshold_tokens,
                d.threshold_tokens
            ),
            min_episodes_since: pick!(
                common.min_episodes,
                env_parse(env, "SUMMARY_MIN_EPISODES")?,
                file.min_episodes,
                d.min_episodes_since
            ),
            max_summary_tokens: pick!(
                common.max_summary_tokens,
                env_parse(env, "SUMMARY_MAX_TOKENS")?,
                file.max_summary_tokens,
                d.max_summary_tokens
            ),
            max_skipped_percent: pick!(
                common.max_skipped_percent,
                env_parse(env, "ABRIDGE_MAX_SKIPPED_PERCENT")?,
                file.max_skipped_percent,
                d.max_skipped_percent
            ),
            chunk_tokens: pick!(
                common.chunk_tokens,
                env_parse(env, "SUMMARIZE_CHUNK_TOKENS")?,
                file.chunk_tokens,
                d.chunk_tokens
            ),
            // Unset: the component's default (window, the cheapest mode that keeps every
            // message in the context).
            mode: match common.mode.or(env_enum(env, "ABRIDGE_MODE")?).or(file.mode) {
                Some(ModeChoice::Eager) => Mode::Eager,
                Some(ModeChoice::Idle) => Mode::Idle,
                Some(ModeChoice::Window) => Mode::Window,
                None => d.mode,
            },
            quiescence_secs: pick!(
                common.quiescence_secs,
                env_parse(env, "ABRIDGE_QUIESCENCE_SECS")?,
                file.quiescence_secs,
                d.quiescence_secs
            ),
            provisional_tokens: pick!(
                common.provisional_tokens,
                env_parse(env, "ABRIDGE_PROVISIONAL_TOKENS")?,
                file.provisional_tokens,
                d.provisional_tokens
            ),
            max_attempts: pick!(
                common.max_attempts,
                env_parse(env, "ABRIDGE_MAX_ATTEMPTS")?,
                file.max_attempts,
                d.max_attempts
            )
            .max(1),
            retry_base_secs: pick!(
                None,
                env_parse(env, "ABRIDGE_REFRESH_RETRY_SECS")?,
                file.retry_base_secs,
                d.retry_base_secs
            )
            .max(1),
            max_backlog_tokens: pick!(
                common.max_backlog_tokens,
                env_parse(env, "SUMMARY_MAX_BACKLOG_TOKENS")?,
                file.max_backlog_tokens,
                d.max_backlog_tokens
            ),
            summary_budget_tokens: pick!(
                common.summary_budget_tokens,
                env_parse(env, "SUMMARY_BUDGET_TOKENS")?,
                file.summary_budget_tokens,
                d.summary_budget_tokens
            ),
            ledger_tokens: pick!(
                common.ledger_tokens,
                env_parse(env, "SUMMARY_LEDGER_TOKENS")?,
                file.ledger_tokens,
                d.ledger_tokens
            ),
            window_messages: pick!(
                common.window_messages,
                env_parse(env, "ABRIDGE_WINDOW_MESSAGES")?,
                file.window_messages,
                d.window_messages
            ),
            focus: pick!(None, env.get("ABRIDGE_FOCUS"), file.focus, d.focus),
        };
        if !(0.0..=2.0).contains(&config.temperature) {
            bail!("temperature {} is outside 0.0-2.0", config.temperature);
        }
        Ok(Settings {
            db: pick!(
                common.db.clone(),
                env.get("ABRIDGE_DB").map(PathBuf::from),
                file.db,
                default_db(env)
            ),
            backend: pick!(
                common.backend,
                env_enum(env, "ABRIDGE_BACKEND")?,
                file.backend,
                BackendChoice::Auto
            ),
            url,
            openai_base_url: openai_base_url.trim_end_matches('/').to_string(),
            openai_api_key: env.get("OPENAI_API_KEY").or(file.openai_api_key),
            timeout: Duration::from_secs(pick!(
                common.timeout_secs,
                env_parse(env, "ABRIDGE_TIMEOUT_SECS")?,
                file.timeout_secs,
                300
            )),
            concurrency: pick!(
                common.concurrency,
                env_parse(env, "SUMMARIZE_CHUNK_CONCURRENCY")?,
                file.chunk_concurrency,
                6
            )
            .max(1),
            job_lease: Duration::from_secs(
                pick!(
                    None,
                    env_parse(env, "ABRIDGE_JOB_LEASE_SECS")?,
                    file.job_lease_secs,
                    30
                )
                .max(1),
            ),
            retry: abridge_backend::RetryPolicy {
                attempts: pick!(
                    common.retries,
                    env_parse(env, "ABRIDGE_RETRIES")?,
                    file.retries,
                    3
                )
                .max(1),
                base: Duration::from_millis(pick!(
                    None,
                    env_parse(env, "ABRIDGE_RETRY_BASE_MS")?,
                    file.retry_base_ms,
                    500
                )),
                ..abridge_backend::RetryPolicy::default()
            },
            config,
            verbose: common.verbose,
            quiet: common.quiet,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct MapEnv(BTreeMap<&'static str, &'static str>);

    impl Env for MapEnv {
        fn get(&self, key: &str) -> Option<String> {
            self.0.get(key).map(|v| v.to_string())
        }
    }

    #[test]
    fn precedence_flag_env_file_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("abridge.toml");
        std::fs::write(&file, "model = \"from-file\"\nthreshold_tokens = 111\nmin_episodes = 9\nbackend = \"extractive\"\n").unwrap();
        let env = MapEnv(BTreeMap::from([
            ("EXTRACTION_MODEL", "from-env"),
            ("SUMMARY_THRESHOLD_TOKENS", "222"),
            ("HOME", "/home/u"),
        ]));
        let common = Common {
            config: Some(file),
            model: Some("from-flag".into()),
            ..Common::default()
        };
        let s = Settings::resolve(&common, &env).unwrap();
        assert_eq!(s.config.model, "from-flag");
        assert_eq!(s.config.threshold_tokens, 222);
        assert_eq!(s.config.min_episodes_since, 9);
        assert_eq!(s.config.max_summary_tokens, 800);
        assert_eq!(s.backend, BackendChoice::Extractive);
        assert_eq!(
            s.db,
            PathBuf::from("/home/u/.local/share/abridge/abridge.db")
        );
        assert_eq!(s.openai_base_url, "http://localhost:11434/v1");
    }

    #[test]
    fn bad_values_say_what_to_fix() {
        let env = MapEnv(BTreeMap::from([("SUMMARY_MIN_EPISODES", "lots")]));
        let e = Settings::resolve(&Common::default(), &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SUMMARY_MIN_EPISODES=\"lots\""), "{e}");
        let env = MapEnv(BTreeMap::from([("ABRIDGE_BACKEND", "gpt")]));
        let e = Settings::resolve(&Common::default(), &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("auto, ollama, openai, extractive"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.toml");
        std::fs::write(&file, "modle = \"x\"\n").unwrap();
        let common = Common {
            config: Some(file),
            ..Common::default()
        };
        let e = format!(
            "{:#}",
            Settings::resolve(&common, &MapEnv(BTreeMap::new())).unwrap_err()
        );
        assert!(e.contains("unknown field `modle`"), "{e}");
    }
}
