//! Watch: follow a folder of Claude Code session files and JSON-lines files, import appended
//! lines as they arrive and keep each session's summary fresh per its mode.
//!
//! Each file's imported length (the end of its last complete line) is stored, so a restart
//! resumes where the last run stopped and a partial last line still being written waits for
//! its newline. Files present at the watcher's first pass get that length as a baseline (no
//! import, no model call) unless [`WatchOptions::backfill`] is set; a file first seen later
//! (a new session, a file moved into place) is new and imported from its first byte. Filesystem events wake the
//! loop early; a poll is the fallback and also drives idle-mode verdicts, which are judged on
//! the app's clock, so a test drives [`Watcher::pass`] with a manual clock and no sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{AppError, AppResult, Bring, ImportError, ImportRequest, Reason, Scoped};
use crate::sources::{Watched, WatchedFile};
use crate::transcript::{self, Format, Options, TranscriptError};
use crate::types::FreshState;

/// How to follow a folder.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    /// Import what files already hold when first seen (otherwise start after it).
    pub backfill: bool,
    /// Keep tool calls and tool results as episodes.
    pub include_tools: bool,
    /// Follow symbolic links that lead out of the folder.
    pub follow_links: bool,
}

/// What the watcher has to say as it goes, for a front end to show.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchNote {
    /// A file first seen; what it held is not imported.
    Baseline {
        /// The file, relative to the folder.
        file: String,
        /// Where importing starts.
        offset: u64,
    },
    /// A file shorter than what was imported of it (truncated or replaced).
    Shrank {
        /// The file.
        file: String,
    },
    /// A file could not be read this time.
    CannotRead {
        /// The file.
        file: String,
        /// Why.
        error: String,
    },
    /// A file that is not a transcript this watcher can follow.
    NotTranscript {
        /// The file.
        file: String,
    },
    /// Lines skipped, or a parser warning.
    Warning(String),
    /// New episodes stored.
    Imported {
        /// The file.
        file: String,
        /// Episodes added.
        added: u64,
        /// Their session.
        session: String,
    },
    /// A session's summary now reaches this episode.
    Summarized {
        /// The session.
        session: String,
        /// Its newest summarized episode.
        through: u64,
    },
    /// A refresh failed; the previous summary is kept.
    RefreshFailed {
        /// The session.
        session: String,
        /// Why.
        error: String,
    },
}

impl fmt::Display for WatchNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchNote::Baseline { file, offset } => write!(
                f,
                "{file} — baseline at {offset} bytes (earlier content is not imported; --backfill imports it)"
            ),
            WatchNote::Shrank { file } => write!(
                f,
                "{file} shrank below what was imported; reading it again from the start (known lines are not duplicated)"
            ),
            WatchNote::CannotRead { file, error } => {
                write!(f, "cannot read {file}: {error}; retrying later")
            }
            WatchNote::NotTranscript { file } => write!(
                f,
                "{file} is not a transcript this watcher can follow; skipping its new lines"
            ),
            WatchNote::Warning(w) => f.write_str(w),
            WatchNote::Imported {
                file,
                added,
                session,
            } => write!(f, "{file} — {added} new episode(s) for session {session}"),
            WatchNote::Summarized { session, through } => {
                write!(f, "session {session} summarized through episode {through}")
            }
            WatchNote::RefreshFailed { session, error } => write!(
                f,
                "session {session}: refresh failed, the previous summary is kept and the next attempt backs off: {error}"
            ),
        }
    }
}

/// Where a watcher's notes go.
pub type NoteSink = Arc<dyn Fn(WatchNote) + Send + Sync>;

/// Stops a watcher from another task (Ctrl-C, a shutdown): the pass in progress ends after
/// the file it is reading, and a refresh under way stops and its job goes back to the queue
/// (its episodes stay stored, the answers received stay cached for the next run).
#[derive(Clone)]
pub struct Stopper {
    stopped: Arc<AtomicBool>,
    /// Tells a job running here to stop (see [`Scoped::run_or_join_until`]).
    signal: Arc<tokio::sync::watch::Sender<bool>>,
    wake: mpsc::Sender<()>,
}

impl Stopper {
    /// Stop.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.signal.send_replace(true);
        let _ = self.wake.try_send(());
    }

    /// Whether [`Stopper::stop`] was called.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Wake the follow loop early (something changed in the folder).
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }
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

