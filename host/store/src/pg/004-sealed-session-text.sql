-- Session text sealed at rest (SQLite migration 022): the columns that hold user text become
-- BYTEA (plain rows keep their UTF-8 bytes) and gain `sealed`, the data key's version, 0 for
-- plaintext.
ALTER TABLE episodes
    ALTER COLUMN content TYPE BYTEA USING convert_to(content, 'UTF8'),
    ALTER COLUMN speaker TYPE BYTEA USING convert_to(speaker, 'UTF8'),
    ADD COLUMN sealed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE summaries
    ALTER COLUMN content TYPE BYTEA USING convert_to(content, 'UTF8'),
    ALTER COLUMN ledger DROP DEFAULT,
    ALTER COLUMN ledger TYPE BYTEA USING convert_to(ledger, 'UTF8'),
    ALTER COLUMN ledger SET DEFAULT convert_to('[]', 'UTF8'),
    ADD COLUMN sealed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE partials
    ALTER COLUMN text TYPE BYTEA USING convert_to(text, 'UTF8'),
    ADD COLUMN sealed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE events
    ALTER COLUMN data TYPE BYTEA USING convert_to(data, 'UTF8'),
    ADD COLUMN sealed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE session_focus
    ALTER COLUMN focus TYPE BYTEA USING convert_to(focus, 'UTF8'),
    ADD COLUMN sealed BIGINT NOT NULL DEFAULT 0;
