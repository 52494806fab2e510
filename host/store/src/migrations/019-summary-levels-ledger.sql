-- 19: summaries that do not drift. Compacted rows leave the active chain (compacted_into)
-- but are never deleted; level 0 rows summarize episodes, level n + 1 rows fold rows of level
-- n or less. Each row carries its facts ledger as JSON [{"t","k","e","c"}, ...] and how many
-- entries its budget dropped. Sessions get a focus, pinned episodes and the window mode.
ALTER TABLE summaries ADD COLUMN level INTEGER NOT NULL DEFAULT 0;
ALTER TABLE summaries ADD COLUMN compacted_into INTEGER;
ALTER TABLE summaries ADD COLUMN ledger TEXT NOT NULL DEFAULT '[]';
ALTER TABLE summaries ADD COLUMN ledger_dropped INTEGER NOT NULL DEFAULT 0;
CREATE INDEX summaries_active ON summaries(session, compacted_into, last_episode);
CREATE TABLE session_modes_019 (
    session TEXT PRIMARY KEY,
    mode TEXT NOT NULL CHECK (mode IN ('eager','idle','window')),
    quiescence_secs INTEGER
);
INSERT INTO session_modes_019 (session, mode, quiescence_secs)
    SELECT session, mode, quiescence_secs FROM session_modes;
DROP TABLE session_modes;
ALTER TABLE session_modes_019 RENAME TO session_modes;
CREATE TABLE session_focus (
    session TEXT PRIMARY KEY,
    focus TEXT NOT NULL
);
CREATE TABLE session_pins (
    session TEXT NOT NULL,
    episode INTEGER NOT NULL,
    PRIMARY KEY (session, episode)
) WITHOUT ROWID;
