//! What the app keeps about files and sessions besides their episodes: transcript files
//! already imported (by `abridge backfill`: size, modification time, content hash and outcome,
//! so a re-run passes over unchanged files without reading them), files followed by
//! `abridge watch`, how far summaries reach into their files, and per-session modes. The rows
//! live in any [`SourceStore`].

use std::sync::Arc;

use crate::types::Error;
use abridge_store::SourceStore;
pub use abridge_store::sources::{Mark, SessionMode, Source, WatchedFile};

/// Imported files of a store.
#[derive(Clone)]
pub struct Sources {
    db: Arc<dyn SourceStore>,
}

impl Sources {
    /// Sources recorded in `db`.
    pub fn new(db: Arc<dyn SourceStore>) -> Self {
        Sources { db }
    }

    /// What is recorded for `path`.
    pub async fn get(&self, path: &str) -> Result<Option<Source>, Error> {
        self.db.source(path).await
    }

    /// Record (or replace) what is known of a file.
    pub async fn put(&self, s: &Source, now_ms: u64) -> Result<(), Error> {
        self.db.put_source(s, now_ms).await
    }
}

/// Watched files of a store.
#[derive(Clone)]
pub struct Watched {
    db: Arc<dyn SourceStore>,
}

impl Watched {
    /// Watched files recorded in `db`.
    pub fn new(db: Arc<dyn SourceStore>) -> Self {
        Watched { db }
    }

    /// Every recorded file.
    pub async fn all(&self) -> Result<Vec<WatchedFile>, Error> {
        self.db.watched_files().await
    }

    /// Record a file's state.
    pub async fn put(&self, f: &WatchedFile, now_ms: u64) -> Result<(), Error> {
        self.db.put_watched(f, now_ms).await
    }
}

/// `cfg` with a session's own mode (if any) applied.
pub fn with_mode(cfg: &crate::types::Config, m: Option<&SessionMode>) -> crate::types::Config {
    let mut c = cfg.clone();
    if let Some(m) = m {
        c.mode = m.mode;
        if let Some(q) = m.quiescence_secs {
            c.quiescence_secs = q;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    fn stores() -> Vec<(&'static str, Arc<dyn SourceStore>)> {
        vec![("sqlite", Arc::new(SqliteStore::in_memory().unwrap()))]
    }

    #[tokio::test]
    async fn sources_watched_files_marks_and_modes_round_trip_in_every_store() {
        for (name, db) in stores() {
            let src = Sources::new(db.clone());
            assert_eq!(src.get("/a").await.unwrap(), None, "{name}");
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
            src.put(&s, 1).await.unwrap();
            assert_eq!(src.get("/a").await.unwrap(), Some(s.clone()), "{name}");
            let t = Source {
                status: "failed".into(),
                detail: Some("why".into()),
                ..s
            };
            src.put(&t, 2).await.unwrap();
            assert_eq!(src.get("/a").await.unwrap(), Some(t), "{name}");

            let w = Watched::new(db.clone());
            let f = WatchedFile {
                path: "/w/b.jsonl".into(),
                session: Some("b".into()),
                format: Some("jsonl".into()),
                offset: 100,
                lines: Some(4),
            };
            w.put(&f, 1).await.unwrap();
            w.put(
                &WatchedFile {
                    offset: 200,
                    ..f.clone()
                },
                2,
            )
            .await
            .unwrap();
            assert_eq!(
                w.all().await.unwrap(),
                vec![WatchedFile { offset: 200, ..f }],
                "{name}"
            );

            db.record_mark("x", "/a", 3, 10).await.unwrap();
            db.record_mark("x", "/a", 7, 25).await.unwrap();
            let at = |e| {
                let db = db.clone();
                async move { db.mark_covering("x", e).await.unwrap().map(|m| m.bytes) }
            };
            assert_eq!(
                (at(2).await, at(5).await, at(9).await),
                (None, Some(10), Some(25)),
                "{name}"
            );

            let idle = SessionMode {
                mode: crate::types::Mode::Idle,
                quiescence_secs: Some(5),
            };
            db.set_session_mode("x", Some(&idle)).await.unwrap();
            let own = db.session_mode("x").await.unwrap();
            let cfg = with_mode(&crate::types::Config::default(), own.as_ref());
            assert_eq!(
                (cfg.mode, cfg.quiescence_secs),
                (crate::types::Mode::Idle, 5),
                "{name}"
            );
            db.set_session_mode("x", None).await.unwrap();
            assert_eq!(db.session_mode("x").await.unwrap(), None, "{name}");
        }
    }
}
