-- The queued and running jobs, as PostgreSQL's schema has indexed them from its start (the
-- workers' scan for runnable jobs): the schema test (tests/schema.rs) found SQLite lacked it.
CREATE INDEX jobs_active ON jobs(id) WHERE state IN ('queued','running');
