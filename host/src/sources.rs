//! Transcript files already imported (by `abridge backfill`): their size, modification time,
//! content hash and outcome, so a re-run passes over unchanged files without reading them.

use std::sync::Arc;

use rusqlite::{OptionalExtension, params};

use crate::store::SqliteStore;
use crate::types::Error;

/// What is known of one file.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// The file's path, as given (absolute paths are stable across working directories).
    pub path: String,
    /// Size in bytes when last processed.
    pub size: u64,
    /// Modification time, ms since the epoch.
    pub mtime_ms: u64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
    /// `ok`, `skipped` or `failed`.
    pub status: String,
    /// Sessions the file produced.
    pub sessions: Vec<String>,
    /// Episodes read from it.
    pub episodes: u64,
    /// Why it was skipped or failed.
    pub detail: Option<String>,
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Storage(e.to_string())
}

/// The `sources` table of a SQLite database.
#[derive(Clone)]
pub struct Sources {
    db: Arc<SqliteStore>,
}

impl Sources {
    /// Sources recorded in `db`.
    pub fn new(db: Arc<SqliteStore>) -> Self {
        Sources { db }
    }

    /// What is recorded for `path`.
    pub fn get(&self, path: &str) -> Result<Option<Source>, Error> {
        self.db.with(|c| {
            c.query_row(
                "SELECT path, size, mtime_ms, sha256, status, sessions, episodes, detail FROM sources WHERE path = ?1",
                [path],
                |r| {
                    Ok(Source {
                        path: r.get(0)?,
                        size: r.get::<_, i64>(1)? as u64,
                        mtime_ms: r.get::<_, i64>(2)? as u64,
                        sha256: r.get(3)?,
                        status: r.get(4)?,
                        sessions: serde_json::from_str(&r.get::<_, String>(5)?)
                            .unwrap_or_default(),
                        episodes: r.get::<_, i64>(6)? as u64,
                        detail: r.get(7)?,
                    })
                },
            )
            .optional()
            .map_err(db_err)
        })
    }

    /// Record (or replace) what is known of a file.
    pub fn put(&self, s: &Source, now_ms: u64) -> Result<(), Error> {
        self.db.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO sources (path, size, mtime_ms, sha256, status, sessions, episodes, detail, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    s.path,
                    s.size as i64,
                    s.mtime_ms as i64,
                    s.sha256,
                    s.status,
                    serde_json::to_string(&s.sessions).expect("strings serialize"),
                    s.episodes as i64,
                    s.detail,
                    now_ms as i64
                ],
            )
            .map(drop)
            .map_err(db_err)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let src = Sources::new(Arc::new(SqliteStore::in_memory().unwrap()));
        assert_eq!(src.get("/a").unwrap(), None);
        let s = Source {
            path: "/a".into(),
            size: 10,
            mtime_ms: 5,
            sha256: "ab".into(),
            status: "ok".into(),
            sessions: vec!["x".into()],
            episodes: 3,
            detail: None,
        };
        src.put(&s, 1).unwrap();
        assert_eq!(src.get("/a").unwrap(), Some(s.clone()));
        let t = Source {
            status: "failed".into(),
            detail: Some("why".into()),
            ..s
        };
        src.put(&t, 2).unwrap();
        assert_eq!(src.get("/a").unwrap(), Some(t));
    }
}

/// A file followed by `abridge watch`: how far it has been imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchedFile {
    /// The file's path.
    pub path: String,
    /// The session its lines go to, once known.
    pub session: Option<String>,
    /// Its format (`jsonl`, `claude-code`), once known.
    pub format: Option<String>,
    /// Bytes imported: the end of the last complete line read.
    pub offset: u64,
    /// Lines before `offset` (`None` for a record written before this was kept: counted
    /// again on the next read).
    pub lines: Option<u64>,
}

/// The `watched_files` table of a SQLite database.
#[derive(Clone)]
pub struct Watched {
    db: Arc<SqliteStore>,
}

impl Watched {
    /// Watched files recorded in `db`.
    pub fn new(db: Arc<SqliteStore>) -> Self {
        Watched { db }
    }

    /// Every recorded file.
    pub fn all(&self) -> Result<Vec<WatchedFile>, Error> {
        self.db.with(|c| {
            let mut st = c
                .prepare(
                    "SELECT path, session, format, offset, lines FROM watched_files ORDER BY path",
                )
                .map_err(db_err)?;
            st.query_map([], |r| {
                Ok(WatchedFile {
                    path: r.get(0)?,
                    session: r.get(1)?,
                    format: r.get(2)?,
                    offset: r.get::<_, i64>(3)? as u64,
                    lines: r.get::<_, Option<i64>>(4)?.map(|n| n as u64),
                })
            })
            .map_err(db_err)?
            .collect::<Result<_, _>>()
            .map_err(db_err)
        })
    }

