-- 31: a search of a tenant's sessions (`?q=`) reads an index, not every session (issue #26).
-- Each session's trigrams (of its id and its names, lowercased) as keyed hashes: with a master
-- key the key comes from the tenant's data key, so the index says nothing of sealed names
-- without it. A search looks up the rarest of its query's trigrams and checks the few sessions
-- holding them all. `grams` is 0 for a session not yet in the index (new, or renamed since):
-- the next search adds it.
CREATE TABLE session_grams (
    tenant TEXT NOT NULL,
    gram INTEGER NOT NULL,
    session TEXT NOT NULL,
    PRIMARY KEY (tenant, gram, session)
) WITHOUT ROWID;
CREATE INDEX session_grams_session ON session_grams (session);
ALTER TABLE sessions ADD COLUMN grams INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_ungrammed ON sessions (tenant) WHERE grams = 0;
