-- 11: the line number at each watched file's offset, so a watcher's episode keys are the
-- file's own line numbers (the same keys summarize and backfill give the same lines).
ALTER TABLE watched_files ADD COLUMN lines INTEGER;
