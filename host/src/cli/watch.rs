//! `abridge watch DIR`: follow a directory of Claude Code session files and JSON-lines files,
//! import appended lines as they arrive and keep each session's summary fresh per mode.
//!
//! Each file's imported length (the end of its last complete line) is stored, so a restart
//! resumes where the last run stopped and a partial last line still being written waits for
//! its newline. Files that existed before the first run get that length as a baseline (no
//! import, no model call) unless `--backfill` is given. Filesystem events wake the loop early;
//! a poll every `--poll-ms` is the fallback and also drives idle-mode verdicts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use tokio::sync::Mutex;

use abridge::sources::{Watched, WatchedFile};
use abridge::transcript::{self, Format, Options, TranscriptError};
use abridge::types::FreshState;
use abridge::{Abridge, CallControl, CallError};

use super::commands::{choose_backend, note};
use super::jobs::storage;
use super::{Exit, Failure, Settings};

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

/// The bytes of `path` from `offset` to its end.
fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut out = Vec::new();
    file.read_to_end(&mut out)?;
    Ok(out)
}

/// The length of `bytes` up to and including its last newline (0 without one).
fn complete_lines(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

fn count_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::ClaudeCode => "claude-code",
        _ => "jsonl",
    }
}

/// One watcher run's state.
struct Watcher<'a> {
    s: &'a Settings,
    a: &'a WatchArgs,
    dir: PathBuf,
    /// The local tenant's side of the app (sessions, their modes, jobs, source marks).
    local: abridge::app::Scoped,
    engine: Arc<Abridge>,
    watched: Watched,
    files: std::collections::BTreeMap<String, WatchedFile>,
    /// Sessions whose summary may need a refresh now or later.
    pending: BTreeSet<String>,
    imported: u64,
    refreshed: u32,
    /// Walk notes already printed (a link loop is reported once, not every tick).
    told: BTreeSet<String>,
    stop: Arc<AtomicBool>,
    current: Arc<Mutex<Option<Arc<CallControl>>>>,
}

