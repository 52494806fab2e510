-- 1: sessions, episodes, and the summary chain.
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    episodes INTEGER NOT NULL DEFAULT 0,
    total_tokens INTEGER NOT NULL DEFAULT 0,
    changed_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE episodes (
    session TEXT NOT NULL REFERENCES sessions(id),
    id INTEGER NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('system','user','assistant','tool')),
    content TEXT NOT NULL,
    timestamp_ms INTEGER,
    source_key TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (session, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX episodes_source ON episodes(session, source_key);
CREATE TABLE summaries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL REFERENCES sessions(id),
    first_episode INTEGER NOT NULL,
    last_episode INTEGER NOT NULL,
    content TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    model TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    CHECK (last_episode >= first_episode)
);
CREATE INDEX summaries_session ON summaries(session, last_episode);
