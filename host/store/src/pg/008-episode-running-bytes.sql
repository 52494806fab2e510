-- 8: each episode's running total of content bytes, as SQLite's migration 27 (a sealed value
-- carries 41 bytes of format, nonce and tag).
ALTER TABLE episodes ADD COLUMN IF NOT EXISTS bytes_through BIGINT NOT NULL DEFAULT 0;
UPDATE episodes SET bytes_through = w.b
  FROM (SELECT session, id, SUM(CASE WHEN sealed > 0 THEN octet_length(content) - 41
                                     ELSE octet_length(content) END)
                             OVER (PARTITION BY session ORDER BY id) AS b FROM episodes) AS w
  WHERE episodes.session = w.session AND episodes.id = w.id;
