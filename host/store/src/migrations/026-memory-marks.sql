-- Deletions and re-embeddings of each tenant's memories, counted: a process that keeps an
-- in-memory vector index of the table compares the count with the one its index reflects,
-- and rebuilds when another process removed rows it holds (new rows it finds by `seq`).
CREATE TABLE memory_marks (
    tenant TEXT PRIMARY KEY,
    deletes INTEGER NOT NULL
) WITHOUT ROWID;
