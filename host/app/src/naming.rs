//! The one rule that names a session, for every entry point (`summarize`, `backfill`,
//! `watch`, `abridge hook`, `POST /v1/transcripts`), and the one rule that finds a session
//! from what a user typed (an id, or a unique prefix of one).
//!
//! A conversation that carries an id of its own (Claude Code's `sessionId`, which is also
//! its file's name; a ChatGPT conversation id; a Codex session id) is that id. Otherwise the
//! session is the file's name without its extension (`-N` for the N-th of several
//! conversations), wherever the file was found from: `summarize dir/notes.jsonl` and
//! `backfill dir` name it alike. Folders are not part of the id (a project folder is a
//! display name). When that name already belongs to a session imported from a *different*
//! file, the file's name gets a short, stable suffix from its canonical path
//! (`notes-3fa2c1`), so two `notes.jsonl` in two folders stay two sessions, and the same file
//! keeps its name from every entry point.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::{AppError, AppResult, Scoped};

/// What a conversation's name is made of before the store is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Base {
    /// The conversation's own id: final.
    Own(String),
    /// The file's stem (and the conversation's index among several), which another file may
    /// already hold.
    Stem(String, Option<usize>),
}

impl Base {
    /// The name with nothing added.
    pub fn plain(&self) -> String {
        match self {
            Base::Own(id) => id.clone(),
            Base::Stem(stem, index) => numbered(stem, *index),
        }
    }
}

fn numbered(stem: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("{stem}-{}", i + 1),
        None => stem.to_string(),
    }
}

/// The base of a conversation's name: its own id when it has one, else the file's name
/// without its extension (`stdin` for standard input, `-`). Control characters become `_`
/// (see [`crate::text::session_id_from`]).
pub fn base(conv_id: Option<&str>, file: &Path, index: Option<usize>) -> Base {
    if let Some(id) = conv_id.and_then(crate::text::session_id_from) {
        return Base::Own(id);
    }
    let stem = if file.as_os_str() == "-" {
        "stdin".to_string()
    } else {
        file.file_stem()
            .and_then(|s| crate::text::session_id_from(&s.to_string_lossy()))
            .unwrap_or_else(|| "session".into())
    };
    Base::Stem(stem, index)
}

/// The stem with the suffix that sets a file apart from another file of the same name: six
/// hex digits of the SHA-256 of its canonical path.
pub fn set_apart(stem: &str, index: Option<usize>, canonical: &str) -> String {
    let h = Sha256::digest(canonical.as_bytes());
    let tag: String = h[..3].iter().map(|b| format!("{b:02x}")).collect();
    numbered(&format!("{stem}-{tag}"), index)
}

/// The path a file is known by: canonical where it can be resolved.
pub fn file_key(file: &Path) -> String {
    std::fs::canonicalize(file)
        .unwrap_or_else(|_| file.to_path_buf())
        .display()
        .to_string()
}

/// A session [`Scoped::search_sessions`] found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SessionHit {
    /// Its id.
    pub session: String,
    /// Episodes stored.
    pub episodes: u64,
    /// Episodes its summary covers.
    pub covered: u64,
    /// What matched, in a line.
    pub matched: String,
}

/// The project folder a transcript file lies in (its parent folder's name: a Claude Code
/// project's encoded path, a repository's folder), if any.
pub fn project_of(file: &Path) -> Option<String> {
    if file.as_os_str() == "-" {
        return None;
    }
    let canonical = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    canonical
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
}

/// How many candidates an ambiguous prefix lists.
const LISTED: usize = 5;

impl Scoped {
    /// The session a conversation goes to (see the module's rule): `base` of it, set apart
    /// when its plain name belongs to a session imported from another file. `file` is the path
    /// on disk it was read from; `None` when there is no file to set it apart by (standard
    /// input, an upload that has only a name).
    pub async fn session_for(&self, b: &Base, file: Option<&Path>) -> AppResult<String> {
        let plain = b.plain();
        let (Base::Stem(stem, index), Some(file)) = (b, file) else {
            return Ok(plain);
        };
        if file.as_os_str() == "-" {
            return Ok(plain);
        }
        let key = file_key(file);
        // Held by another file: the newest mark of the plain name names a different path.
        let holder = self
            .tables
            .mark_covering(&plain, i64::MAX as u64)
            .await?
            .map(|m| m.path);
        match holder {
            Some(p) if p != key => Ok(set_apart(stem, *index, &key)),
            _ => Ok(plain),
        }
    }

    /// Record a session's display names: the conversation's `title` and the project folder
    /// of `file` (each kept when the new one is absent).
    pub async fn label_session(
        &self,
        session: &str,
        title: Option<&str>,
        file: Option<&Path>,
    ) -> AppResult<()> {
        let project = file.and_then(project_of);
        let title = title.map(str::trim).filter(|t| !t.is_empty());
        if title.is_none() && project.is_none() {
            return Ok(());
        }
        let (old_title, old_project) = self.label(session).await?;
        let new_title = title
            .map(|t| t.chars().take(300).collect::<String>())
            .or(old_title.clone());
        let new_project = project.or(old_project.clone());
        if (new_title.as_ref(), new_project.as_ref()) == (old_title.as_ref(), old_project.as_ref())
        {
            return Ok(());
        }
        self.set_label(session, new_title.as_deref(), new_project.as_deref())
            .await
    }

    /// Store a session's display names as they are kept (JSON `{"title", "project"}`).
    pub(crate) async fn set_label(
        &self,
        session: &str,
        title: Option<&str>,
        project: Option<&str>,
    ) -> AppResult<()> {
        let json = serde_json::json!({"title": title, "project": project}).to_string();
        Ok(self.tables.set_session_label(session, Some(&json)).await?)
    }

