-- 24: costs that stay flat as the data grows (issue #26).
-- The session list's order, and the next change number of an append (MAX over it), from an
-- index instead of a scan of every session.
CREATE INDEX sessions_by_change ON sessions(changed_seq DESC, id);
-- One tenant's queued jobs counted from its own key range of the active set; the running
-- jobs a claim counts against the tenant's cap, apart from every tenant's queue.
CREATE INDEX jobs_active_session ON jobs(session) WHERE state IN ('queued','running');
CREATE INDEX jobs_running ON jobs(id) WHERE state = 'running';
-- Finished jobs in the order retention removes them, and the events of a removed job.
CREATE INDEX jobs_finished ON jobs(finished_ms) WHERE state IN ('succeeded','failed','cancelled');
CREATE INDEX events_job ON events(job) WHERE job IS NOT NULL;
