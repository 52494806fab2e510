//! `abridge status`, `abridge context` and `abridge reset`.

use anyhow::anyhow;
use clap::Args;
use serde_json::json;

use abridge::app::state_name;
use abridge::types::{FreshState, Mode};

use super::app::fail;
use super::commands::{choose_backend, engine_config, note};
use super::jobs::storage;
use super::progress::utc_text;
use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only this session [default: every session, most recently changed first]
    #[arg(value_parser = super::session_id)]
    session: Option<String>,
    /// Print JSON (one array)
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ContextArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Most tokens (estimated) the messages may take
    #[arg(long, default_value_t = 2000)]
    budget: u32,
    /// Recent message pairs to include verbatim
    #[arg(long, default_value_t = 4)]
    pairs: u32,
    /// Refresh the summary first when more than this many messages lie beyond it
    #[arg(long, default_value_t = 8)]
    refresh_after: u32,
    /// Print JSON: {"messages": [...], "tokens", "full_tokens", "saving", ...}
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct RefreshArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Print the chain as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ModeArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// eager, idle, or default (follow the global --mode / ABRIDGE_MODE); omit to print it
    #[arg(value_parser = ["eager", "idle", "default"], value_name = "MODE")]
    setting: Option<String>,
    /// Idle mode's quiet window for this session, in seconds
    #[arg(long = "quiet-secs", value_name = "SECS")]
    quiet_secs: Option<u32>,
}

#[derive(Args, Debug)]
pub struct ResetArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
}

fn ms_text(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".into(), |t| utc_text(t.max(0) as u64))
}

pub async fn status(s: &Settings, a: StatusArgs) -> Result<(), Failure> {
    // Freshness needs no model: the app only reads the store and the clock.
    let local = super::app::local(s, None)?;
    let rows = match &a.session {
        Some(x) => vec![local.session(x).await.map_err(|e| fail(s, e))?],
        None => local.sessions(0, usize::MAX).await?.0,
    };
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut v = serde_json::to_value(r).expect("a session view serializes");
                v["session"] = r.id.clone().into();
                v
            })
            .collect();
        println!("{}", serde_json::Value::from(v));
        return Ok(());
    }
    if rows.is_empty() {
        println!("no sessions in {}", s.db.display());
        return Ok(());
    }
    println!(
        "{:<28} {:<5} {:<12} {:>8} {:>8} {:>8}  {:<19}  reason",
        "session", "mode", "state", "episodes", "covered", "failures", "last activity (UTC)"
    );
    for r in &rows {
        let name: String = if r.id.chars().count() > 28 {
            r.id.chars().take(27).chain(['…']).collect()
        } else {
            r.id.clone()
        };
        println!(
            "{name:<28} {:<5} {:<12} {:>8} {:>8} {:>8}  {:<19}  {}",
            r.mode,
            r.state,
            r.episodes,
            r.covered,
            r.failures,
            ms_text(r.last_activity_ms),
            r.reason
        );
    }
    let stuck = rows
        .iter()
        .filter(|r| r.state == state_name(FreshState::GaveUp))
        .count();
    if stuck > 0 {
        note(
            s,
            &format!(
                "{stuck} session(s) stopped refreshing after repeated failures; fix the model or server, then run 'abridge refresh SESSION' (a success clears the failures)"
            ),
        );
    }
    Ok(())
}

