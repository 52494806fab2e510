//! `abridge status`, `abridge context` and `abridge reset`.

use anyhow::anyhow;
use clap::Args;
use serde_json::json;

use abridge_app::engine::types::{FreshState, Mode};
use abridge_app::state_name;
use abridge_app::{ContextAsk, Reason};

use super::app::fail;
use super::commands::{choose_backend, engine_config, note};
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
    #[arg(long, default_value_t = ContextAsk::DEFAULT_BUDGET)]
    budget: u32,
    /// Recent message pairs to include verbatim
    #[arg(long, default_value_t = ContextAsk::DEFAULT_PAIRS)]
    pairs: u32,
    /// Refresh the summary first when more than this many messages lie beyond it
    #[arg(long, default_value_t = ContextAsk::DEFAULT_REFRESH_AFTER)]
    refresh_after: u32,
    /// Print JSON: {"messages": [...], "tokens", "full_tokens", "saving", ...}
    #[arg(long)]
    json: bool,
    /// What the next model call is about (usually the user's newest message): the earlier
    /// turns that best match it are included verbatim beside the summary
    #[arg(long, value_name = "TEXT")]
    query: Option<String>,
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// The words to look for (quotes and operators are words, not a query language)
    query: String,
    /// Only this session's messages (its id or a unique prefix)
    #[arg(long, value_parser = super::session_id)]
    session: Option<String>,
    /// Hits to show (1 to 100)
    #[arg(short = 'k', long = "limit", default_value_t = 10)]
    k: u32,
    /// Hits to skip (the previous page's next offset)
    #[arg(long, default_value_t = 0)]
    offset: u32,
    /// Print JSON: {"hits": [{"session", "episode", "excerpt", "expand", ...}], "next_offset"}
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct RefreshArgs {
    /// Session id (or a unique prefix); with --upgrade and no session, every session
    #[arg(value_parser = super::session_id, required_unless_present = "upgrade")]
    session: Option<String>,
    /// Rewrite with the model the summary rows the offline summarizer wrote while no model
    /// was reachable (each keeps its range); needs a model. A plain refresh does this too
    #[arg(long)]
    upgrade: bool,
    /// Print the chain as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ModeArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// eager, idle, window, or default (follow the global --mode / ABRIDGE_MODE); omit to
    /// print it
    #[arg(value_parser = ["eager", "idle", "window", "default"], value_name = "MODE")]
    setting: Option<String>,
    /// Idle mode's quiet window for this session, in seconds
    #[arg(long = "quiet-secs", value_name = "SECS")]
    quiet_secs: Option<u32>,
}

#[derive(Args, Debug)]
pub struct FocusArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Instructions added to every fold prompt of the session ("keep decisions and file
    /// paths"); omit to print the focus
    focus: Option<String>,
    /// Remove the session's focus
    #[arg(long, conflicts_with = "focus")]
    clear: bool,
}

#[derive(Args, Debug)]
pub struct PinArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Episode id to pin (always in the context verbatim, within the budget); omit to list
    /// the pins
    episode: Option<u64>,
    /// Unpin it instead
    #[arg(long, requires = "episode")]
    remove: bool,
    /// Pin it to the session's project instead: it then opens every new agent session there
    /// (the SessionStart hook); without an episode, list the project's pins
    #[arg(long)]
    project: bool,
}

#[derive(Args, Debug)]
pub struct ExpandArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Summary row id (as 'abridge summaries SESSION --all' lists them)
    #[arg(required_unless_present = "episode", conflicts_with = "episode")]
    row: Option<u64>,
    /// Instead of a row: this episode (a search hit's number) and the two on each side
    #[arg(long)]
    episode: Option<u64>,
    /// Only the episode this ledger identifier was last seen in
    #[arg(long)]
    identifier: Option<String>,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ResetArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
}

