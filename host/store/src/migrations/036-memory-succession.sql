-- 36: facts that change (issue #53). A memory that states the same fact as an earlier one of
-- its scope ("I moved to Lyon" after "I live in Porto"), or names the memory it replaces,
-- supersedes it: the earlier row is kept and marked with its successor and when. `fact_key`
-- is the fact the text states as a keyed hash (the full-text index's key, so a sealed
-- tenant's facts are not in the clear), '' for none.
ALTER TABLE memories ADD COLUMN fact_key TEXT NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN supersedes TEXT;
ALTER TABLE memories ADD COLUMN superseded_by TEXT;
ALTER TABLE memories ADD COLUMN superseded_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX memories_fact ON memories (tenant, fact_key, seq);
CREATE INDEX memories_successor ON memories (tenant, superseded_by) WHERE superseded_by IS NOT NULL;
CREATE INDEX memories_predecessor ON memories (tenant, supersedes) WHERE supersedes IS NOT NULL;
