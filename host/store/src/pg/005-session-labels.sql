-- A session's display names (see the SQLite store's migration 023), sealed like the focus.
CREATE TABLE session_labels (
    session TEXT PRIMARY KEY,
    label BYTEA NOT NULL,
    sealed BIGINT NOT NULL DEFAULT 0
);
