-- 7: each episode's running token total, as SQLite's migration 25.
ALTER TABLE episodes ADD COLUMN IF NOT EXISTS tokens_through BIGINT NOT NULL DEFAULT 0;
UPDATE episodes SET tokens_through = w.t
  FROM (SELECT session, id, SUM(tokens) OVER (PARTITION BY session ORDER BY id) AS t FROM episodes) AS w
  WHERE episodes.session = w.session AND episodes.id = w.id;
