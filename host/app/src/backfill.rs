//! Backfill: bring every transcript under a folder into its sessions and summarize them,
//! passing over files that have not changed since the last run. The scan (walk, filters,
//! order) and the work on each file live here; a front end shows progress (the job events)
//! and prints the outcomes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{AppError, AppResult, Bring, ImportError, ImportRequest, Scoped, naming};
use crate::runtime::Abridge;
use crate::sources::{Source, Sources};
use crate::store::SourceStore;
use crate::transcript::{self, Options, TranscriptError};
use crate::types::{Config, PlanReport};

/// Why a JSON file that holds no conversation is skipped.
pub const NOT_TRANSCRIPT: &str = "not a transcript (no known format, or no messages)";

/// What the folder walk found of one file.
#[derive(Clone, Debug)]
pub struct ScannedFile {
    /// Its path.
    pub path: PathBuf,
    /// Its path under the folder (shown, and the base of its session names).
    pub rel: String,
    /// Size in bytes when walked.
    pub size: u64,
    /// Modification time, ms since the epoch.
    pub mtime_ms: u64,
}

/// Which files a scan keeps.
#[derive(Clone, Debug, Default)]
pub struct ScanFilter {
    /// A glob (`*`, `?`) or, without wildcards, a substring of the path under the folder.
    pub pattern: Option<String>,
    /// Only files modified at or after this time (ms since the epoch).
    pub since_ms: Option<u64>,
    /// At most this many, the most recently modified first.
    pub limit: Option<usize>,
    /// Follow symbolic links that lead out of the folder.
    pub follow_links: bool,
}

/// The files of a scan, newest first, and what the walk passed over (link loops, links out).
#[derive(Debug, Default)]
pub struct Scan {
    /// Files kept.
    pub files: Vec<ScannedFile>,
    /// Notes on entries passed over.
    pub skipped: Vec<String>,
}

/// Every `*.jsonl` and `*.json` file under `dir` that `filter` keeps, newest first.
pub fn scan(dir: &Path, filter: &ScanFilter) -> AppResult<Scan> {
    let w = crate::walk::transcript_files(dir, &["jsonl", "json"], filter.follow_links).map_err(
        |e| AppError::invalid(format!("cannot read the directory {}: {e}", dir.display())),
    )?;
    let mut files: Vec<ScannedFile> = w
        .files
        .into_iter()
        .map(|f| ScannedFile {
            path: f.path,
            rel: f.rel,
            size: f.size,
            mtime_ms: f.mtime_ms,
        })
        .filter(|f| filter.pattern.as_deref().is_none_or(|p| matches(p, &f.rel)))
        .filter(|f| filter.since_ms.is_none_or(|t| f.mtime_ms >= t))
        .collect();
    files.sort_by(|x, y| y.mtime_ms.cmp(&x.mtime_ms).then_with(|| x.rel.cmp(&y.rel)));
    if let Some(n) = filter.limit {
        files.truncate(n);
    }
    Ok(Scan {
        files,
        skipped: w.skipped,
    })
}

