-- API tokens for `abridge serve`: only a SHA-256 hash of each token is kept; the token itself
-- is printed once when created.
CREATE TABLE tokens (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    read_only INTEGER NOT NULL DEFAULT 0,
    label TEXT,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
);
CREATE INDEX tokens_tenant ON tokens (tenant);
