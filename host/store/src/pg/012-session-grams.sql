-- 12: a search of a tenant's sessions (`?q=`) reads an index, not every session (issue #26;
-- SQLite migration 31). Each session's trigrams as keyed hashes; `grams` is 0 for a session
-- not yet in the index (new, or renamed since): the next search adds it.
CREATE TABLE session_grams (
    tenant TEXT NOT NULL,
    gram BIGINT NOT NULL,
    session TEXT NOT NULL,
    PRIMARY KEY (tenant, gram, session)
);
CREATE INDEX session_grams_session ON session_grams (session);
ALTER TABLE sessions ADD COLUMN grams BIGINT NOT NULL DEFAULT 0;
CREATE INDEX sessions_ungrammed ON sessions (tenant) WHERE grams = 0;
