-- Per-tenant data keys for encryption at rest, each stored only wrapped (sealed under the
-- master key with the tenant and version as associated data). The newest version of a
-- tenant seals new text; older versions open older rows. Deleting a tenant's rows here makes
-- its sealed text unreadable.
CREATE TABLE data_keys (
    tenant TEXT NOT NULL,
    version INTEGER NOT NULL,
    wrapped BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, version)
) WITHOUT ROWID;