/// The name a followed file's format is recorded under: a line format's own name; anything
/// else is read on as JSON lines.
fn format_name(f: Format) -> String {
    match f {
        Format::ClaudeCode | Format::Codex => f.to_string(),
        _ => Format::Jsonl.to_string(),
    }
}

/// The folder to follow, canonical; an error that says what to give when `dir` is not an
/// existing directory.
pub fn folder(dir: &Path) -> AppResult<PathBuf> {
    std::fs::canonicalize(dir)
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| {
            AppError::invalid(format!("{} is not a directory", dir.display()))
                .hint("give the folder to follow (e.g. ~/.claude/projects)")
        })
}

/// One follow of a folder (see the module doc).
pub struct Watcher {
    dir: PathBuf,
    opts: WatchOptions,
    local: Scoped,
    watched: Watched,
    files: BTreeMap<String, WatchedFile>,
    /// Sessions whose summary may need a refresh now or later.
    pending: BTreeSet<String>,
    imported: u64,
    refreshed: u32,
    /// Walk notes already given (a link loop is reported once, not every pass).
    told: BTreeSet<String>,
    /// Whether the first pass is over: a file first seen after it is new (a session that
    /// started, a file moved into place) and is read from its first byte, never baselined.
    first_pass_done: bool,
    notes: NoteSink,
    stopper: Stopper,
    wakes: mpsc::Receiver<()>,
}

impl Scoped {
    /// A watcher of `dir` (an existing directory), resuming what earlier runs recorded.
    pub async fn watcher(
        &self,
        dir: &Path,
        opts: WatchOptions,
        notes: NoteSink,
    ) -> AppResult<Watcher> {
        let dir = folder(dir)?;
        let watched = Watched::new(self.app.store());
        let files: BTreeMap<String, WatchedFile> = watched
            .all()
            .await?
            .into_iter()
            .map(|f| (f.path.clone(), f))
            .collect();
        // Sessions left behind by an earlier run may still be due.
        let pending = files.values().filter_map(|f| f.session.clone()).collect();
        let (wake, wakes) = mpsc::channel(1);
        Ok(Watcher {
            dir,
            opts,
            local: self.clone(),
            watched,
            files,
            pending,
            imported: 0,
            refreshed: 0,
            told: BTreeSet::new(),
            first_pass_done: false,
            notes,
            stopper: Stopper {
                stopped: Arc::new(AtomicBool::new(false)),
                signal: Arc::new(tokio::sync::watch::channel(false).0),
                wake,
            },
            wakes,
        })
    }
}

impl Watcher {
    /// The folder followed (canonical).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A handle that stops this watcher from another task.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Episodes imported by this watcher so far.
    pub fn imported(&self) -> u64 {
        self.imported
    }

    /// Summary refreshes this watcher made so far.
    pub fn refreshed(&self) -> u32 {
        self.refreshed
    }

    /// Sessions that may still need a refresh (for instance waiting for idle mode's quiet).
    pub fn pending(&self) -> Vec<String> {
        self.pending.iter().cloned().collect()
    }

