-- 5: durable summarization jobs. One active job (queued or running) per idempotency key,
-- which names the session and the coverage target (its last episode id).
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    target INTEGER NOT NULL,
    key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed','cancelled')),
    config TEXT NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    level INTEGER NOT NULL DEFAULT 0,
    done INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL DEFAULT 0,
    calls_planned INTEGER NOT NULL DEFAULT 0,
    answers INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    lease_owner TEXT,
    lease_until_ms INTEGER,
    created_ms INTEGER NOT NULL,
    started_ms INTEGER,
    updated_ms INTEGER NOT NULL,
    finished_ms INTEGER
);
CREATE UNIQUE INDEX jobs_active_key ON jobs(key) WHERE state IN ('queued','running');
CREATE INDEX jobs_session ON jobs(session, id);
