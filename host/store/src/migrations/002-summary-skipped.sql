-- 2: episode ranges a summary does not reflect (failed map chunks), as JSON [[a, b], ...].
ALTER TABLE summaries ADD COLUMN skipped TEXT NOT NULL DEFAULT '[]';
