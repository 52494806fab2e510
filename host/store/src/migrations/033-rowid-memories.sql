-- 33: memories and cluster summaries become rowid tables (issue #39). As WITHOUT ROWID tables
-- a row lived in its primary key's b-tree, and a row of 1.7 KB (a 1.5 KB vector) is larger than
-- such a b-tree keeps in a page: most of it went to an overflow page of its own, and every key
-- compared on the way to a row read the whole row back. A recall looks up some eighty rows by
-- key; the file was also a third larger than its rows. Same columns and indexes; the primary
-- key is now a unique index beside the rows.
CREATE TABLE memories_rowid (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    user TEXT NOT NULL,
    project TEXT NOT NULL,
    environment TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    text BLOB NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0,
    importance REAL NOT NULL,
    tokens INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    cluster INTEGER NOT NULL,
    model TEXT NOT NULL,
    vector BLOB NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
);
INSERT INTO memories_rowid (tenant, id, user, project, environment, kind, key, text, sealed, importance, tokens, created_ms, cluster, model, vector, seq)
    SELECT tenant, id, user, project, environment, kind, key, text, sealed, importance, tokens, created_ms, cluster, model, vector, seq FROM memories ORDER BY tenant, seq;
DROP TABLE memories;
ALTER TABLE memories_rowid RENAME TO memories;
CREATE INDEX memories_cluster ON memories (tenant, cluster, seq);
CREATE INDEX memories_order ON memories (tenant, seq);
CREATE INDEX memories_user ON memories (tenant, user, project);
CREATE INDEX memories_rank ON memories (tenant, cluster, importance DESC, created_ms, id);
CREATE TABLE cluster_summaries_rowid (
    tenant TEXT NOT NULL,
    id INTEGER NOT NULL,
    cluster INTEGER NOT NULL,
    text BLOB NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0,
    member_hash TEXT NOT NULL,
    importance REAL NOT NULL,
    tokens INTEGER NOT NULL,
    model TEXT NOT NULL,
    calls INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    vector_model TEXT NOT NULL,
    vector BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    covered_seq INTEGER NOT NULL DEFAULT 0,
    covered INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
);
INSERT INTO cluster_summaries_rowid (tenant, id, cluster, text, sealed, member_hash, importance, tokens, model, calls, prompt_tokens, output_tokens, vector_model, vector, created_ms, updated_ms, covered_seq, covered)
    SELECT tenant, id, cluster, text, sealed, member_hash, importance, tokens, model, calls, prompt_tokens, output_tokens, vector_model, vector, created_ms, updated_ms, covered_seq, covered FROM cluster_summaries ORDER BY tenant, id;
DROP TABLE cluster_summaries;
ALTER TABLE cluster_summaries_rowid RENAME TO cluster_summaries;
CREATE UNIQUE INDEX cluster_summaries_cluster ON cluster_summaries (tenant, cluster);
