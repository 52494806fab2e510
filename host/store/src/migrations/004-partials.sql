-- 4: accepted partial summaries of map-reduce, by request key (resume and retry reuse them).
CREATE TABLE partials (key TEXT PRIMARY KEY, text TEXT NOT NULL);
