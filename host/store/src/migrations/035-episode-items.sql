-- 35: the client's own record of a message (issue #42): an agent framework's item, as JSON
-- text, kept beside its episode, sealed like its content with a master key, and handed back
-- as it was given. NULL for a message posted without one.
ALTER TABLE episodes ADD COLUMN item BLOB;
