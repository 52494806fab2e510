-- 13: full-text search of every message (issue #40; SQLite's migration 34 says what the
-- columns hold). A GIN index over the `simple` tsvector of the hashed terms.
CREATE TABLE IF NOT EXISTS episode_terms (
    doc BIGSERIAL PRIMARY KEY,
    session TEXT NOT NULL,
    episode BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    terms TEXT NOT NULL,
    length BIGINT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS episode_terms_episode ON episode_terms (session, episode);
CREATE INDEX IF NOT EXISTS episode_terms_fts ON episode_terms USING gin (to_tsvector('simple', terms));
CREATE TABLE IF NOT EXISTS search_totals (
    tenant TEXT PRIMARY KEY,
    docs BIGINT NOT NULL,
    length BIGINT NOT NULL
);
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS indexed BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS sessions_unindexed ON sessions (id) WHERE indexed = 0;
