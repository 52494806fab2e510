//! Importing a transcript, the one flow every front end uses: `summarize`, `backfill`,
//! `watch` and `POST /v1/transcripts` all call [`Scoped::import`], which checks the whole
//! input in the sandbox, applies the limits, names and labels each conversation's session,
//! stores the episodes a read at a time, marks how far into its file each session now reaches,
//! and brings the summaries up to date the way the caller asks. The rule for messages without
//! an id of their own is here too ([`Scoped::keyed`]): one spelling of a source key, whoever
//! appends.

use std::path::Path;

use super::{AppError, AppResult, ErrorKind, Reason, Scoped};
use crate::naming;
use crate::transcript::{self, Format, Options, TranscriptError};
use crate::types::{Config, NewEpisode};
use crate::views::JobView;

/// One transcript to import.
pub struct ImportRequest<'a> {
    /// What it is called in messages (the file's path, or an upload's name).
    pub name: &'a str,
    /// Its bytes: a file, spooled standard input, or a request body.
    pub input: transcript::Input<'a>,
    /// Its format, or `None` to detect it.
    pub format: Option<Format>,
    /// The session for a transcript of one conversation (one of several is refused: each is
    /// a session of its own, named by the one naming rule).
    pub session: Option<&'a str>,
    /// The file it is read from (`-` for standard input): sessions are named after it, set
    /// apart from other files' sessions of the same name, labelled with its project, and
    /// marked with how far into it they reach.
    pub file: Option<&'a Path>,
    /// How far into the file this import reaches, when the input is a part of it (`watch`
    /// reads a file's new lines); the bytes read otherwise.
    pub reach: Option<u64>,
    /// How to parse it.
    pub opts: Options,
    /// Conversations with fewer episodes are left out (backfill's `--min-episodes`).
    pub min_episodes: u64,
    /// The largest input read.
    pub max_bytes: u64,
}

impl<'a> ImportRequest<'a> {
    /// A request for `input`, named `name`, with the defaults: format detected, sessions named
    /// by the naming rule, nothing left out.
    pub fn new(name: &'a str, input: transcript::Input<'a>) -> Self {
        ImportRequest {
            name,
            input,
            format: None,
            session: None,
            file: None,
            reach: None,
            opts: Options::default(),
            min_episodes: 0,
            max_bytes: u64::MAX,
        }
    }
}

/// What an import did.
#[derive(Debug)]
pub struct Import {
    /// The format read.
    pub format: Format,
    /// Each conversation stored, in file order: up to and including the first whose summary
    /// failed ([`Bring::Now`]), after which no more jobs are run (the episodes of every
    /// conversation are stored all the same).
    pub conversations: Vec<ConversationImport>,
    /// Episodes read, in every conversation (the small ones left out too).
    pub episodes: u64,
    /// Conversations left out for having fewer than `min_episodes` episodes.
    pub small: usize,
    /// Lines skipped, and why.
    pub warnings: Vec<String>,
}

/// Why an import stopped before storing anything, or failed while storing.
#[derive(Debug)]
pub enum ImportError {
    /// The input was refused while it was read: not a transcript, malformed, empty or too
    /// large. Nothing was stored.
    Read(TranscriptError),
    /// A limit, the store or the naming failed.
    App(AppError),
}

impl From<AppError> for ImportError {
    fn from(e: AppError) -> Self {
        ImportError::App(e)
    }
}

impl From<ImportError> for AppError {
    fn from(e: ImportError) -> Self {
        match e {
            ImportError::Read(e) => e.into(),
            ImportError::App(e) => e,
        }
    }
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImportError::Read(e) => e.fmt(f),
            ImportError::App(e) => e.fmt(f),
        }
    }
}

/// The file a conversation was read from, so a summary can say how far into it it reaches.
#[derive(Clone, Copy, Debug)]
pub struct SourceFile<'a> {
    /// The file's path (canonical where it could be resolved) or key.
    pub path: &'a str,
    /// How many of its bytes are read so far.
    pub bytes: u64,
}

/// How an import brings the summary up to date.
#[derive(Clone, Copy, Debug)]
pub enum Bring<'a> {
    /// Here and now, through the session's job (run here, or waited for when a live worker
    /// holds it), with this configuration: the command line's `summarize` and `backfill`.
    Now(&'a Config),
    /// Queue the session's job when anything is left to summarize (a service's import).
    Queue,
    /// Leave it to the caller's own schedule (`watch` refreshes its pending sessions when
    /// their mode says so).
    Later,
}

