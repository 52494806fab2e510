-- 34: full-text search of every message (issue #40). Each episode's terms (the guest's
-- `text.index-terms`: lower case, stems, no stop words) as keyed hashes of 13 letters, the
-- first one its session's token; FTS5 indexes them (no positions: a search asks for terms,
-- not phrases). The hashes are keyed by tenant (with a master key, by its lexical key), so
-- the index holds no word in clear. `search_totals` keeps each tenant's episodes indexed and
-- their terms (BM25's N and average length). Sessions stored before this migration have
-- `indexed` 0: the app indexes them in batches (`abridge index`, or on the first search).
CREATE TABLE episode_terms (
    doc INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    episode INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    terms TEXT NOT NULL,
    length INTEGER NOT NULL
);
CREATE UNIQUE INDEX episode_terms_episode ON episode_terms (session, episode);
CREATE VIRTUAL TABLE episode_fts USING fts5(
    terms, content='episode_terms', content_rowid='doc', detail='none', columnsize=0
);
-- A deleted message leaves the index at once (not when its segment is next merged).
INSERT INTO episode_fts (episode_fts, rank) VALUES ('secure-delete', 1);
CREATE VIRTUAL TABLE episode_vocab USING fts5vocab(episode_fts, 'row');
CREATE TRIGGER episode_terms_indexed AFTER INSERT ON episode_terms BEGIN
    INSERT INTO episode_fts (rowid, terms) VALUES (new.doc, new.terms);
END;
CREATE TRIGGER episode_terms_removed AFTER DELETE ON episode_terms BEGIN
    INSERT INTO episode_fts (episode_fts, rowid, terms) VALUES ('delete', old.doc, old.terms);
END;
CREATE TABLE search_totals (
    tenant TEXT PRIMARY KEY,
    docs INTEGER NOT NULL,
    length INTEGER NOT NULL
) WITHOUT ROWID;
ALTER TABLE sessions ADD COLUMN indexed INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_unindexed ON sessions (id) WHERE indexed = 0;
