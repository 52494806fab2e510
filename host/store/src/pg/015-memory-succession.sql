-- 15: facts that change (issue #53), as SQLite's migration 36: a memory superseded by a later
-- one of the same fact (or named as replaced) is kept and marked with its successor and when;
-- `fact_key` is the fact its text states, as a keyed hash ('' for none).
ALTER TABLE memories ADD COLUMN IF NOT EXISTS fact_key TEXT NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN IF NOT EXISTS supersedes TEXT;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS superseded_by TEXT;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS superseded_ms BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS memories_fact ON memories (tenant, fact_key, seq);
CREATE INDEX IF NOT EXISTS memories_successor ON memories (tenant, superseded_by) WHERE superseded_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_predecessor ON memories (tenant, supersedes) WHERE supersedes IS NOT NULL;
