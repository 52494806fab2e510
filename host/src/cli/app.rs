//! The command line's way into the app layer: the local tenant's app for these settings, app
//! errors as exit codes with the command line's own advice, and jobs run with their progress
//! shown by a subscriber of the app's events (the server's event streams are another).

use std::sync::Arc;
use std::time::Instant;

use anyhow::anyhow;

use abridge_app::engine::Progress;
use abridge_app::engine::types::Level;
use abridge_app::jobs::Job;
use abridge_app::{
    App, AppConfig, AppError, ErrorKind, Event, Limits, Scoped, SessionConfig, What,
};

use super::commands::{Backend, engine_config, runtime};
use super::progress::{JobProgress, Mode, duration_text};
use super::{Exit, Failure, Settings};

/// Receives a job's label and its progress.
pub type LabelledObserver = Arc<dyn Fn(&str, &Progress) + Send + Sync>;

/// Where a job's progress goes.
#[derive(Clone)]
pub enum Show {
    /// Its own bar or lines (see [`Mode`]).
    Own(Mode),
    /// To a caller's display (e.g. backfill's overall bar), with the job's label.
    Into(LabelledObserver),
}

impl From<AppError> for Failure {
    fn from(e: AppError) -> Self {
        let exit = match e.kind {
            ErrorKind::Model
            | ErrorKind::Unavailable
            | ErrorKind::RateLimited { .. }
            | ErrorKind::QuotaExhausted { .. } => Exit::Model,
            ErrorKind::Storage | ErrorKind::Conflict => Exit::Storage,
            ErrorKind::Internal => Exit::Internal,
            _ => Exit::Input,
        };
        let msg = match &e.hint {
            Some(h) => format!("{} — {h}", e.message),
            None => e.message.clone(),
        };
        Failure::new(exit, anyhow!(msg))
    }
}

/// An app error as the command line reports it: what is not found is looked for in the
/// database the settings name, with the command that lists what is there.
pub fn fail(s: &Settings, e: AppError) -> Failure {
    if e.kind != ErrorKind::NotFound {
        return e.into();
    }
    let list = if e.message.starts_with("no job") {
        "abridge jobs"
    } else {
        "abridge status"
    };
    not_found_in(s, &e.message, list)
}

/// "no THING in DB — list them with 'COMMAND'"; a message that already says how to find what
/// is there (or is not about a missing thing) gets only the database (one hint, never two
/// glued together).
pub fn not_found_in(s: &Settings, message: &str, list: &str) -> Failure {
    let db = abridge_app::db::shown(&s.db);
    Failure::new(
        Exit::Input,
        if message.contains("'abridge ") || !message.starts_with("no ") {
            anyhow!("{message} (database {db})")
        } else {
            anyhow!("{message} in {db} — list them with '{list}'")
        },
    )
}

/// The app for these settings and backend. `log` receives the engine's messages; `limits`
/// guard a shared service (a command line run is one user: [`Limits::unlimited`]).
pub fn open(
    s: &Settings,
    backend: &Backend,
    limits: Limits,
    log: abridge_app::LogFn,
) -> Result<App, Failure> {
    Ok(App::open(app_config(s, backend, limits, log)?)?)
}

/// The app over a database in memory with no model: a dry run imports and plans there, by
/// the same rules as a real run, and keeps nothing.
pub fn in_memory(s: &Settings) -> Result<Scoped, Failure> {
    let cfg = app_config(s, &Backend::none(), Limits::unlimited(), stderr_log(s))?;
    Ok(App::open_in_memory(cfg)?.local())
}

