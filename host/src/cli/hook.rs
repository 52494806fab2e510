//! `abridge hook`: a thin shell over `abridge_app::hook` for Claude Code's and Codex's command
//! hooks.
//! It never fails the agent's turn and never blocks it past its budget: errors go to a log
//! (and a one-line note on stderr), the exit is 0 unless the payload is unusable (then 1,
//! which Claude Code shows as a non-blocking hook error — never 2, which would block a
//! compaction).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;

use abridge_app::Reason;
use abridge_app::hook::{self, Ask, Payload};

use super::commands::{choose_backend, engine_config};
use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct HookArgs {
    /// Longest the hook may take, in seconds; what is not done by then stays queued for the
    /// next hook, `abridge watch` or a worker
    #[arg(long, default_value_t = 5.0)]
    budget_secs: f64,
    /// Tokens of context a SessionStart hook prints (Claude Code keeps up to 10,000
    /// characters of it)
    #[arg(long, default_value_t = 2200)]
    context_tokens: u32,
    /// Where errors are written [env: ABRIDGE_HOOK_LOG] [default: hook.log beside the
    /// database]
    #[arg(long, value_name = "PATH")]
    log: Option<PathBuf>,
}

/// Append a line to the hook log (best effort: a hook must not fail on its log).
fn log(s: &Settings, a: &HookArgs, line: &str) {
    let path = a
        .log
        .clone()
        .or_else(|| std::env::var_os("ABRIDGE_HOOK_LOG").map(PathBuf::from))
        .unwrap_or_else(|| s.db.with_file_name("hook.log"));
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let _ = writeln!(f, "{at} {line}");
    }
}

pub async fn hook(s: &Settings, a: HookArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let budget = Duration::from_secs_f64(a.budget_secs.clamp(0.1, 600.0));
    let mut input = Vec::new();
    let read = std::io::stdin()
        .take(hook::MAX_PAYLOAD as u64 + 1)
        .read_to_end(&mut input);
    let payload = match read
        .map_err(|e| abridge_app::AppError::invalid(format!("cannot read the hook payload: {e}")))
        .and_then(|_| Payload::parse(&input))
    {
        Ok(p) => p,
        Err(e) => {
            log(s, &a, &format!("unusable payload: {}", e.message));
            // 1: a non-blocking hook error (2 would block a compaction).
            return Err(Failure::new(Exit::Internal, anyhow!("{}", e.message)));
        }
    };
    let event = payload.hook_event_name.clone();
    let work = run(s, &a, payload, started + budget);
    match tokio::time::timeout(budget, work).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            log(s, &a, &format!("{event}: {e:#}"));
            eprintln!("abridge hook ({event}): {e:#} (logged; the agent goes on)");
            Ok(())
        }
        Err(_) => {
            log(
                s,
                &a,
                &format!("{event}: the {budget:?} budget ran out; the rest stays queued"),
            );
            Ok(())
        }
    }
}

async fn run(s: &Settings, a: &HookArgs, p: Payload, deadline: Instant) -> anyhow::Result<()> {
    let ask = p.ask();
    if ask == Ask::Nothing {
        return Ok(());
    }
    let backend = choose_backend(s).await.map_err(|f| f.error)?;
    let cfg = engine_config(s, &backend);
    let local = super::app::local(s, Some(&backend)).map_err(|f| f.error)?;
    // Every event first takes in what the transcript gained (the same rules as `watch`).
    let mut imported = Vec::new();
    if let Some(t) = &p.transcript_path {
        match local.hook_import(t).await? {
            Some(f) => imported = f.sessions,
            // A start may come before the agent wrote its transcript; an import may not.
            None if ask == Ask::Import => {
                return Err(anyhow::anyhow!(
                    "the transcript {} does not exist (or is not a file), so nothing was imported; check that the agent still writes its transcripts there",
                    t.display()
                ));
            }
            None => {}
        }
    }
    let session = imported.first().cloned().or_else(|| p.session());
    // The project the agent works in (its `cwd`), as abridge names it: recorded on the
    // session, so a later session there starts with what this one did.
    let project = p.cwd.as_deref().filter(|c| !c.trim().is_empty());
    if let (Some(session), Some(cwd)) = (&session, project)
        && !imported.is_empty()
    {
        local
            .label_project(session, &hook::project_key(cwd))
            .await?;
    }
    let budget = a.context_tokens.max(64);
    // A session abridge holds nothing of yet (a new one, in a project it may know): what the
    // project's earlier sessions, pins and memories say.
    let local_ref = &local;
    let start = |session: Option<String>| async move {
        let local = local_ref;
        let Some(cwd) = project else {
            return Ok::<_, anyhow::Error>(());
        };
        if let Some(text) = local.project_start(cwd, session.as_deref(), budget).await? {
            println!("{}", hook::session_start_output(&text));
        }
        Ok(())
    };
    let Some(session) = session else {
        if ask == Ask::Context {
            start(None).await?;
        }
        return Ok(());
    };
    match ask {
        Ask::Context => {
            let v = match local
                .context(
                    &session,
                    abridge_app::ContextAsk {
                        pairs: 1,
                        refresh_after: u32::MAX,
                        ..abridge_app::ContextAsk::new(budget)
                    },
                )
                .await
            {
                Ok(v) => v,
                // Nothing imported for this session yet: the project's start instead.
                Err(e) if matches!(e.kind, abridge_app::ErrorKind::NotFound) => {
                    return start(Some(session)).await;
                }
                Err(e) => return Err(e.into()),
            };
            let mut text = hook::context_text(&v);
            // The rules pinned to the project open every session in it.
            if let Some(cwd) = project {
                let pins = local.project_pins(&hook::project_key(cwd)).await?;
                if let Some(head) = hook::pins_text(&pins) {
                    text = format!("{head}\n\n{text}");
                }
            }
            let out = hook::session_start_output(&text);
            println!("{out}");
        }
        Ask::Import => {
            // Summarize what the budget allows; a job stopped at the deadline goes back to
            // the queue with the answers it received.
            // The app's due rule, as asked for: episodes beyond the chain (whatever the mode's
            // trigger), or offline rows to rewrite.
            let cfg = local.for_session(&session, &cfg).await?;
            let Some(target) = local.due(&session, &cfg, Reason::Asked).await? else {
                return Ok(());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let timer = tokio::spawn(async move {
                // Leave a little of the budget to hand the job back.
                tokio::time::sleep(left.saturating_sub(Duration::from_millis(300))).await;
                let _ = stop_tx.send(true);
            });
            let done = local
                .run_or_join_until(&session, target, &cfg, Some(stop_rx))
                .await;
            timer.abort();
            done?;
        }
        Ask::Nothing => {}
    }
    Ok(())
}
