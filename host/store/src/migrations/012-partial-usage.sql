-- 12: what each cached answer cost, so a row's usage counts the calls of earlier runs whose
-- answers it reuses.
ALTER TABLE partials ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE partials ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