/// Whether `text` matches the glob `pat` (`*` any run, `?` one character).
pub fn glob(pat: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// A glob when `pattern` has wildcards, else a substring.
pub fn matches(pattern: &str, rel: &str) -> bool {
    if pattern.contains(['*', '?']) {
        glob(pattern, rel)
    } else {
        rel.contains(pattern)
    }
}

/// An age (`90m`, `12h`, `7d`), a date or an RFC 3339 time, as ms since the epoch.
pub fn since_ms(s: &str, now: u64) -> Result<u64, String> {
    let s = s.trim();
    let unit = |c: char| match c {
        's' => Some(1_000u64),
        'm' => Some(60_000),
        'h' => Some(3_600_000),
        'd' => Some(86_400_000),
        'w' => Some(7 * 86_400_000),
        _ => None,
    };
    if let Some(last) = s.chars().last()
        && let Some(ms) = unit(last)
        && let Ok(n) = s[..s.len() - 1].parse::<u64>()
    {
        return Ok(now.saturating_sub(n * ms));
    }
    // A time with an offset (RFC 3339), else a civil date or date-time read as UTC.
    let parsed = s.parse::<jiff::Timestamp>().ok().or_else(|| {
        let civil = s.parse::<jiff::civil::DateTime>().ok().or_else(|| {
            s.parse::<jiff::civil::Date>()
                .ok()
                .map(|d| d.at(0, 0, 0, 0))
        })?;
        jiff::tz::TimeZone::UTC.to_timestamp(civil).ok()
    });
    parsed
        .map(|t| t.as_millisecond().max(0) as u64)
        .ok_or_else(|| {
            format!(
                "{s:?} is not a date (2026-11-01), a time (2026-11-01T12:00:00Z) or an age (90m, 12h, 7d)"
            )
        })
}

/// Whether what is recorded of a file says it needs no reading: same size and time, and it
/// was summarized, was too small (and still would be), or was not a transcript.
pub fn unchanged(known: &Source, f: &ScannedFile, min_episodes: u64) -> bool {
    let still_small = known.status == "skipped"
        && known.detail.as_deref() == Some("too few episodes")
        && known.episodes < min_episodes;
    known.size == f.size
        && known.mtime_ms == f.mtime_ms
        && (known.status == "ok" || still_small || known.detail.as_deref() == Some(NOT_TRANSCRIPT))
}

/// The hex SHA-256 of a file's content, read a megabyte at a time and never held; more than
/// `max_bytes` is refused (the size the walk saw is only a hint: a file may grow).
pub fn hash_file(f: &ScannedFile, max_bytes: u64) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(&f.path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut limited = file.take(max_bytes.saturating_add(1));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = limited
            .read(&mut buf)
            .map_err(|e| format!("cannot read it: {e}"))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        h.update(&buf[..n]);
    }
    if total > max_bytes {
        return Err(TranscriptError::TooLarge {
            path: f.rel.clone(),
            size: total,
            limit: max_bytes,
        }
        .to_string());
    }
    Ok(crate::text::hex(&h.finalize()))
}

/// A file's conversations (checked, not kept: [`transcript::scan`]), each with the base of
/// its session name (see [`crate::naming`]), and what the parser noted.
#[derive(Debug)]
pub struct Named {
    /// (name's base, conversation's outline), in file order.
    pub conversations: Vec<(naming::Base, transcript::Outline)>,
    /// The checked transcript, for the pass that stores it.
    pub scanned: transcript::Scanned,
}

/// Parse a file in the sandbox, a read at a time, and take the bases of its sessions' names;
/// or why it is not taken: `("skipped", NOT_TRANSCRIPT)` (no known format, no messages) or
/// `("failed", why)`.
pub async fn conversations(
    engine: &Abridge,
    f: &ScannedFile,
    input: &mut transcript::Input<'_>,
    o: &BackfillOptions,
) -> Result<Named, (&'static str, String)> {
    let scanned = match transcript::scan(engine, &f.rel, input, None, o.read, o.max_bytes).await {
        Ok(p) => p,
        Err(
            TranscriptError::UnknownFormat { .. }
            | TranscriptError::Empty { .. }
            | TranscriptError::EmptyFile { .. },
        ) => return Err(("skipped", NOT_TRANSCRIPT.into())),
        Err(e) => return Err(("failed", e.to_string())),
    };
    let many = scanned.conversations.len() > 1;
    let conversations = scanned
        .conversations
        .iter()
        .enumerate()
        .map(|(i, conv)| {
            let name = naming::base(conv.id.as_deref(), Path::new(&f.rel), many.then_some(i));
            (name, conv.clone())
        })
        .collect();
    Ok(Named {
        conversations,
        scanned,
    })
}

