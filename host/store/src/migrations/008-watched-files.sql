-- 8: transcript files followed by `abridge watch`: how far each has been imported.
CREATE TABLE watched_files (
    path TEXT PRIMARY KEY,
    session TEXT,
    format TEXT,
    offset INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