    /// Record a file's state.
    pub fn put(&self, f: &WatchedFile, now_ms: u64) -> Result<(), Error> {
        self.db.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO watched_files (path, session, format, offset, lines, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![f.path, f.session, f.format, f.offset as i64, f.lines.map(|n| n as i64), now_ms as i64],
            )
            .map(drop)
            .map_err(db_err)
        })
    }
}

/// Where a summary's coverage reaches in a transcript file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The file.
    pub path: String,
    /// The session's newest episode after importing it up to `bytes`.
    pub last_episode: u64,
    /// Bytes of the file imported.
    pub bytes: u64,
}

/// The `source_marks` table: byte lengths of transcript files against episode ids.
#[derive(Clone)]
pub struct Marks {
    db: Arc<SqliteStore>,
}

impl Marks {
    /// Marks recorded in `db`.
    pub fn new(db: Arc<SqliteStore>) -> Self {
        Marks { db }
    }

    /// After importing `path` up to `bytes`, the session's newest episode is `last_episode`.
    pub fn record(
        &self,
        session: &str,
        path: &str,
        last_episode: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        self.db.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO source_marks (session, path, last_episode, bytes) VALUES (?1, ?2, ?3, ?4)",
                params![session, path, last_episode as i64, bytes as i64],
            )
            .map(drop)
            .map_err(db_err)
        })
    }

    /// How far a summary that covers episodes up to `last_episode` reaches into its source:
    /// the furthest mark at or before that episode.
    pub fn covered(&self, session: &str, last_episode: u64) -> Result<Option<Mark>, Error> {
        self.db.with(|c| {
            c.query_row(
                "SELECT path, last_episode, bytes FROM source_marks WHERE session = ?1 AND last_episode <= ?2 ORDER BY last_episode DESC, bytes DESC LIMIT 1",
                params![session, last_episode as i64],
                |r| {
                    Ok(Mark {
                        path: r.get(0)?,
                        last_episode: r.get::<_, i64>(1)? as u64,
                        bytes: r.get::<_, i64>(2)? as u64,
                    })
                },
            )
            .optional()
            .map_err(db_err)
        })
    }
}

/// A session's own refresh mode, overriding the global setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionMode {
    /// `eager` or `idle`.
    pub mode: crate::types::Mode,
    /// Idle mode's quiet window for this session, if not the global one.
    pub quiescence_secs: Option<u32>,
}

/// The `session_modes` table.
#[derive(Clone)]
pub struct SessionModes {
    db: Arc<SqliteStore>,
}

impl SessionModes {
    /// Per-session modes recorded in `db`.
    pub fn new(db: Arc<SqliteStore>) -> Self {
        SessionModes { db }
    }

    /// The session's own mode, if it has one.
    pub fn get(&self, session: &str) -> Result<Option<SessionMode>, Error> {
        self.db.with(|c| {
            c.query_row(
                "SELECT mode, quiescence_secs FROM session_modes WHERE session = ?1",
                [session],
                |r| {
                    Ok(SessionMode {
                        mode: if r.get::<_, String>(0)? == "idle" {
                            crate::types::Mode::Idle
                        } else {
                            crate::types::Mode::Eager
                        },
                        quiescence_secs: r.get::<_, Option<i64>>(1)?.map(|x| x as u32),
                    })
                },
            )
            .optional()
            .map_err(db_err)
        })
    }

    /// Set (`Some`) or clear (`None`) the session's own mode.
    pub fn set(&self, session: &str, m: Option<&SessionMode>) -> Result<(), Error> {
        self.db.with(|c| {
            match m {
                None => c.execute("DELETE FROM session_modes WHERE session = ?1", [session]),
                Some(m) => c.execute(
                    "INSERT OR REPLACE INTO session_modes (session, mode, quiescence_secs) VALUES (?1, ?2, ?3)",
                    params![
                        session,
                        match m.mode {
                            crate::types::Mode::Eager => "eager",
                            crate::types::Mode::Idle => "idle",
                        },
                        m.quiescence_secs
                    ],
                ),
            }
            .map(drop)
            .map_err(db_err)
        })
    }

    /// `cfg` with the session's own mode applied.
    pub fn apply(
        &self,
        session: &str,
        cfg: &crate::types::Config,
    ) -> Result<crate::types::Config, Error> {
        let mut c = cfg.clone();
        if let Some(m) = self.get(session)? {
            c.mode = m.mode;
            if let Some(q) = m.quiescence_secs {
                c.quiescence_secs = q;
            }
        }
        Ok(c)
    }
}
