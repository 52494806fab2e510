-- 28: a worker's poll reads each tenant's next jobs, not the whole queue (issue #26).
-- Each job names its tenant (the part of its session key before the separator, '' for the
-- local tenant); the active set is indexed by tenant and age, so a poll walks the tenants
-- with active jobs and takes the oldest few of each.
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE jobs SET tenant = substr(session, 1, instr(session, char(31)) - 1)
    WHERE instr(session, char(31)) > 0;
CREATE INDEX jobs_runnable ON jobs(tenant, id) WHERE state IN ('queued','running');
