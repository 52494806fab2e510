-- 10: a tenant's session list reads its own sessions, not every tenant's (issue #26).
-- Each session names its tenant (the part of its key before the separator, '' for the local
-- tenant); a page is read from the tenant's part of an index in change order.
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE sessions SET tenant = split_part(id, chr(31), 1) WHERE strpos(id, chr(31)) > 0;
CREATE INDEX sessions_tenant_change ON sessions(tenant, changed_seq DESC, id);
-- A session named by the start of its id: its tenant's ids by pattern (byte order).
CREATE INDEX sessions_tenant_id ON sessions(tenant, id text_pattern_ops);
