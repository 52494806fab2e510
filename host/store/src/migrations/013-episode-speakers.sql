-- 13: the speaker's name of an episode, when its transcript gave one (summaries attribute
-- sentences to it).
ALTER TABLE episodes ADD COLUMN speaker TEXT;