pub async fn context(s: &Settings, a: ContextArgs) -> Result<(), Failure> {
    if a.budget < 16 {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "--budget {} is too small to hold a message; give at least 16 tokens",
                a.budget
            ),
        ));
    }
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    let get = |refresh_after| local.context(&a.session, a.budget, a.pairs, refresh_after, None);
    // The app queues a refresh when one is due; the command line runs it here and waits.
    let mut w = get(a.refresh_after).await.map_err(|e| fail(s, e))?;
    let mut refreshed = false;
    if let Some(job) = w.job.clone().filter(|_| w.refresh_pending) {
        let cfg = local.session_config(&a.session).await?;
        let show = super::app::Show::Own(super::progress::Mode::detect(a.json, s.quiet));
        match super::app::run_or_join(s, &local, (&a.session, job.target), &cfg, show).await {
            Ok(_) => {
                refreshed = true;
                w = get(u32::MAX).await?;
            }
            Err(f) => note(
                s,
                &format!(
                    "the summary was not refreshed ({:#}); this context is from the summary as it is",
                    f.error
                ),
            ),
        }
    }
    if a.json {
        let mut v = serde_json::to_value(&w).expect("a context view serializes");
        v["refreshed"] = refreshed.into();
        println!("{v}");
    } else {
        let episodes = local
            .engine()
            .store()
            .stats(&a.session)
            .await
            .map_err(storage)?
            .episodes;
        for m in &w.messages {
            println!("[{}]\n{}\n", m.role, m.content);
        }
        println!(
            "{} messages, ~{} tokens, against ~{} for the full history of {} episodes: {:.1} % saved",
            w.messages.len(),
            w.tokens,
            w.full_tokens,
            episodes,
            w.saving_percent
        );
    }
    if refreshed {
        note(
            s,
            "the summary was refreshed first (many messages lay beyond it)",
        );
    }
    if w.refresh_due || (!refreshed && w.refresh_pending) {
        note(
            s,
            &format!(
                "{} episode(s) beyond the summary are not in this context; a refresh is due (idle mode or a failing model) — 'abridge status {}' says why",
                w.omitted, a.session
            ),
        );
    }
    Ok(())
}

pub async fn reset(s: &Settings, a: ResetArgs) -> Result<(), Failure> {
    let local = super::app::local(s, None)?;
    let episodes = local.reset(&a.session).await.map_err(|e| fail(s, e))?;
    println!(
        "session {}: {episodes} episodes and its summaries deleted",
        a.session
    );
    Ok(())
}

/// Summarize a stored session now, whatever its mode or backoff (a success clears its failure
/// marker), through its job.
pub async fn refresh(s: &Settings, a: RefreshArgs) -> Result<(), Failure> {
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    let view = local.session(&a.session).await.map_err(|e| fail(s, e))?;
    if view.episodes > view.covered {
        let mode = super::progress::Mode::detect(a.json, s.quiet);
        let cfg = engine_config(s, &backend);
        super::app::run_or_join(
            s,
            &local,
            (&a.session, view.episodes),
            &cfg,
            super::app::Show::Own(mode),
        )
        .await?;
    } else {
        note(
            s,
            &format!("session {}: every episode is already covered", a.session),
        );
    }
    let chain = local.summaries(&a.session).await?;
    if a.json {
        println!(
            "{}",
            json!({"session": a.session, "episodes": view.episodes, "summaries": chain})
        );
    } else if let Some(r) = chain.last() {
        println!("{}", r.content);
    }
    Ok(())
}

/// Show or set a session's own refresh mode.
pub async fn mode(s: &Settings, a: ModeArgs) -> Result<(), Failure> {
    let local = super::app::local(s, None)?;
    let view = match a.setting.as_deref() {
        None => local.session(&a.session).await,
        Some("default") => local.set_mode(&a.session, None).await,
        Some(m) => {
            let own = abridge::sources::SessionMode {
                mode: if m == "idle" { Mode::Idle } else { Mode::Eager },
                quiescence_secs: a.quiet_secs,
            };
            local.set_mode(&a.session, Some(own)).await
        }
    }
    .map_err(|e| fail(s, e))?;
    let cfg = local.session_config(&a.session).await?;
    println!(
        "session {}: {} mode{}{}",
        a.session,
        view.mode,
        if cfg.mode == Mode::Idle {
            format!(", quiet after {} s", cfg.quiescence_secs)
        } else {
            String::new()
        },
        if view.own_mode {
            " (its own setting)"
        } else {
            " (the global setting)"
        }
    );
    Ok(())
}
