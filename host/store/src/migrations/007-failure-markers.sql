-- 7: why automatic refreshes of a session are held back (its last refresh failed).
CREATE TABLE failure_markers (
    session TEXT PRIMARY KEY,
    failures INTEGER NOT NULL,
    last_error TEXT NOT NULL,
    retry_after_ms INTEGER NOT NULL,
    failed_ms INTEGER NOT NULL
);
