//! Records of what the app keeps about files and sessions besides their episodes: transcript
//! files already imported, files followed by `abridge watch`, how far summaries reach into
//! their files, and per-session modes. They are stored through [`crate::SourceStore`].

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

/// A session's own refresh mode, overriding the global setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionMode {
    /// `eager` or `idle`.
    pub mode: abridge_engine::types::Mode,
    /// Idle mode's quiet window for this session, if not the global one.
    pub quiescence_secs: Option<u32>,
}
