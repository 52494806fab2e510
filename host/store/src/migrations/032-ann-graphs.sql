-- Each tenant's recall graph for one embedding model (the HNSW index the SQLite store keeps in
-- memory), saved so that a restart loads it instead of building it again: the memories it
-- holds (through `seq`), the deletion count it reflects (a deletion removes the saved graph,
-- which holds the deleted vector), the graph itself (sealed with the tenant's data key under
-- a master key, as the vectors are: `sealed` is that key's version, 0 for plain) and which
-- memory each of its keys stands for.
CREATE TABLE ann_graphs (
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    seq INTEGER NOT NULL,
    deletes INTEGER NOT NULL,
    dim INTEGER NOT NULL,
    graph BLOB NOT NULL,
    keys TEXT NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, model)
);