#[derive(Args, Debug)]
pub struct PopArgs {
    /// Session id
    #[arg(value_parser = super::session_id)]
    session: String,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

fn ms_text(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".into(), |t| utc_text(t.max(0) as u64))
}

pub async fn status(s: &Settings, a: StatusArgs) -> Result<(), Failure> {
    // Freshness needs no model: the app only reads the store and the clock.
    let local = super::app::local_read(s)?;
    let rows = match &a.session {
        Some(x) => {
            let x = local.resolve(x).await.map_err(|e| fail(s, e))?;
            vec![local.session(&x).await.map_err(|e| fail(s, e))?]
        }
        None => local.sessions(0, usize::MAX, None).await?.0,
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
        println!("no sessions in {}", abridge_app::db::shown(&s.db));
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
        // Display names, never part of the id.
        let label = match (&r.title, &r.project) {
            (Some(t), Some(p)) => format!("\"{t}\" in {p}"),
            (Some(t), None) => format!("\"{t}\""),
            (None, Some(p)) => format!("in {p}"),
            (None, None) => String::new(),
        };
        if !label.is_empty() {
            let label: String = label.chars().take(100).collect();
            println!("  {label}");
        }
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

pub async fn context(s: &Settings, mut a: ContextArgs) -> Result<(), Failure> {
    let ask = |refresh_after, query| ContextAsk {
        budget: a.budget,
        pairs: a.pairs,
        refresh_after,
        wait: None,
        query,
    };
    // Refused before the model is probed.
    ask(a.refresh_after, None).check().map_err(|e| fail(s, e))?;
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    a.session = local.resolve(&a.session).await.map_err(|e| fail(s, e))?;
    if a.query.is_some() {
        super::app::index_pending(s, &local).await?;
    }
    let get = |refresh_after| local.context(&a.session, ask(refresh_after, a.query.as_deref()));
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
        let episodes = w.episodes;
        for m in &w.messages {
            println!("[{}]\n{}\n", m.role, m.content);
        }
        // The messages on stdout (`> prompt.txt` takes them alone); what they cost and cover
        // on stderr (with `-q`, nothing).
        if !s.quiet {
            eprintln!(
                "{}, ~{} tokens, against ~{} for the full history of {}: {:.1} % saved",
                super::count(w.messages.len() as u64, "message", "messages"),
                w.tokens,
                w.full_tokens,
                super::count(episodes, "episode", "episodes"),
                w.saving_percent
            );
            eprintln!(
                "budget {} tokens, {:.1} % used: {}",
                w.budget,
                w.budget_used_percent,
                w.parts.describe()
            );
            eprintln!(
                "stable until the next fold: the first {} of {} messages ({} characters), what a prompt cache keeps",
                w.stable.messages,
                w.messages.len(),
                w.stable.chars
            );
            let ranges: Vec<String> = w
                .omitted_ranges
                .iter()
                .map(|[a, b]| {
                    if a == b {
                        format!("{a}")
                    } else {
                        format!("{a}-{b}")
                    }
                })
                .collect();
            if ranges.is_empty() {
                eprintln!(
                    "covers episodes 1-{episodes} (summary level {}, {} identifiers, {} pinned)",
                    w.level, w.identifiers, w.pinned
                );
            } else {
                eprintln!(
                    "INCOMPLETE: episodes {} are not in this context (summary level {}); raise --budget or lower SUMMARY_BUDGET_TOKENS",
                    ranges.join(", "),
                    w.level
                );
            }
        }
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

/// Show, set or clear a session's focus instructions.
pub async fn focus(s: &Settings, mut a: FocusArgs) -> Result<(), Failure> {
    let local = super::app::local(s, None)?;
    a.session = local
        .resolve_or_new(&a.session)
        .await
        .map_err(|e| fail(s, e))?;
    let now = match (&a.focus, a.clear) {
        (Some(f), _) => local.set_focus(&a.session, Some(f)).await,
        (None, true) => local.set_focus(&a.session, None).await,
        (None, false) => local.focus(&a.session).await,
    }
    .map_err(|e| fail(s, e))?;
    match now {
        Some(f) => println!("session {}: focus \"{f}\"", a.session),
        None => println!("session {}: no focus", a.session),
    }
    Ok(())
}

/// Pin or unpin an episode, or list the pins.
pub async fn pin(s: &Settings, mut a: PinArgs) -> Result<(), Failure> {
    let local = super::app::local(s, None)?;
    a.session = local.resolve(&a.session).await.map_err(|e| fail(s, e))?;
    if a.project {
        let project = match a.episode {
            Some(e) => local.pin_to_project(&a.session, e, !a.remove).await,
            None => local.label(&a.session).await.and_then(|(_, p)| {
                p.ok_or_else(|| {
                    abridge_app::AppError::invalid(format!(
                        "session '{}' has no project",
                        a.session
                    ))
                })
            }),
        }
        .map_err(|e| fail(s, e))?;
        let pins = local.project_pins(&project).await.map_err(|e| fail(s, e))?;
        println!("project {project}: {} pinned", pins.len());
        for p in &pins {
            println!("- {} ({})", p.text, p.id);
        }
        return Ok(());
    }
    let pins = match a.episode {
        Some(e) => local.pin(&a.session, e, !a.remove).await,
        None => local.pins(&a.session).await,
    }
    .map_err(|e| fail(s, e))?;
    let list: Vec<String> = pins.iter().map(u64::to_string).collect();
    println!(
        "session {}: pinned episodes: {}",
        a.session,
        if list.is_empty() {
            "none".to_string()
        } else {
            list.join(", ")
        }
    );
    Ok(())
}

/// Provenance: a summary row and exactly the episodes it covers.
/// `abridge search QUERY`.
pub async fn search(s: &Settings, a: SearchArgs) -> Result<(), Failure> {
    let local = super::app::local_read(s)?;
    super::app::index_pending(s, &local).await?;
    let session = match &a.session {
        Some(x) => Some(local.resolve(x).await.map_err(|e| fail(s, e))?),
        None => None,
    };
    let v = local
        .search(&a.query, session.as_deref(), a.offset, a.k)
        .await
        .map_err(|e| fail(s, e))?;
    if a.json {
        println!("{}", serde_json::to_value(&v).expect("a search serializes"));
        return Ok(());
    }
    if v.hits.is_empty() {
        println!("nothing matches \"{}\"; try other or fewer words", a.query);
        return Ok(());
    }
    for h in &v.hits {
        let when = h
            .timestamp_ms
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .map(|t| format!(" {}", t.strftime("%Y-%m-%d %H:%M")))
            .unwrap_or_default();
        let who = h.speaker.clone().unwrap_or_else(|| h.role.clone());
        println!("{} #{}{when} {who}: {}", h.session, h.episode, h.excerpt);
        println!(
            "    abridge expand {} --episode {}",
            shell_word(&h.session),
            h.episode
        );
    }
    if let Some(next) = v.next_offset {
        println!("more: --offset {next}");
    }
    Ok(())
}

/// `s` as one shell word.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub async fn expand(s: &Settings, mut a: ExpandArgs) -> Result<(), Failure> {
    let local = super::app::local_read(s)?;
    a.session = local.resolve(&a.session).await.map_err(|e| fail(s, e))?;
    let Some(row) = a.row else {
        let ep = a.episode.unwrap_or(0);
        let page = local
            .messages(&a.session, ep.saturating_sub(3), 5)
            .await
            .map_err(|e| fail(s, e))?;
        if !page.messages.iter().any(|m| m.id == ep) {
            return Err(Failure::new(
                Exit::Input,
                anyhow!(
                    "session {} has no episode {ep} (it has {}); give a number 'abridge search' listed",
                    a.session,
                    page.total
                ),
            ));
        }
        if a.json {
            println!(
                "{}",
                serde_json::to_value(&page).expect("messages serialize")
            );
        } else {
            for m in page.messages {
                println!("#{} {}: {}\n", m.id, m.role, m.content);
            }
        }
        return Ok(());
    };
    let mut after = 0u64;
    let mut first = true;
    loop {
        let x = local
            .expand(&a.session, row, a.identifier.as_deref(), after, 1000)
            .await
            .map_err(|e| fail(s, e))?;
        if a.json {
            println!(
                "{}",
                serde_json::to_value(&x).expect("an expansion serializes")
            );
        } else {
            if first {
                let r = &x.row;
                println!(
                    "#{} episodes {}-{}{}:\n{}\n",
                    r.id,
                    r.first_episode,
                    r.last_episode,
                    if r.level > 0 {
                        format!(" (earlier summary, level {})", r.level)
                    } else {
                        String::new()
                    },
                    r.content
                );
                if !x.compacted.is_empty() {
                    let ids: Vec<String> = x
                        .compacted
                        .iter()
                        .map(|c| format!("#{} ({}-{})", c.id, c.first_episode, c.last_episode))
                        .collect();
                    println!("compacts rows {}\n", ids.join(", "));
                }
            }
            for e in &x.episodes {
                println!("[{} {}]\n{}\n", e.id, e.role, e.content);
            }
        }
        first = false;
        match x.next_after {
            Some(n) => after = n,
            None => break,
        }
    }
    Ok(())
}

pub async fn reset(s: &Settings, mut a: ResetArgs) -> Result<(), Failure> {
    let local = super::app::local(s, None)?;
    a.session = local.resolve(&a.session).await.map_err(|e| fail(s, e))?;
    let episodes = local.reset(&a.session).await.map_err(|e| fail(s, e))?;
    println!(
        "session {}: {episodes} episodes and its summaries deleted",
        a.session
    );
    Ok(())
}

/// Take a session's newest message back: it goes with the summary rows that covered it, and
/// what those covered besides it is folded again here and now.
pub async fn pop(s: &Settings, mut a: PopArgs) -> Result<(), Failure> {
    let backend = choose_backend(s).await?;
    let cfg = engine_config(s, &backend);
    let local = super::app::local(s, Some(&backend))?;
    a.session = local.resolve(&a.session).await.map_err(|e| fail(s, e))?;
    let mut gone = local.pop(&a.session).await.map_err(|e| fail(s, e))?;
    if let Some(j) = &gone.job {
        let mode = super::progress::Mode::detect(a.json, s.quiet);
        let cfg = local.for_session(&a.session, &cfg).await?;
        let done = super::app::run_or_join(
            s,
            &local,
            (&a.session, j.target),
            &cfg,
            super::app::Show::Own(mode),
        )
        .await?;
        gone.job = Some(local.job_view(&done));
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_value(&gone).expect("a removal serializes")
        );
        return Ok(());
    }
    let m = &gone.message;
    println!("[{} {}]\n{}\n", m.id, m.role, m.content);
    if gone.episodes == 0 {
        note(
            s,
            &format!(
                "session {}: that was its only message; the session is gone",
                a.session
            ),
        );
    } else if gone.dropped_rows.is_empty() {
        note(
            s,
            &format!(
                "session {}: {} messages left; no summary covered it",
                a.session, gone.episodes
            ),
        );
    } else {
        note(
            s,
            &format!(
                "session {}: {} messages left; summary rows {:?} covered it and were folded again without it",
                a.session, gone.episodes, gone.dropped_rows
            ),
        );
    }
    Ok(())
}

/// Summarize a stored session now, whatever its mode or backoff (a success clears its failure
/// marker), through its job; rows the offline summarizer wrote are rewritten by the model
/// first. `--upgrade` without a session does that for every session.
pub async fn refresh(s: &Settings, a: RefreshArgs) -> Result<(), Failure> {
    let backend = choose_backend(s).await?;
    let cfg = engine_config(s, &backend);
    if a.upgrade && cfg.engine != abridge_app::engine::types::Engine::Llm {
        return Err(Failure::new(
            Exit::Input,
            anyhow!(
                "--upgrade rewrites offline summaries with a model, and no model is reachable ({} backend); start Ollama (or pass --backend ollama/openai with its address) and run it again",
                backend.name
            ),
        ));
    }
    let local = super::app::local(s, Some(&backend))?;
    let sessions = match &a.session {
        Some(x) => vec![local.resolve(x).await.map_err(|e| fail(s, e))?],
        None => local.session_ids().await?,
    };
    let mode = super::progress::Mode::detect(a.json, s.quiet);
    let mut upgraded = 0usize;
    for session in &sessions {
        let view = local.session(session).await.map_err(|e| fail(s, e))?;
        let own = local.for_session(session, &cfg).await?;
        if let Some(target) = local.due(session, &own, Reason::Asked).await? {
            super::app::run_or_join(
                s,
                &local,
                (session, target),
                &own,
                super::app::Show::Own(mode),
            )
            .await?;
            upgraded += 1;
        } else if a.session.is_some() {
            let why = if cfg.engine == abridge_app::engine::types::Engine::Llm {
                "every episode is already covered, by the model"
            } else {
                "every episode is already covered"
            };
            note(s, &format!("session {session}: {why}"));
        }
        if a.session.is_none() {
            continue;
        }
        let chain = local.summaries(session).await?;
        if a.json {
            println!(
                "{}",
                json!({"session": session, "episodes": view.episodes, "summaries": chain})
            );
        } else if let Some(r) = chain.last() {
            println!("{}", r.content);
        }
    }
    if a.session.is_none() {
        note(
            s,
            &format!(
                "{upgraded} of {} session(s) had offline summaries or new episodes; each is summarized by {} now",
                sessions.len(),
                cfg.model
            ),
        );
        if a.json {
            println!(
                "{}",
                json!({"sessions": sessions.len(), "refreshed": upgraded})
            );
        }
    }
    Ok(())
}

/// Show or set a session's own refresh mode.
pub async fn mode(s: &Settings, mut a: ModeArgs) -> Result<(), Failure> {
    let local = super::app::local(s, None)?;
    a.session = local
        .resolve_or_new(&a.session)
        .await
        .map_err(|e| fail(s, e))?;
    let view = match a.setting.as_deref() {
        None => local.session(&a.session).await,
        Some("default") => local.set_mode(&a.session, None).await,
        Some(m) => {
            let own = abridge_app::sources::SessionMode {
                mode: Mode::parse(m).unwrap_or(Mode::Eager),
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
