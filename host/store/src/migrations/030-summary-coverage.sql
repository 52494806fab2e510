-- 30: a cluster summary says what it covers in two numbers, not a list of every member id
-- (issue #26). It covers the cluster's members with seq <= covered_seq (a delete of one of
-- them deletes the summary, so they are all still there), `covered` of them; a refresh reads
-- only the members written after it. Old rows take their figures from their id lists.
ALTER TABLE cluster_summaries ADD COLUMN covered_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cluster_summaries ADD COLUMN covered INTEGER NOT NULL DEFAULT 0;
UPDATE cluster_summaries SET
    covered_seq = COALESCE((SELECT MAX(m.seq) FROM json_each(cluster_summaries.sources) j
        JOIN memories m ON m.tenant = cluster_summaries.tenant AND m.id = j.value), 0),
    covered = json_array_length(cluster_summaries.sources);
ALTER TABLE cluster_summaries DROP COLUMN sources;
-- An extractive summary reads a cluster's best-ranked members a page at a time.
CREATE INDEX memories_rank ON memories (tenant, cluster, importance DESC, created_ms, id);