fn app_config(
    s: &Settings,
    backend: &Backend,
    limits: Limits,
    log: abridge_app::LogFn,
) -> Result<AppConfig, Failure> {
    let embedder = super::memory::embedder(s)?;
    // The monthly ceiling holds for every front end.
    let mut limits = limits;
    if limits.ceiling.is_none() {
        limits.ceiling = super::memory::ceiling()?;
    }
    let cfg = AppConfig {
        db: s.db.clone(),
        config: engine_config(s, backend),
        llm: backend.llm.clone(),
        backend_name: backend.name.to_string(),
        batch_concurrency: s.concurrency,
        job_lease: s.job_lease,
        clock: Arc::new(abridge_app::engine::SystemClock),
        runtime: runtime()?,
        log,
        limits,
        events_kept: 1000,
        memory: {
            let mut m = super::memory::memory_config()?;
            if let Some(e) = &embedder {
                m.embedder = e.model();
            }
            m
        },
        embedder,
        master_key: super::memory::master_key()?,
        // Vectors are sealed too when asked (ABRIDGE_SEAL_VECTORS=1; needs the master key).
        seal_vectors: std::env::var("ABRIDGE_SEAL_VECTORS").is_ok_and(|v| v == "1" || v == "true"),
    };
    Ok(cfg)
}

/// Engine messages on stderr, as `-v`/`-q` ask.
pub(super) fn stderr_log(s: &Settings) -> abridge_app::LogFn {
    let (verbose, quiet) = (s.verbose, s.quiet);
    Arc::new(move |level, msg| {
        let show = match level {
            Level::Warn => !quiet,
            Level::Info => verbose >= 1,
            Level::Debug => verbose >= 2,
        };
        if show {
            eprintln!(
                "abridge: {}",
                abridge_app::engine::text::printable_lines(msg)
            );
        }
    })
}

/// The local tenant's side of the app for a command: with the backend a command that may
/// call the model chose, or with none for the ones that only read or administer.
pub fn local(s: &Settings, backend: Option<&Backend>) -> Result<Scoped, Failure> {
    Ok(open_local(s, backend)?.local())
}

/// The app for a command that administers the database as a whole (indexing older sessions,
/// deleting a tenant): the process that runs it owns the database.
pub fn open_local(s: &Settings, backend: Option<&Backend>) -> Result<App, Failure> {
    let none = Backend::none();
    open(
        s,
        backend.unwrap_or(&none),
        Limits::unlimited(),
        stderr_log(s),
    )
}

/// The local tenant's side of the app for a command that only reads: a database file that
/// does not exist yet reads as empty, and nothing (no file, no folder) is created for it.
pub fn local_read(s: &Settings) -> Result<Scoped, Failure> {
    let url = abridge_app::db::is_url(&s.db.to_string_lossy());
    if !url && !s.db.exists() {
        return in_memory(s);
    }
    local(s, None)
}

/// Shows one session's job from its events: notes on stderr, then progress.
struct Display<'a> {
    s: &'a Settings,
    /// Only this session's events (all of the tenant's when `None`).
    session: Option<&'a str>,
    show: Show,
    running: Option<(String, Arc<JobProgress>)>,
    /// The running job's map-reduce chunks (none for a single call or a fold).
    chunks: Option<u64>,
    started: Instant,
}

