//! `abridge setup claude-code|codex`: reads the agent's configuration files, asks
//! `abridge_app::setup` for the merged text, and shows (`--dry-run`) or writes it, keeping a
//! backup of each file it changes.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::{Args, ValueEnum};

use abridge_app::setup::{self, Invocation};

use super::{Exit, Failure, Settings};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Agent {
    /// Claude Code: hooks in settings.json, the MCP server in ~/.claude.json (or .mcp.json)
    ClaudeCode,
    /// Codex CLI: hooks and the MCP server in config.toml
    Codex,
}

#[derive(Args, Debug)]
pub struct SetupArgs {
    /// The agent to set up
    agent: Agent,
    /// For you, in every project (the default): ~/.claude/settings.json and ~/.claude.json,
    /// or $CODEX_HOME/config.toml
    #[arg(long, conflicts_with = "project")]
    user: bool,
    /// For this project only: .claude/settings.json and .mcp.json, or .codex/config.toml
    #[arg(long)]
    project: bool,
    /// Show what would change (a diff per file) and change nothing
    #[arg(long)]
    dry_run: bool,
    /// Take abridge's hooks and MCP server out again (everything else stays)
    #[arg(long)]
    remove: bool,
}

type Merge = fn(&str, &Invocation, bool) -> abridge_app::AppResult<String>;

fn home() -> Result<PathBuf, Failure> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .ok_or_else(|| Failure::new(Exit::Input, anyhow!("HOME is not set; use --project")))
}

/// The files to change for `a`, each with its merge.
fn files(a: &SetupArgs) -> Result<Vec<(PathBuf, Merge)>, Failure> {
    let cwd = std::env::current_dir().map_err(|e| Failure::new(Exit::Input, e))?;
    Ok(match (a.agent, a.project) {
        (Agent::ClaudeCode, false) => {
            let h = home()?;
            vec![
                (
                    h.join(".claude/settings.json"),
                    setup::claude_settings as Merge,
                ),
                (h.join(".claude.json"), setup::claude_mcp as Merge),
            ]
        }
        (Agent::ClaudeCode, true) => vec![
            (
                cwd.join(".claude/settings.json"),
                setup::claude_settings as Merge,
            ),
            (cwd.join(".mcp.json"), setup::claude_mcp as Merge),
        ],
        (Agent::Codex, false) => {
            let dir = match std::env::var_os("CODEX_HOME") {
                Some(d) => PathBuf::from(d),
                None => home()?.join(".codex"),
            };
            vec![(dir.join("config.toml"), setup::codex_config as Merge)]
        }
        (Agent::Codex, true) => {
            vec![(cwd.join(".codex/config.toml"), setup::codex_config as Merge)]
        }
    })
}

/// The first executable named `name` on the PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Write `text` to `path` through a temporary file in the same folder (never half a file).
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.abridge-tmp",
        path.file_name().map_or("x".into(), |n| n.to_string_lossy())
    ));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

pub async fn setup_cmd(s: &Settings, a: SetupArgs) -> Result<(), Failure> {
    let _ = a.user; // the default
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| {
            Failure::new(
                Exit::Internal,
                anyhow!("cannot find the abridge executable: {e}"),
            )
        })?;
    // The `abridge` on the PATH when it is this one (an install survives a rebuild); else
    // this executable's path, with a note when that is a build folder `cargo clean` empties.
    let program = match on_path("abridge") {
        Some(p) if std::fs::canonicalize(&p).is_ok_and(|c| c == exe) => "abridge".to_string(),
        _ => {
            if exe.components().any(|c| c.as_os_str() == "target") {
                eprintln!(
                    "note: the hooks will run {}, a build folder that `cargo clean` empties; `cargo install --path host` puts abridge on the PATH (then run setup again from there){}",
                    exe.display(),
                    match a.agent {
                        Agent::ClaudeCode => {
                            ", or install the Claude Code plugin instead (host/claude-plugin/README.md)"
                        }
                        Agent::Codex => "",
                    }
                );
            }
            exe.display().to_string()
        }
    };
    let db = std::path::absolute(&s.db).unwrap_or_else(|_| s.db.clone());
    let how = Invocation {
        program,
        global: vec!["--db".into(), db.display().to_string()],
    };
    let mut changed = 0;
    for (path, merge) in files(&a)? {
        let old = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(Failure::new(
                    Exit::Input,
                    anyhow!("cannot read {}: {e}", path.display()),
                ));
            }
        };
        let new = merge(&old, &how, a.remove)
            .map_err(|e| Failure::new(Exit::Input, anyhow!("{}: {}", path.display(), e.message)))?;
        let shown = path.display().to_string();
        if old == new || (a.remove && old.is_empty()) {
            println!("{shown}: unchanged");
            continue;
        }
        changed += 1;
        if a.dry_run {
            print!("{}", setup::diff(&shown, &old, &new));
            continue;
        }
        if !old.is_empty() {
            // The backup is the user's file as it was before abridge first changed it: never
            // overwritten (not by a second setup, not by --remove).
            let backup = PathBuf::from(format!("{shown}.abridge-backup"));
            if backup.exists() {
                println!(
                    "{shown}: updated (your original stays in {})",
                    backup.display()
                );
            } else {
                std::fs::write(&backup, &old).map_err(|e| {
                    Failure::new(
                        Exit::Storage,
                        anyhow!("cannot write the backup {}: {e}", backup.display()),
                    )
                })?;
                println!(
                    "{shown}: updated (the previous version is in {})",
                    backup.display()
                );
            }
        } else {
            println!("{shown}: created");
        }
        write_atomic(&path, &new).map_err(|e| Failure::new(Exit::Storage, e))?;
    }
    if a.dry_run {
        println!("dry run: {changed} file(s) would change; run again without --dry-run to apply");
    } else if !a.remove && changed > 0 {
        let what = match a.agent {
            Agent::ClaudeCode => {
                "Claude Code now loads each session's context at start and after a compaction, imports the transcript as it grows, and offers the abridge MCP tools; start a new session and work as usual"
            }
            Agent::Codex => {
                "Codex now offers the abridge MCP tools and, once you trust its hooks (Codex runs a new hook only after you review it: type /hooks in Codex and trust the three abridge hooks), loads each session's context at start and after a compaction and imports the rollout as it grows; start a new session and work as usual"
            }
        };
        println!("{what} (database: {})", db.display());
        println!(
            "A new session in a project abridge knows starts with what its earlier sessions did (the last one's summary and digest), the rules pinned to the project ('abridge pin SESSION N --project', or the MCP pin tool with scope \"project\") and the memories kept for it."
        );
    }
    Ok(())
}
