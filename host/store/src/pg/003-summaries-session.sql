-- The index SQLite has had since its first migration (summaries by session, in episode
-- order), which the PostgreSQL schema lacked: the schema test (tests/schema.rs) found it.
CREATE INDEX IF NOT EXISTS summaries_session ON summaries(session, last_episode);