    /// A session's display names: (title, project folder).
    pub async fn label(&self, session: &str) -> AppResult<(Option<String>, Option<String>)> {
        Ok(parse_label(
            self.tables.session_label(session).await?.as_deref(),
        ))
    }

    /// The session a user means by `name`: the session of that id, else the one session whose
    /// id starts with it. None is [`crate::ErrorKind::NotFound`]; several are an invalid
    /// argument that lists them.
    pub async fn resolve(&self, name: &str) -> AppResult<String> {
        super::check_session(name)?;
        if self.store().stats(name).await?.episodes > 0 {
            return Ok(name.to_string());
        }
        // The sessions whose id starts with it, from a key range (never every session).
        let (mut hits, n) = self.tables.sessions_prefixed(name, LISTED as u32).await?;
        match n {
            0 => {
                let recent = self.tables.sessions_page(0, LISTED as u32).await?;
                let hint = if recent.is_empty() {
                    "there are no sessions yet".to_string()
                } else {
                    format!("known sessions: {}", recent.join(", "))
                };
                Err(AppError::not_found(format!("no session '{name}'")).hint(hint))
            }
            1 => Ok(hits.remove(0)),
            n => {
                let shown: Vec<&str> = hits.iter().map(String::as_str).collect();
                let more = if n > LISTED as u64 {
                    format!(" and {} more", n - LISTED as u64)
                } else {
                    String::new()
                };
                Err(AppError::invalid(format!(
                    "'{name}' is the start of {n} sessions ({}{more})",
                    shown.join(", ")
                ))
                .hint("give more of the session's id"))
            }
        }
    }

    /// Sessions that match `query` (words, all of them, ignoring case) in their id, their
    /// summary, or their ledger and digest (file paths, commands, requests), most recently
    /// changed first, at most `limit`: each with the line that matched.
    pub async fn search_sessions(&self, query: &str, limit: usize) -> AppResult<Vec<SessionHit>> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        if words.is_empty() {
            return Err(AppError::invalid(
                "the query is empty; give words to look for (an id, a file path, a topic)",
            ));
        }
        let all = |text: &str| {
            let t = text.to_lowercase();
            words.iter().all(|w| t.contains(w.as_str()))
        };
        let mut out = Vec::new();
        for session in self.session_ids().await? {
            if out.len() >= limit {
                break;
            }
            let rows = self.store().summaries(&session).await?;
            let stats = self.store().stats(&session).await?;
            let (title, project) = self.label(&session).await?;
            let named = format!(
                "{session} {} {}",
                title.as_deref().unwrap_or(""),
                project.as_deref().unwrap_or("")
            );
            let mut matched = if all(&named) {
                Some(format!(
                    "id {session}{}{}",
                    title
                        .map(|t| format!(", title \"{t}\""))
                        .unwrap_or_default(),
                    project
                        .map(|p| format!(", project {p}"))
                        .unwrap_or_default()
                ))
            } else {
                None
            };
            for r in rows.iter().rev() {
                if matched.is_some() {
                    break;
                }
                if let Some(e) = r.ledger.iter().find(|e| all(&e.text)) {
                    matched = Some(format!("{} (#{}): {}", e.kind.as_str(), e.episode, e.text));
                } else if all(&r.content) {
                    let line = r
                        .content
                        .lines()
                        .find(|l| words.iter().any(|w| l.to_lowercase().contains(w.as_str())))
                        .unwrap_or(&r.content);
                    matched = Some(format!(
                        "summary of {}-{}: {line}",
                        r.first_episode, r.last_episode
                    ));
                }
            }
            if let Some(m) = matched {
                out.push(SessionHit {
                    session,
                    episodes: stats.episodes,
                    covered: rows.last().map_or(0, |r| r.last_episode),
                    matched: m.chars().take(400).collect(),
                });
            }
        }
        Ok(out)
    }

    /// [`Scoped::resolve`], or `name` itself when no session matches (for commands that
    /// may create the session they name).
    pub async fn resolve_or_new(&self, name: &str) -> AppResult<String> {
        match self.resolve(name).await {
            Ok(s) => Ok(s),
            Err(e) if matches!(e.kind, crate::ErrorKind::NotFound) => Ok(name.to_string()),
            Err(e) => Err(e),
        }
    }
}

/// Display names as stored (JSON `{"title", "project"}`): (title, project folder).
pub(crate) fn parse_label(json: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(json) = json else {
        return (None, None);
    };
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    (field("title"), field("project"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases() {
        let p = Path::new;
        assert_eq!(
            base(Some("abc"), p("x/y.jsonl"), None),
            Base::Own("abc".into())
        );
        assert_eq!(base(None, p("p1/notes.jsonl"), None).plain(), "notes");
        assert_eq!(base(None, p("notes.json"), Some(1)).plain(), "notes-2");
        assert_eq!(base(None, p("-"), None).plain(), "stdin");
        assert_eq!(base(Some("\0\u{1b}"), p("a.jsonl"), None).plain(), "a");
        let a = set_apart("notes", None, "/a/notes.jsonl");
        assert_eq!(a, set_apart("notes", None, "/a/notes.jsonl"));
        assert_ne!(a, set_apart("notes", None, "/b/notes.jsonl"));
        assert!(a.starts_with("notes-") && a.len() == "notes-".len() + 6);
        assert!(set_apart("notes", Some(0), "/a").ends_with("-1"));
    }
}