/// What an import did to one session.
#[derive(Debug)]
pub struct ConversationImport {
    /// The session.
    pub session: String,
    /// The conversation's title, when the format has one.
    pub title: Option<String>,
    /// Its episodes read.
    pub read: u64,
    /// Episodes new to the session (the rest were stored already).
    pub added: u32,
    /// The session's episode count now.
    pub episodes: u64,
    /// The job that brought it up to date ([`Bring::Now`]) or will ([`Bring::Queue`]); none
    /// when everything was covered already.
    pub job: Option<JobView>,
    /// Why bringing it up to date failed ([`Bring::Now`]): the episodes are stored all the
    /// same, and the previous summary is kept.
    pub failure: Option<AppError>,
}

/// The rule for a session named by the caller: it takes a transcript of one conversation, and
/// one of `n` is refused (each is a session of its own). The import's, and a dry run's.
pub fn one_session(name: &str, n: usize, session: Option<&str>) -> AppResult<()> {
    if n > 1 && session.is_some() {
        return Err(AppError::invalid(format!(
            "{name} holds {n} conversations, which are imported as one session each; leave the session out"
        )));
    }
    Ok(())
}

/// The prefix of source keys given to messages without an id of their own.
const UNKEYED: &str = "msg:";

/// The source key of a message without an id of its own, from a unique id.
pub(crate) fn unkeyed(unique: &str) -> String {
    format!("{UNKEYED}{unique}")
}

/// The id a client is told for the message stored under `source_key`: its own id, or the
/// unique one it was given.
pub(crate) fn client_id(source_key: &str) -> String {
    source_key
        .strip_prefix("id:")
        .or_else(|| source_key.strip_prefix(UNKEYED))
        .unwrap_or(source_key)
        .to_string()
}

impl Scoped {
    /// Give every message without an id of its own (its source key is not `id:…`) a key of
    /// its own, so it is a new message even if its text repeats; the caller-visible ids of all
    /// of them, in order.
    pub fn keyed(&self, episodes: &mut [NewEpisode]) -> Vec<String> {
        episodes
            .iter_mut()
            .map(|ep| match ep.source_key.strip_prefix("id:") {
                Some(id) => id.to_string(),
                None => {
                    let id = self.app.unique_id();
                    ep.source_key = format!("{UNKEYED}{id}");
                    id
                }
            })
            .collect()
    }

