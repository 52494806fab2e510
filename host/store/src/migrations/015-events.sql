-- The event log of `abridge serve` (job states, progress, summaries written), so event ids
-- keep increasing across restarts and a client reconnecting with Last-Event-ID misses
-- nothing still retained. Ids are dense per tenant; only the newest events are kept.
CREATE TABLE events (
    tenant TEXT NOT NULL,
    id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    session_key TEXT,
    job INTEGER,
    data TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
CREATE INDEX events_session ON events (session_key);
