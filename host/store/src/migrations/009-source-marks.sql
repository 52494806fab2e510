-- 9: how far into a transcript file a session's episodes reach: after importing the file up to
-- `bytes`, the session's newest episode was `last_episode`. A summary covering that episode
-- has consumed those bytes.
CREATE TABLE source_marks (
    session TEXT NOT NULL,
    path TEXT NOT NULL,
    last_episode INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (session, path, last_episode)
) WITHOUT ROWID;