impl Watcher<'_> {
    /// Import what is new in `path`. Returns the episodes added.
    async fn import(&mut self, path: &Path) -> Result<u64, Failure> {
        let key = path.display().to_string();
        let cannot = |e: std::io::Error| {
            note(
                self.s,
                &format!("watch: cannot read {key}: {e}; retrying later"),
            );
            Ok(0)
        };
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) => return cannot(e),
        };
        // The common case, polled every tick: nothing appended, nothing read.
        if self.files.get(&key).is_some_and(|f| f.offset == len) {
            return Ok(0);
        }
        let mut f = match self.files.get(&key) {
            Some(f) => f.clone(),
            None => {
                // First sight: a baseline at the end of its last complete line.
                let offset = if self.a.backfill {
                    0
                } else {
                    match read_from(path, 0) {
                        Ok(b) => complete_lines(&b) as u64,
                        Err(e) => return cannot(e),
                    }
                };
                let f = WatchedFile {
                    path: key.clone(),
                    session: None,
                    format: None,
                    offset,
                    lines: None,
                };
                if !self.a.backfill {
                    note(
                        self.s,
                        &format!(
                            "watch: {} — baseline at {offset} bytes (earlier content is not imported; --backfill imports it)",
                            self.rel(path)
                        ),
                    );
                }
                self.watched
                    .put(&f, self.local.app().now_ms())
                    .await
                    .map_err(storage)?;
                self.files.insert(key.clone(), f.clone());
                f
            }
        };
        if len < f.offset {
            note(
                self.s,
                &format!(
                    "watch: {} shrank below what was imported; reading it again from the start (known lines are not duplicated)",
                    self.rel(path)
                ),
            );
            f.offset = 0;
            f.lines = Some(0);
        }
        // Episode keys carry the file's own line numbers: count the lines before the offset
        // once (a baseline, or a record from an older abridge), then keep count.
        let first_line = match f.lines {
            Some(n) => n,
            None if f.offset == 0 => 0,
            None => match read_from(path, 0) {
                Ok(b) => count_lines(&b[..(f.offset as usize).min(b.len())]),
                Err(e) => return cannot(e),
            },
        };
        // Only what was appended since the last read, up to its last complete line.
        let bytes = match read_from(path, f.offset) {
            Ok(b) => b,
            Err(e) => return cannot(e),
        };
        let chunk = &bytes[..complete_lines(&bytes)];
        if chunk.is_empty() {
            return Ok(0);
        }
        let complete = f.offset + chunk.len() as u64;
        let format = match f.format.as_deref() {
            Some("claude-code") => Some(Format::ClaudeCode),
            Some(_) => Some(Format::Jsonl),
            None => None,
        };
        let opts = Options {
            include_tools: self.a.include_tools,
            skip_invalid: true,
            first_line: first_line as usize,
        };
        let name = self.rel(path);
        let mut added = 0u64;
        match transcript::parse_bytes(&self.engine, &name, chunk, format, opts).await {
            Ok(parsed) => {
                for w in &parsed.warnings {
                    note(self.s, &format!("watch: {w}"));
                }
                f.format = Some(format_name(parsed.format).into());
                for conv in parsed.conversations {
                    let session = f.session.clone().unwrap_or_else(|| {
                        transcript::session_name(
                            conv.id.as_deref(),
                            path.strip_prefix(&self.dir).unwrap_or(path),
                            None,
                        )
                    });
                    f.session = Some(session.clone());
                    let n = self.engine.append(&session, &conv.episodes).await?;
                    added += u64::from(n);
                    let stats = self.engine.store().stats(&session).await.map_err(storage)?;
                    self.local
                        .mark_source(&session, &key, stats.last_episode, complete)
                        .await?;
                    self.pending.insert(session);
                }
            }
            // Only tool traffic or metadata so far: nothing to import, but the bytes are read.
            Err(TranscriptError::Empty { .. } | TranscriptError::EmptyFile { .. }) => {}
            Err(TranscriptError::UnknownFormat { .. }) => {
                note(
                    self.s,
                    &format!(
                        "watch: {name} is not a transcript this watcher can follow; skipping its new lines"
                    ),
                );
            }
            Err(e) => note(self.s, &format!("watch: {e}; skipping these lines")),
        }
        // The episodes are stored before the offset moves: a crash in between re-reads the
        // same lines, which append skips by their keys.
        f.offset = complete;
        f.lines = Some(first_line + count_lines(chunk));
        self.watched
            .put(&f, self.local.app().now_ms())
            .await
            .map_err(storage)?;
        self.files.insert(key, f.clone());
        if added > 0 {
            self.imported += added;
            note(
                self.s,
                &format!(
                    "watch: {} — {added} new episode(s) for session {}",
                    name,
                    f.session.as_deref().unwrap_or("?")
                ),
            );
        }
        Ok(added)
    }

    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(&self.dir).unwrap_or(p).display().to_string()
    }

    /// Refresh the pending sessions that are due; keep those that will be due later.
    async fn refresh(&mut self) -> Result<(), Failure> {
        let sessions: Vec<String> = self.pending.iter().cloned().collect();
        for session in sessions {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            // A job elsewhere (a summarize of the same transcript) is doing the work.
            if self.local.session_busy(&session).await? {
                continue;
            }
            let control = Arc::new(CallControl::new());
            *self.current.lock().await = Some(control.clone());
            let cfg = self.local.session_config(&session).await?;
            let r = self
                .engine
                .refresh_with(&session, &cfg, Some(control))
                .await;
            *self.current.lock().await = None;
            let covered = match &r {
                Ok(out) => out.unsummarized == 0,
                _ => false,
            };
            match r {
                Ok(out) if out.passes > 0 => {
                    self.refreshed += 1;
                    let last = out.written.last().map_or(0, |r| r.last_episode);
                    note(
                        self.s,
                        &format!("watch: session {session} summarized through episode {last}"),
                    );
                }
                Ok(_) => {}
                Err(CallError::Cancelled) => return Ok(()),
                Err(e) => note(
                    self.s,
                    &format!(
                        "watch: session {session}: refresh failed, the previous summary is kept and the next attempt backs off: {e:#}"
                    ),
                ),
            }
            // Covered: done until new lines arrive. Otherwise keep it pending unless refreshes
            // have stopped after repeated failures (only `abridge refresh` restarts them).
            let done =
                covered || self.engine.freshness(&session, &cfg).await?.state == FreshState::GaveUp;
            if done {
                self.pending.remove(&session);
            }
        }
        Ok(())
    }

    async fn pass(&mut self) -> Result<(), Failure> {
        let walk = abridge::walk::transcript_files(&self.dir, &["jsonl"], self.a.follow_links)
            .unwrap_or_default();
        for line in walk.skipped {
            if self.told.insert(line.clone()) {
                note(
                    self.s,
                    &format!("watch: {}", abridge::text::printable(&line)),
                );
            }
        }
        for path in walk.files.into_iter().map(|f| f.path) {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            self.import(&path).await?;
        }
        self.refresh().await
    }
}