    /// Import a transcript (any supported format, parsed in the sandbox): one session per
    /// conversation, named by `request.session` or by the one naming rule, and each summary
    /// brought up to date as `bring` asks. The whole input is checked before anything is
    /// stored; memory holds one read's episodes, whatever its size.
    pub async fn import(
        &self,
        mut req: ImportRequest<'_>,
        bring: Bring<'_>,
    ) -> Result<Import, ImportError> {
        if let Some(s) = req.session {
            super::check_session(s)?;
        }
        let limits = &self.app.inner.cfg.limits;
        // The service's bound on one upload, where it is tighter than the caller's.
        let cap = limits.episodes_per_upload;
        if cap > 0 && (req.opts.max_episodes == 0 || req.opts.max_episodes > cap) {
            req.opts.max_episodes = cap;
        }
        let name = req.name;
        let scanned = transcript::scan(
            self.engine(),
            name,
            &mut req.input,
            req.format,
            req.opts,
            req.max_bytes,
        )
        .await
        .map_err(ImportError::Read)?;
        let n = scanned.conversations.len();
        if limits.conversations_per_upload > 0 && n > limits.conversations_per_upload {
            return Err(AppError::new(
                ErrorKind::TooLarge,
                format!(
                    "{name} holds {n} conversations, more than one upload takes ({})",
                    limits.conversations_per_upload
                ),
            )
            .hint(format!(
                "split the export into parts of at most {} conversations",
                limits.conversations_per_upload
            ))
            .into());
        }
        let taken = scanned
            .conversations
            .iter()
            .filter(|c| c.episodes >= req.min_episodes)
            .count();
        // Each conversation queues a refresh: refuse up front what the tenant's queue cannot
        // take, rather than store half of it.
        if matches!(bring, Bring::Queue) && limits.queued_per_tenant > 0 {
            let (queued, _) = self
                .app
                .inner
                .jobs
                .queued_of(&*self.tables, "")
                .await
                .map_err(AppError::from)?;
            let room = limits.queued_per_tenant.saturating_sub(queued);
            if taken > room {
                return Err(AppError::new(
                    ErrorKind::RateLimited {
                        retry_after_secs: 30,
                    },
                    format!(
                        "{name} holds {taken} conversations, each a refresh to queue, and this tenant may queue {room} more now (the limit is {})",
                        limits.queued_per_tenant
                    ),
                )
                .hint("upload fewer conversations at once, or wait for the queue to drain (GET /v1/jobs)")
                .into());
            }
        }
        one_session(name, n, req.session)?;
        let many = n > 1;
        // Standard input is no file to name, label or mark sessions by.
        let file = req.file.filter(|f| f.as_os_str() != "-");
        let named_by = req.file.unwrap_or(Path::new(name));
        // Every session named and labelled first (a small conversation gets an empty name:
        // not stored); then the second pass stores the episodes a read at a time.
        let mut sessions = Vec::with_capacity(n);
        let mut small = 0;
        for (i, conv) in scanned.conversations.iter().enumerate() {
            if conv.episodes < req.min_episodes {
                small += 1;
                sessions.push(String::new());
                continue;
            }
            let session = match req.session {
                Some(s) => s.to_string(),
                None => {
                    let base = naming::base(conv.id.as_deref(), named_by, many.then_some(i));
                    self.session_for(&base, file).await?
                }
            };
            self.label_session(&session, conv.title.as_deref(), file)
                .await?;
            sessions.push(session);
        }
        let added = transcript::store(
            self.engine(),
            name,
            &mut req.input,
            &scanned,
            &sessions,
            req.opts,
        )
        .await?;
        drop(req.input);
        let mark = file.map(naming::file_key);
        let reach = req.reach.unwrap_or(scanned.bytes);
        let mut out = Import {
            format: scanned.format,
            conversations: Vec::with_capacity(taken),
            episodes: scanned.conversations.iter().map(|c| c.episodes).sum(),
            small,
            warnings: scanned.warnings,
        };
        for ((conv, session), added) in scanned.conversations.into_iter().zip(sessions).zip(added) {
            if session.is_empty() {
                continue;
            }
            let source = mark
                .as_deref()
                .map(|path| SourceFile { path, bytes: reach });
            let mut done = self.finish_import(&session, added, source, bring).await?;
            done.title = conv.title;
            done.read = conv.episodes;
            let failed = done.failure.is_some();
            out.conversations.push(done);
            if failed {
                break;
            }
        }
        Ok(out)
    }

    /// After a conversation's episodes are stored (`added` of them new): record how far into
    /// `source` the session reaches, and bring the summary up to date as `bring` asks.
    async fn finish_import(
        &self,
        session: &str,
        added: u32,
        source: Option<SourceFile<'_>>,
        bring: Bring<'_>,
    ) -> AppResult<ConversationImport> {
        let stats = self.store().stats(session).await?;
        if let Some(f) = source {
            self.mark_source(session, f.path, stats.last_episode, f.bytes)
                .await?;
        }
        let mut out = ConversationImport {
            session: session.to_string(),
            title: None,
            read: 0,
            added,
            episodes: stats.episodes,
            job: None,
            failure: None,
        };
        match bring {
            Bring::Later => {}
            Bring::Now(base) => {
                let cfg = self.for_session(session, base).await?;
                if let Some(target) = self.due(session, &cfg, Reason::Asked).await? {
                    match self.run_or_join(session, target, &cfg).await {
                        Ok(job) => out.job = Some(self.job_view(&job)),
                        Err(e) => out.failure = Some(e),
                    }
                }
            }
            // Queued as a posted message would be: the same rule, the same target.
            Bring::Queue => {
                let cfg = self.session_config(session).await?;
                if let Some(target) = self.due(session, &cfg, Reason::Append).await? {
                    let job = self.enqueue(session, target, &cfg).await?;
                    out.job = Some(self.job_view(&job));
                }
            }
        }
        Ok(out)
    }
}