    fn note(&self, n: WatchNote) {
        (self.notes)(n)
    }

    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(&self.dir).unwrap_or(p).display().to_string()
    }

    /// Follow until stopped: a pass, then wait for a filesystem event (when `events`) or
    /// `poll`, and again. Without filesystem events (unavailable, or not asked for) polling
    /// alone drives it.
    pub async fn follow(&mut self, poll: Duration, events: bool) -> AppResult<()> {
        let _events = if events {
            use notify::Watcher as _;
            let stopper = self.stopper.clone();
            let watcher =
                notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
                    stopper.wake()
                })
                .and_then(|mut w| {
                    w.watch(&self.dir, notify::RecursiveMode::Recursive)
                        .map(|()| w)
                });
            match watcher {
                Ok(w) => Some(w),
                Err(e) => {
                    self.note(WatchNote::Warning(format!(
                        "filesystem events unavailable ({e}); polling every {} ms",
                        poll.as_millis()
                    )));
                    None
                }
            }
        } else {
            None
        };
        loop {
            self.pass().await?;
            if self.stopper.stopped() {
                return Ok(());
            }
            tokio::select! {
                _ = self.wakes.recv() => {
                    // Let a burst of writes settle before reading.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                () = tokio::time::sleep(poll.max(Duration::from_millis(10))) => {}
            }
            if self.stopper.stopped() {
                return Ok(());
            }
        }
    }

    /// One pass: import what is new in every file, then refresh the sessions that are due.
    pub async fn pass(&mut self) -> AppResult<()> {
        let walk = crate::walk::transcript_files(&self.dir, &["jsonl"], self.opts.follow_links)
            .unwrap_or_default();
        for line in walk.skipped {
            if self.told.insert(line.clone()) {
                self.note(WatchNote::Warning(
                    crate::text::printable(&line).into_owned(),
                ));
            }
        }
        for path in walk.files.into_iter().map(|f| f.path) {
            if self.stopper.stopped() {
                return Ok(());
            }
            self.import(&path).await?;
        }
        self.first_pass_done = true;
        self.refresh().await
    }

    /// Import what is new in `path`. Returns the episodes added.
    async fn import(&mut self, path: &Path) -> AppResult<u64> {
        let key = path.display().to_string();
        let name = self.rel(path);
        let cannot = |w: &Self, e: std::io::Error| {
            w.note(WatchNote::CannotRead {
                file: w.rel(path),
                error: e.to_string(),
            });
            Ok(0)
        };
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) => return cannot(self, e),
        };
        // The common case, polled every tick: nothing appended, nothing read.
        if self.files.get(&key).is_some_and(|f| f.offset == len) {
            return Ok(0);
        }
        let now = self.local.app().now_ms();
        let mut f = match self.files.get(&key) {
            Some(f) => f.clone(),
            None => {
                // First sight. A file that was there when the watch began gets a baseline at
                // the end of its last complete line (its lines before it counted while they
                // are at hand); one that appears later is new: all of it is imported.
                let baseline = !self.opts.backfill && !self.first_pass_done;
                let (offset, lines) = if !baseline {
                    (0, 0)
                } else {
                    match read_from(path, 0) {
                        Ok(b) => {
                            let end = complete_lines(&b);
                            (end as u64, count_lines(&b[..end]))
                        }
                        Err(e) => return cannot(self, e),
                    }
                };
                let f = WatchedFile {
                    path: key.clone(),
                    session: None,
                    format: None,
                    offset,
                    lines: Some(lines),
                };
                if baseline {
                    self.note(WatchNote::Baseline {
                        file: name.clone(),
                        offset,
                    });
                }
                self.watched.put(&f, now).await?;
                self.files.insert(key.clone(), f.clone());
                f
            }
        };
        let followed = self
            .local
            .import_appended(&mut f, path, &name, self.opts.include_tools)
            .await?;
        for n in followed.notes {
            self.note(n);
        }
        self.pending.extend(followed.sessions);
        let added = followed.added;
        if added > 0 {
            self.imported += added;
            self.note(WatchNote::Imported {
                file: name,
                added,
                session: f.session.clone().unwrap_or_default(),
            });
        }
        self.files.insert(key, f);
        Ok(added)
    }

    /// Refresh the pending sessions that are due, each through its job, run here (the one way
    /// a refresh runs); keep those that will be due later.
    async fn refresh(&mut self) -> AppResult<()> {
        let engine = self.local.engine().clone();
        for session in self.pending() {
            if self.stopper.stopped() {
                return Ok(());
            }
            // A job elsewhere (a summarize of the same transcript) is doing the work.
            if self.local.session_busy(&session).await? {
                continue;
            }
            let cfg = self.local.session_config(&session).await?;
            if let Some(target) = self.local.due(&session, &cfg, Reason::Append).await? {
                let stop = self.stopper.signal.subscribe();
                match self
                    .local
                    .run_or_join_until(&session, target, &cfg, Some(stop))
                    .await
                {
                    // Stopped: the job went back to the queue.
                    Ok(None) => return Ok(()),
                    Ok(Some(_)) => {
                        self.refreshed += 1;
                        let through = engine
                            .store()
                            .latest_summary(&session)
                            .await?
                            .map_or(0, |r| r.last_episode);
                        self.note(WatchNote::Summarized {
                            session: session.clone(),
                            through,
                        });
                    }
                    Err(e) => self.note(WatchNote::RefreshFailed {
                        session: session.clone(),
                        error: e.message.clone(),
                    }),
                }
            }
            // Covered: done until new lines arrive. Otherwise keep it pending unless refreshes
            // have stopped after repeated failures (only a refresh asked for restarts them).
            let state = engine.freshness(&session, &cfg).await?.state;
            if matches!(
                state,
                FreshState::Fresh | FreshState::Empty | FreshState::GaveUp
            ) {
                self.pending.remove(&session);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_complete_up_to_the_last_newline() {
        assert_eq!(complete_lines(b"a\nb\npartial"), 4);
        assert_eq!(complete_lines(b"partial"), 0);
        assert_eq!(count_lines(b"a\nb\nc"), 2);
    }
}

/// What importing a file's appended lines did.
#[derive(Debug, Default)]
pub struct Followed {
    /// Episodes added.
    pub added: u64,
    /// Sessions the lines went to.
    pub sessions: Vec<String>,
    /// What to tell the user.
    pub notes: Vec<WatchNote>,
}

impl Scoped {
    /// Import the complete lines appended to `path` since `f` (its record) was last read, and
    /// record how far it is read: the one incremental import, for `watch` and `abridge hook`.
    /// A file shorter than its offset was replaced and is read again from the start; episode
    /// keys carry the file's own line numbers, so nothing is imported twice. The episodes are
    /// stored before the offset moves.
    pub async fn import_appended(
        &self,
        f: &mut WatchedFile,
        path: &Path,
        name: &str,
        include_tools: bool,
    ) -> AppResult<Followed> {
        let mut notes = Vec::new();
        let cannot = |e: std::io::Error| {
            Ok(Followed {
                notes: vec![WatchNote::CannotRead {
                    file: name.to_string(),
                    error: e.to_string(),
                }],
                ..Followed::default()
            })
        };
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) => return cannot(e),
        };
        if len < f.offset {
            notes.push(WatchNote::Shrank {
                file: name.to_string(),
            });
            f.offset = 0;
            f.lines = Some(0);
        }
        // Episode keys carry the file's own line numbers: a record from an older abridge has
        // no count yet, so count the lines before its offset once; then keep count.
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
            return Ok(Followed {
                notes,
                ..Followed::default()
            });
        }
        let complete = f.offset + chunk.len() as u64;
        let format = f
            .format
            .as_deref()
            .map(|n| Format::parse(n).ok().flatten().unwrap_or(Format::Jsonl));
        let opts = Options {
            include_tools,
            skip_invalid: true,
            first_line: first_line as usize,
            // A watched file is followed live: a line without a time is dated by when the
            // watcher read it (idle mode waits for quiet from it).
            arrived: true,
            ..Options::default()
        };
        let mut added = 0u64;
        let mut sessions = Vec::new();
        // A file is one session once named: a later read (with no id of its own) goes on it.
        let req = ImportRequest {
            format,
            session: f.session.as_deref(),
            file: Some(path),
            reach: Some(complete),
            opts,
            ..ImportRequest::new(name, transcript::Input::Bytes(chunk))
        };
        match self.import(req, Bring::Later).await {
            Ok(done) => {
                for w in done.warnings {
                    notes.push(WatchNote::Warning(w));
                }
                f.format = Some(format_name(done.format));
                for conv in done.conversations {
                    added += u64::from(conv.added);
                    sessions.push(conv.session);
                }
                if f.session.is_none() {
                    f.session = sessions.first().cloned();
                }
            }
            // Only tool traffic or metadata so far: nothing to import, but the bytes are read.
            Err(ImportError::Read(
                TranscriptError::Empty { .. } | TranscriptError::EmptyFile { .. },
            )) => {}
            Err(ImportError::Read(TranscriptError::UnknownFormat { .. })) => {
                notes.push(WatchNote::NotTranscript {
                    file: name.to_string(),
                })
            }
            Err(ImportError::Read(e)) => {
                notes.push(WatchNote::Warning(format!("{e}; skipping these lines")))
            }
            Err(ImportError::App(e)) => return Err(e),
        }
        // The episodes are stored before the offset moves: a crash in between re-reads the
        // same lines, which append skips by their keys.
        f.offset = complete;
        f.lines = Some(first_line + count_lines(chunk));
        Watched::new(self.app.store())
            .put(f, self.app.now_ms())
            .await?;
        Ok(Followed {
            added,
            sessions,
            notes,
        })
    }
}
