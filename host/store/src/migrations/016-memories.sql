-- Memories (small facts), their clusters and the clusters' summaries, per tenant. Text columns
-- are BLOBs so they can hold sealed (encrypted) bytes; `sealed` is the data key's version, 0
-- for plaintext. Vectors are little-endian f32. A cluster keeps the sum of its members'
-- vectors (its centroid is sum / members), a membership version and the version the last
-- summarize run settled, and a claim so two workers never summarize it at once.
CREATE TABLE clusters (
    tenant TEXT NOT NULL,
    id INTEGER NOT NULL,
    user TEXT NOT NULL,
    project TEXT NOT NULL,
    environment TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    sum BLOB NOT NULL,
    members INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL DEFAULT 0,
    settled INTEGER NOT NULL DEFAULT 0,
    changed_seq INTEGER NOT NULL DEFAULT 0,
    note TEXT,
    claim_owner TEXT,
    claim_until_ms INTEGER,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
CREATE INDEX clusters_scope ON clusters (tenant, user, project, environment, kind, key);
CREATE INDEX clusters_changed ON clusters (changed_seq);

CREATE TABLE memories (
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
) WITHOUT ROWID;
CREATE INDEX memories_cluster ON memories (tenant, cluster, seq);
CREATE INDEX memories_order ON memories (tenant, seq);
CREATE INDEX memories_user ON memories (tenant, user, project);

CREATE TABLE cluster_summaries (
    tenant TEXT NOT NULL,
    id INTEGER NOT NULL,
    cluster INTEGER NOT NULL,
    text BLOB NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0,
    member_hash TEXT NOT NULL,
    sources TEXT NOT NULL,
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
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX cluster_summaries_cluster ON cluster_summaries (tenant, cluster);