/// A file opened for the passes over it (refused when over `max_bytes`).
fn input_of(f: &ScannedFile, max_bytes: u64) -> Result<transcript::Input<'_>, FileOutcome> {
    transcript::Input::open(&f.path, max_bytes)
        .map_err(|e| FileOutcome::new("failed", Vec::new(), 0, e.to_string()))
}

/// How to take each file.
#[derive(Clone, Debug)]
pub struct BackfillOptions {
    /// Conversations with fewer episodes are left out.
    pub min_episodes: u64,
    /// Parsing options.
    pub read: Options,
    /// Largest file read.
    pub max_bytes: u64,
}

/// What backfill did with one file.
#[derive(Clone, Debug, PartialEq)]
pub struct FileOutcome {
    /// `ok`, `unchanged`, `skipped` or `failed`.
    pub status: &'static str,
    /// Sessions it produced.
    pub sessions: Vec<String>,
    /// Episodes read from it.
    pub episodes: u64,
    /// Why, in words.
    pub detail: String,
    /// What the parser noted.
    pub warnings: Vec<String>,
}

impl FileOutcome {
    fn new(status: &'static str, sessions: Vec<String>, episodes: u64, detail: String) -> Self {
        FileOutcome {
            status,
            sessions,
            episodes,
            detail,
            warnings: Vec::new(),
        }
    }
}

/// What a file is, before its conversations are read: passed over (unchanged since the last
/// run, or touched with the same content), unreadable, or its bytes and their hash.
enum Opened {
    /// No change since the last run; `touched` when only its time moved.
    Unchanged(FileOutcome, bool),
    /// It could not be read.
    Failed(FileOutcome),
    /// It changed: its content's hash (the file itself is read by the passes that follow).
    Read(String),
}

/// The one rule, for the run and the dry run, for whether a file must be read and parsed.
fn open_file(known: Option<&Source>, f: &ScannedFile, o: &BackfillOptions) -> Opened {
    if let Some(k) = known
        && unchanged(k, f, o.min_episodes)
    {
        return Opened::Unchanged(
            FileOutcome::new(
                "unchanged",
                k.sessions.clone(),
                k.episodes,
                "no change since the last run".into(),
            ),
            false,
        );
    }
    let sha = match hash_file(f, o.max_bytes) {
        Ok(sha) => sha,
        Err(e) => return Opened::Failed(FileOutcome::new("failed", Vec::new(), 0, e)),
    };
    match known {
        Some(k) if k.sha256 == sha && k.status == "ok" => Opened::Unchanged(
            FileOutcome::new(
                "unchanged",
                k.sessions.clone(),
                k.episodes,
                "same content".into(),
            ),
            true,
        ),
        _ => Opened::Read(sha),
    }
}

/// What one conversation of a file would cost to summarize.
#[derive(Clone, Debug)]
pub struct PlannedSession {
    /// Its session.
    pub session: String,
    /// Its episodes.
    pub episodes: u64,
    /// The engine's plan for it (path, calls, tokens in and out).
    pub plan: PlanReport,
}

/// What a dry run finds for one file.
#[derive(Clone, Debug)]
pub struct FilePlan {
    /// As a run would report it, with `planned` in place of `ok`.
    pub outcome: FileOutcome,
    /// The sessions that would be summarized, each with its plan.
    pub sessions: Vec<PlannedSession>,
}

/// A dry run of backfill: what each file would bring and cost, planned on an in-memory copy
/// with no model; what earlier runs recorded is only read.
pub struct DryRun {
    engine: Abridge,
    known: Option<Sources>,
}

impl DryRun {
    /// A dry run on `engine` (its own in-memory store, no model) that passes over what
    /// `known` (an existing database, if any) says is unchanged. Front ends get one from
    /// [`crate::Pure::dry_run`] or [`Scoped::backfill_dry_run`].
    pub(crate) fn new(engine: Abridge, known: Option<Arc<dyn SourceStore>>) -> Self {
        DryRun {
            engine,
            known: known.map(Sources::new),
        }
    }

