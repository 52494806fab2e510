-- 6: costs that stay flat as the data grows (issue #26), as SQLite's migration 24 (the
-- session index is not named sessions_changed: that is the sequence of change numbers).
CREATE INDEX IF NOT EXISTS sessions_by_change ON sessions(changed_seq DESC, id);
CREATE INDEX IF NOT EXISTS jobs_active_session ON jobs(session) WHERE state IN ('queued','running');
CREATE INDEX IF NOT EXISTS jobs_running ON jobs(id) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished_ms) WHERE state IN ('succeeded','failed','cancelled');
CREATE INDEX IF NOT EXISTS events_job ON events(job) WHERE job IS NOT NULL;