pub async fn watch(s: &Settings, a: WatchArgs) -> Result<(), Failure> {
    let dir = std::fs::canonicalize(&a.dir)
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| {
            Failure::new(
                Exit::Input,
                anyhow!(
                    "{} is not a directory — give the folder to follow (e.g. ~/.claude/projects)",
                    a.dir.display()
                ),
            )
        })?;
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    let engine = local.engine().clone();
    let watched = Watched::new(local.app().store());
    let files: std::collections::BTreeMap<String, WatchedFile> = watched
        .all()
        .await
        .map_err(storage)?
        .into_iter()
        .map(|f| (f.path.clone(), f))
        .collect();
    // Sessions left behind by an earlier run may still be due.
    let pending = files.values().filter_map(|f| f.session.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let current: Arc<Mutex<Option<Arc<CallControl>>>> = Arc::new(Mutex::new(None));
    let (wake_tx, mut wake) = tokio::sync::mpsc::channel::<()>(1);
    {
        let (stop, current, wake_tx) = (stop.clone(), current.clone(), wake_tx.clone());
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.store(true, Ordering::SeqCst);
                if let Some(c) = current.lock().await.as_ref() {
                    c.cancel();
                }
                let _ = wake_tx.try_send(());
            }
        });
    }
    // Filesystem events wake the loop; polling covers what they miss.
    let _events = if a.no_events || a.once {
        None
    } else {
        use notify::Watcher as _;
        let tx = wake_tx.clone();
        let watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
            let _ = tx.try_send(());
        })
        .and_then(|mut w| w.watch(&dir, notify::RecursiveMode::Recursive).map(|()| w));
        match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                note(
                    s,
                    &format!(
                        "watch: filesystem events unavailable ({e}); polling every {} ms",
                        a.poll_ms
                    ),
                );
                None
            }
        }
    };
    let mut w = Watcher {
        s,
        a: &a,
        dir: dir.clone(),
        local,
        engine,
        watched,
        files,
        pending,
        imported: 0,
        refreshed: 0,
        told: BTreeSet::new(),
        stop: stop.clone(),
        current,
    };
    note(
        s,
        &format!(
            "watch: following {} ({} mode with {}; Ctrl-C stops)",
            dir.display(),
            match w.local.app().config().config.mode {
                abridge::types::Mode::Eager => "eager",
                abridge::types::Mode::Idle => "idle",
            },
            backend.name
        ),
    );
    loop {
        w.pass().await?;
        if a.once || stop.load(Ordering::SeqCst) {
            break;
        }
        tokio::select! {
            _ = wake.recv() => {
                // Let a burst of writes settle before reading.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            () = tokio::time::sleep(Duration::from_millis(a.poll_ms.max(10))) => {}
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
    }
    note(
        s,
        &format!(
            "watch: stopped; {} episode(s) imported and {} summary refresh(es) this run; every imported line is stored",
            w.imported, w.refreshed
        ),
    );
    Ok(())
}