    /// Plan one file as [`Scoped::backfill_file`] would take it.
    pub async fn plan_file(
        &self,
        f: &ScannedFile,
        o: &BackfillOptions,
        cfg: &Config,
    ) -> AppResult<FilePlan> {
        let known = match &self.known {
            Some(src) => src.get(&f.path.display().to_string()).await?,
            None => None,
        };
        let alone = |outcome| FilePlan {
            outcome,
            sessions: Vec::new(),
        };
        if let Opened::Unchanged(out, _) | Opened::Failed(out) = open_file(known.as_ref(), f, o) {
            return Ok(alone(out));
        }
        let mut input = match input_of(f, o.max_bytes) {
            Ok(i) => i,
            Err(out) => return Ok(alone(out)),
        };
        let named = match conversations(&self.engine, f, &mut input, o).await {
            Ok(n) => n,
            Err((status, why)) => return Ok(alone(FileOutcome::new(status, Vec::new(), 0, why))),
        };
        // The small conversations are left out (an empty name: not stored).
        let sessions: Vec<String> = named
            .conversations
            .iter()
            .map(|(base, conv)| {
                if conv.episodes < o.min_episodes {
                    String::new()
                } else {
                    base.plain()
                }
            })
            .collect();
        transcript::store(
            &self.engine,
            &f.rel,
            &mut input,
            &named.scanned,
            &sessions,
            o.read,
        )
        .await?;
        let mut planned = Vec::new();
        let mut episodes = 0u64;
        for ((_, conv), session) in named.conversations.iter().zip(sessions) {
            episodes += conv.episodes;
            if session.is_empty() {
                continue;
            }
            let plan = self.engine.plan(&session, cfg).await?;
            planned.push(PlannedSession {
                session,
                episodes: conv.episodes,
                plan,
            });
        }
        let names: Vec<String> = planned.iter().map(|p| p.session.clone()).collect();
        let mut outcome = if names.is_empty() {
            FileOutcome::new(
                "skipped",
                names,
                episodes,
                format!("fewer than {} episodes", o.min_episodes),
            )
        } else {
            let detail = format!("{} session(s)", names.len());
            FileOutcome::new("planned", names, episodes, detail)
        };
        outcome.warnings = named.scanned.warnings;
        Ok(FilePlan {
            outcome,
            sessions: planned,
        })
    }
}

impl Scoped {
    /// A dry run of backfill against this app's database: its own in-memory copy and no
    /// model, passing over what the database says is unchanged (and writing nothing to it).
    pub fn backfill_dry_run(&self) -> AppResult<DryRun> {
        let pure = crate::Pure::new(
            self.engine().runtime().clone(),
            self.app.config().log.clone(),
        )?;
        Ok(DryRun::new(pure.engine, Some(self.app.store())))
    }

