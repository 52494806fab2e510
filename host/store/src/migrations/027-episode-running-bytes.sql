-- 27: each episode carries the session's running total of content bytes through it, so the
-- transcript bytes a summary row covers are a subtraction instead of a read of every episode
-- (issue #26, finding H: `summaries?coverage=true`). Existing rows are filled in one pass:
-- plain text's UTF-8 length, or a sealed value's length less its 41 bytes of format, nonce
-- and tag (crypto::SEALED_OVERHEAD).
ALTER TABLE episodes ADD COLUMN bytes_through INTEGER NOT NULL DEFAULT 0;
UPDATE episodes SET bytes_through = w.b
  FROM (SELECT session, id, SUM(CASE WHEN sealed > 0 THEN length(CAST(content AS BLOB)) - 41
                                     ELSE length(CAST(content AS BLOB)) END)
                             OVER (PARTITION BY session ORDER BY id) AS b FROM episodes) AS w
  WHERE episodes.session = w.session AND episodes.id = w.id;
