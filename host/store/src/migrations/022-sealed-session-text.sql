-- Session text sealed at rest like memories (016): with a master key, episode content and
-- speakers, summary prose and ledgers, cached partial answers, event data and focus text are
-- stored as sealed BLOBs in their (TEXT-declared) columns; `sealed` is the data key's
-- version, 0 for plaintext rows (written without a master key, or before this migration).
-- A row's associated data names it (see keyring::place), so sealed text cannot be moved to
-- another row unnoticed.
ALTER TABLE episodes ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE summaries ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE partials ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE session_focus ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0;
