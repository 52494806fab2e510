-- 10: per-session overrides of when automatic refreshes summarize (else the global setting).
CREATE TABLE session_modes (
    session TEXT PRIMARY KEY,
    mode TEXT NOT NULL CHECK (mode IN ('eager','idle')),
    quiescence_secs INTEGER
);
