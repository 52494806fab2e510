-- 6: transcript files imported by `abridge backfill`, so unchanged files are passed over.
CREATE TABLE sources (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ms INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    sessions TEXT NOT NULL,
    episodes INTEGER NOT NULL,
    detail TEXT,
    updated_ms INTEGER NOT NULL
);
