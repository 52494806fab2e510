-- 11: a cluster summary says what it covers in two numbers, not a list of every member id
-- (issue #26; SQLite migration 30). It covers the cluster's members with seq <= covered_seq,
-- `covered` of them; a refresh reads only the members written after it. Old rows take their
-- figures from their id lists.
ALTER TABLE cluster_summaries ADD COLUMN covered_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cluster_summaries ADD COLUMN covered BIGINT NOT NULL DEFAULT 0;
UPDATE cluster_summaries s SET
    covered_seq = COALESCE((SELECT MAX(m.seq) FROM jsonb_array_elements_text(s.sources::jsonb) j(id)
        JOIN memories m ON m.tenant = s.tenant AND m.id = j.id), 0),
    covered = jsonb_array_length(s.sources::jsonb);
ALTER TABLE cluster_summaries DROP COLUMN sources;
-- An extractive summary reads a cluster's best-ranked members a page at a time.
CREATE INDEX memories_rank ON memories (tenant, cluster, importance DESC, created_ms, id);
