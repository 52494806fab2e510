-- abridge's PostgreSQL schema, version 1: the tables of SQLite migrations 001-019 in one
-- step, plus what several instances share (model request slots). Integers are BIGINT, text
-- that may be sealed is BYTEA, JSON stays text (the same documents as in SQLite).
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    episodes BIGINT NOT NULL DEFAULT 0,
    total_tokens BIGINT NOT NULL DEFAULT 0,
    changed_seq BIGINT NOT NULL DEFAULT 0
);
CREATE SEQUENCE sessions_changed;
CREATE TABLE episodes (
    session TEXT NOT NULL REFERENCES sessions(id),
    id BIGINT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('system','user','assistant','tool')),
    content TEXT NOT NULL,
    timestamp_ms BIGINT,
    source_key TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    speaker TEXT,
    PRIMARY KEY (session, id)
);
CREATE UNIQUE INDEX episodes_source ON episodes(session, source_key);
CREATE TABLE summaries (
    id BIGSERIAL PRIMARY KEY,
    session TEXT NOT NULL REFERENCES sessions(id),
    first_episode BIGINT NOT NULL,
    last_episode BIGINT NOT NULL,
    content TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    model TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    skipped TEXT NOT NULL DEFAULT '[]',
    level BIGINT NOT NULL DEFAULT 0,
    compacted_into BIGINT,
    ledger TEXT NOT NULL DEFAULT '[]',
    ledger_dropped BIGINT NOT NULL DEFAULT 0,
    CHECK (last_episode >= first_episode)
);
CREATE INDEX summaries_active ON summaries(session, compacted_into, last_episode);
CREATE TABLE calibration (
    model TEXT PRIMARY KEY,
    estimated BIGINT NOT NULL,
    reported BIGINT NOT NULL
);
CREATE TABLE partials (
    key TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE jobs (
    id BIGSERIAL PRIMARY KEY,
    session TEXT NOT NULL,
    target BIGINT NOT NULL,
    key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed','cancelled')),
    config TEXT NOT NULL,
    cancel_requested BIGINT NOT NULL DEFAULT 0,
    level BIGINT NOT NULL DEFAULT 0,
    done BIGINT NOT NULL DEFAULT 0,
    total BIGINT NOT NULL DEFAULT 0,
    calls_planned BIGINT NOT NULL DEFAULT 0,
    answers BIGINT NOT NULL DEFAULT 0,
    attempts BIGINT NOT NULL DEFAULT 0,
    error TEXT,
    lease_owner TEXT,
    lease_until_ms BIGINT,
    created_ms BIGINT NOT NULL,
    started_ms BIGINT,
    updated_ms BIGINT NOT NULL,
    finished_ms BIGINT
);
-- One active job per idempotency key, whichever instance enqueues it.
CREATE UNIQUE INDEX jobs_active_key ON jobs(key) WHERE state IN ('queued','running');
CREATE INDEX jobs_session ON jobs(session, id);
CREATE INDEX jobs_active ON jobs(id) WHERE state IN ('queued','running');
CREATE TABLE sources (
    path TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    mtime_ms BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    sessions TEXT NOT NULL,
    episodes BIGINT NOT NULL,
    detail TEXT,
    updated_ms BIGINT NOT NULL
);
CREATE TABLE failure_markers (
    session TEXT PRIMARY KEY,
    failures BIGINT NOT NULL,
    last_error TEXT NOT NULL,
    retry_after_ms BIGINT NOT NULL,
    failed_ms BIGINT NOT NULL
);
CREATE TABLE watched_files (
    path TEXT PRIMARY KEY,
    session TEXT,
    format TEXT,
    "offset" BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    lines BIGINT
);
CREATE TABLE source_marks (
    session TEXT NOT NULL,
    path TEXT NOT NULL,
    last_episode BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    PRIMARY KEY (session, path, last_episode)
);
CREATE TABLE session_modes (
    session TEXT PRIMARY KEY,
    mode TEXT NOT NULL CHECK (mode IN ('eager','idle','window')),
    quiescence_secs BIGINT
);
CREATE TABLE session_focus (
    session TEXT PRIMARY KEY,
    focus TEXT NOT NULL
);
CREATE TABLE session_pins (
    session TEXT NOT NULL,
    episode BIGINT NOT NULL,
    PRIMARY KEY (session, episode)
);
CREATE TABLE tokens (
    id BIGSERIAL PRIMARY KEY,
    tenant TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    read_only BIGINT NOT NULL DEFAULT 0,
    label TEXT,
    created_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);
CREATE INDEX tokens_tenant ON tokens (tenant);
CREATE TABLE events (
    tenant TEXT NOT NULL,
    id BIGINT NOT NULL,
    kind TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    session_key TEXT,
    job BIGINT,
    data TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX events_session ON events (session_key);
CREATE TABLE clusters (
    tenant TEXT NOT NULL,
    id BIGINT NOT NULL,
    "user" TEXT NOT NULL,
    project TEXT NOT NULL,
    environment TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    sum BYTEA NOT NULL,
    members BIGINT NOT NULL DEFAULT 0,
    version BIGINT NOT NULL DEFAULT 0,
    settled BIGINT NOT NULL DEFAULT 0,
    changed_seq BIGINT NOT NULL DEFAULT 0,
    note TEXT,
    claim_owner TEXT,
    claim_until_ms BIGINT,
    PRIMARY KEY (tenant, id)
);
CREATE SEQUENCE clusters_changed;
CREATE INDEX clusters_scope ON clusters (tenant, "user", project, environment, kind, key);
CREATE INDEX clusters_changed_idx ON clusters (changed_seq);
CREATE TABLE memories (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    "user" TEXT NOT NULL,
    project TEXT NOT NULL,
    environment TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    text BYTEA NOT NULL,
    sealed BIGINT NOT NULL DEFAULT 0,
    importance DOUBLE PRECISION NOT NULL,
    tokens BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    cluster BIGINT NOT NULL,
    model TEXT NOT NULL,
    vector BYTEA NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX memories_cluster ON memories (tenant, cluster, seq);
CREATE INDEX memories_order ON memories (tenant, seq);
CREATE INDEX memories_user ON memories (tenant, "user", project);
CREATE TABLE cluster_summaries (
    tenant TEXT NOT NULL,
    id BIGINT NOT NULL,
    cluster BIGINT NOT NULL,
    text BYTEA NOT NULL,
    sealed BIGINT NOT NULL DEFAULT 0,
    member_hash TEXT NOT NULL,
    sources TEXT NOT NULL,
    importance DOUBLE PRECISION NOT NULL,
    tokens BIGINT NOT NULL,
    model TEXT NOT NULL,
    calls BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    vector_model TEXT NOT NULL,
    vector BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE UNIQUE INDEX cluster_summaries_cluster ON cluster_summaries (tenant, cluster);
CREATE TABLE data_keys (
    tenant TEXT NOT NULL,
    version BIGINT NOT NULL,
    wrapped BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, version)
);
CREATE TABLE usage (
    tenant TEXT NOT NULL,
    month TEXT NOT NULL,
    calls BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, month)
);
-- Model requests in flight, shared by every instance: a row per request, with a lease so a
-- dead instance's rows stop counting.
CREATE TABLE model_slots (
    id BIGSERIAL PRIMARY KEY,
    tenant TEXT NOT NULL,
    owner TEXT NOT NULL,
    until_ms BIGINT NOT NULL
);
CREATE INDEX model_slots_tenant ON model_slots (tenant, until_ms);
