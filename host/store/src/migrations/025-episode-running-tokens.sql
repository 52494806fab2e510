-- 25: each episode carries the session's running token total through it, so the backlog
-- after a summary is a subtraction instead of a read of every unsummarized episode (issue
-- #26, finding A). Existing rows are filled in one pass.
ALTER TABLE episodes ADD COLUMN tokens_through INTEGER NOT NULL DEFAULT 0;
UPDATE episodes SET tokens_through = w.t
  FROM (SELECT session, id, SUM(tokens) OVER (PARTITION BY session ORDER BY id) AS t FROM episodes) AS w
  WHERE episodes.session = w.session AND episodes.id = w.id;