impl Display<'_> {
    fn mode(&self) -> Mode {
        match &self.show {
            Show::Own(m) => *m,
            Show::Into(_) => Mode::Off,
        }
    }

    fn on(&mut self, ev: &Event) {
        let Some(session) = ev.session.as_deref() else {
            return;
        };
        if self.session.is_some_and(|s| s != session) {
            return;
        }
        let id = ev.job.unwrap_or(0);
        let Some(what) = ev.what() else {
            return;
        };
        match what {
            What::JobJoined { state, target } => super::commands::note(
                self.s,
                &format!(
                    "job {id} for session {session} up to episode {target} is already {state}; joining it"
                ),
            ),
            What::JobWaiting { owner, .. } => super::commands::note(
                self.s,
                &format!(
                    "job {id} is being run by {}; waiting for it",
                    owner.as_deref().unwrap_or("another worker")
                ),
            ),
            What::JobRunning {
                attempt,
                resumed,
                levels,
                chunks,
                map_reduce,
                ..
            } => {
                if resumed {
                    super::commands::note(
                        self.s,
                        &format!(
                            "resuming job {id} for session {session} (attempt {attempt}); cached partial summaries are reused"
                        ),
                    );
                }
                let label = format!("job {id} (session {session})");
                self.chunks = (map_reduce == Some(true)).then(|| u64::from(chunks.unwrap_or(0)));
                self.started = Instant::now();
                let view = JobProgress::new(self.mode(), label.clone(), levels.unwrap_or_default());
                self.running = Some((label, Arc::new(view)));
            }
            What::JobProgress {
                level,
                done,
                total,
                answers,
                ..
            } => {
                let p = Progress {
                    level,
                    done,
                    total,
                    answers,
                };
                if let Some((label, view)) = &self.running {
                    match &self.show {
                        Show::Own(_) => view.update(&p),
                        Show::Into(f) => f(label, &p),
                    }
                }
            }
            What::JobSucceeded { level, answers, .. } => {
                if let Some((_, view)) = self.running.take() {
                    view.finish();
                }
                if self.mode() != Mode::Off
                    && let Some(chunks) = self.chunks.take()
                {
                    eprintln!(
                        "abridge: job {id}: {chunks} chunks merged in {} reduce level(s) with {} model answers in {}",
                        level.unwrap_or(0),
                        answers.unwrap_or(0),
                        duration_text(self.started.elapsed())
                    );
                }
            }
            What::JobFailed { .. } | What::JobCancelled { .. } => {
                if let Some((_, view)) = self.running.take() {
                    view.finish();
                }
            }
            _ => {}
        }
    }
}

/// Bring `session` up to episode `target` through its job, in this process (see
/// [`Scoped::run_or_join`]), showing what happens as `show` asks.
pub async fn run_or_join(
    s: &Settings,
    app: &Scoped,
    (session, target): (&str, u64),
    cfg: &SessionConfig,
    show: Show,
) -> Result<Job, Failure> {
    shown(
        s,
        app,
        Some(session),
        show,
        app.run_or_join(session, target, cfg),
    )
    .await
}

/// Run `work` while the events of `session`'s jobs (all of the tenant's with `None`) are
/// shown as `show` asks.
pub async fn shown<T>(
    s: &Settings,
    app: &Scoped,
    session: Option<&str>,
    show: Show,
    work: impl std::future::Future<Output = Result<T, AppError>>,
) -> Result<T, Failure> {
    let mut live = app.subscribe(None).await.live;
    let mut display = Display {
        s,
        session,
        show,
        running: None,
        chunks: None,
        started: Instant::now(),
    };
    tokio::pin!(work);
    let result = loop {
        tokio::select! {
            ev = live.recv() => {
                // Lagging behind drops progress lines only; the end comes from the result.
                if let Ok(ev) = ev {
                    display.on(&ev);
                }
            }
            r = &mut work => break r,
        }
    };
    // Everything the work published is in the channel once written.
    app.flush_events().await;
    while let Ok(ev) = live.try_recv() {
        display.on(&ev);
    }
    if let Some((_, view)) = display.running.take() {
        view.finish();
    }
    result.map_err(run_failure)
}

/// A run that failed, as the command line says it: with the app's hint replaced by how to
/// retry from here.
pub fn run_failure(mut e: AppError) -> Failure {
    if e.hint.is_some() {
        e.hint = Some(
            "the episodes are stored, earlier summaries are unchanged and answers received are cached; rerun (or 'abridge jobs run') to retry".into(),
        );
    }
    e.into()
}

/// Bring the messages stored before the full-text index existed into it (once per database),
/// saying how far it has got on stderr unless quiet.
pub async fn index_pending(s: &Settings, app: &Scoped) -> Result<(), Failure> {
    let quiet = s.quiet;
    let shown = std::sync::atomic::AtomicU64::new(u64::MAX);
    let progress = |done: u64, total: u64| {
        let pct = done * 100 / total.max(1);
        if !quiet && shown.swap(pct, std::sync::atomic::Ordering::Relaxed) != pct {
            eprint!("\rindexing stored messages for search: {done} of {total} ({pct} %)");
            if done >= total {
                eprintln!();
            }
        }
    };
    app.index_pending(&progress).await?;
    Ok(())
}
