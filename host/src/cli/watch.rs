//! `abridge watch DIR`: follow a directory of Claude Code session files and JSON-lines files,
//! import appended lines as they arrive and keep each session's summary fresh per mode. The
//! following itself is the app's ([`abridge_app::watch`]); this shell resolves the backend,
//! prints the watcher's notes and turns Ctrl-C into a stop.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use abridge_app::watch::{WatchNote, WatchOptions};

use super::commands::{choose_backend, note};
use super::{Failure, Settings};

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Directory to follow (e.g. ~/.claude/projects): every *.jsonl file under it
    dir: PathBuf,
    /// Import and summarize what files already hold when first seen (default: start after
    /// it, with no model call)
    #[arg(long)]
    backfill: bool,
    /// Poll interval in milliseconds (the fallback for filesystem events, and the clock for
    /// idle-mode verdicts)
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// Do one pass (import what is new, refresh what is due) and exit
    #[arg(long)]
    once: bool,
    /// Poll only; do not use filesystem events
    #[arg(long)]
    no_events: bool,
    /// Keep tool calls and tool results as episodes
    #[arg(long)]
    include_tools: bool,
    /// Follow symbolic links that lead out of DIR (links inside it are always followed;
    /// link loops are always cut)
    #[arg(long)]
    follow_links: bool,
}

pub async fn watch(s: &Settings, a: WatchArgs) -> Result<(), Failure> {
    // Checked before the backend is chosen, so a wrong folder is what gets reported.
    abridge_app::watch::folder(&a.dir).map_err(|e| super::app::fail(s, e))?;
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    let quiet = s.quiet;
    let notes = Arc::new(move |n: WatchNote| {
        if !quiet {
            eprintln!(
                "abridge: {}",
                abridge_app::engine::text::printable_lines(&format!("watch: {n}"))
            );
        }
    });
    let opts = WatchOptions {
        backfill: a.backfill,
        include_tools: a.include_tools,
        follow_links: a.follow_links,
    };
    let mut w = local
        .watcher(&a.dir, opts, notes)
        .await
        .map_err(|e| super::app::fail(s, e))?;
    let stopper = w.stopper();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stopper.stop();
        }
    });
    note(
        s,
        &format!(
            "watch: following {} ({} mode with {}; Ctrl-C stops)",
            w.dir().display(),
            local.default_config().mode.as_str(),
            backend.name
        ),
    );
    let run = if a.once {
        w.pass().await
    } else {
        w.follow(Duration::from_millis(a.poll_ms), !a.no_events)
            .await
    };
    run.map_err(|e| super::app::fail(s, e))?;
    note(
        s,
        &format!(
            "watch: stopped; {} episode(s) imported and {} summary refresh(es) this run; every imported line is stored",
            w.imported(),
            w.refreshed()
        ),
    );
    Ok(())
}