    /// Bring one file's conversations into their sessions and summarize what is new, each
    /// session through its job (run here). A file unchanged since the last run is passed over
    /// without reading; one touched but with the same content is not parsed again. What was
    /// done is recorded, so the next run knows. A file that fails does so alone: the outcome
    /// says why and its stored episodes stay.
    pub async fn backfill_file(
        &self,
        f: &ScannedFile,
        o: &BackfillOptions,
        cfg: &Config,
    ) -> AppResult<FileOutcome> {
        let sources = Sources::new(self.app.inner.db.clone() as Arc<dyn SourceStore>);
        let key = f.path.display().to_string();
        let known = sources.get(&key).await?;
        let now = self.app.now_ms();
        let record = async |sha: &str,
                            status: &str,
                            sessions: &[String],
                            episodes: u64,
                            detail: Option<&str>| {
            let s = Source {
                path: key.clone(),
                size: f.size,
                mtime_ms: f.mtime_ms,
                sha256: sha.into(),
                status: status.into(),
                sessions: sessions.to_vec(),
                episodes,
                detail: detail.map(str::to_string),
            };
            sources.put(&s, now).await
        };
        let sha = match open_file(known.as_ref(), f, o) {
            Opened::Unchanged(out, touched) => {
                if touched && let Some(k) = &known {
                    // Touched but not changed: remember the new time, do nothing else.
                    record(&k.sha256, "ok", &k.sessions, k.episodes, None).await?;
                }
                return Ok(out);
            }
            Opened::Failed(out) => return Ok(out),
            Opened::Read(sha) => sha,
        };
        let input = match input_of(f, o.max_bytes) {
            Ok(i) => i,
            Err(out) => {
                record(&sha, "failed", &[], 0, Some(&out.detail)).await?;
                return Ok(out);
            }
        };
        let req = ImportRequest {
            format: None,
            file: Some(&f.path),
            reach: Some(f.size),
            opts: o.read,
            min_episodes: o.min_episodes,
            max_bytes: o.max_bytes,
            ..ImportRequest::new(&f.rel, input)
        };
        let done = match self.import(req, Bring::Now(cfg)).await {
            Ok(done) => done,
            Err(ImportError::Read(e)) => {
                let (status, why) = match e {
                    TranscriptError::UnknownFormat { .. }
                    | TranscriptError::Empty { .. }
                    | TranscriptError::EmptyFile { .. } => ("skipped", NOT_TRANSCRIPT.to_string()),
                    e => ("failed", e.to_string()),
                };
                record(&sha, status, &[], 0, Some(&why)).await?;
                return Ok(FileOutcome::new(status, Vec::new(), 0, why));
            }
            Err(ImportError::App(e)) => return Err(e),
        };
        let sessions: Vec<String> = done
            .conversations
            .iter()
            .map(|c| c.session.clone())
            .collect();
        let failure = done.conversations.iter().find_map(|c| {
            c.failure.as_ref().map(|e| {
                format!(
                    "session {}: {} ({} new episodes stored)",
                    c.session, e.message, c.added
                )
            })
        });
        let (episodes, small) = (done.episodes, done.small);
        let mut out = match failure {
            Some(why) => {
                record(&sha, "failed", &sessions, episodes, Some(&why)).await?;
                FileOutcome::new("failed", sessions, episodes, why)
            }
            None if sessions.is_empty() => {
                record(&sha, "skipped", &[], episodes, Some("too few episodes")).await?;
                FileOutcome::new(
                    "skipped",
                    Vec::new(),
                    episodes,
                    format!("fewer than {} episodes", o.min_episodes),
                )
            }
            None => {
                record(&sha, "ok", &sessions, episodes, None).await?;
                let detail = if small > 0 {
                    format!("summarized; {small} small conversation(s) skipped")
                } else {
                    "summarized".into()
                };
                FileOutcome::new("ok", sessions, episodes, detail)
            }
        };
        out.warnings = done.warnings;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_ages() {
        assert!(glob("*proj*", "a/myproject/x.jsonl"));
        assert!(glob("a/?/*.jsonl", "a/b/c.jsonl"));
        assert!(!glob("*.json", "a/b.jsonl"));
        assert!(matches("proj", "a/myproject/x.jsonl") && !matches("zzz", "a/b"));
        let now = 10 * 86_400_000;
        assert_eq!(since_ms("2d", now), Ok(8 * 86_400_000));
        assert_eq!(since_ms("90m", now), Ok(now - 90 * 60_000));
        assert_eq!(since_ms("1970-01-02", now), Ok(86_400_000));
        assert_eq!(since_ms("1970-01-02T01:00:00", now), Ok(90_000_000));
        assert_eq!(since_ms("1970-01-02T02:00:00+01:00", now), Ok(90_000_000));
        assert!(since_ms("yesterday", now).is_err());
    }
}
