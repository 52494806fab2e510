-- Model usage per tenant and calendar month (UTC), for the monthly cost ceiling and
-- `abridge usage` / `GET /v1/usage`.
CREATE TABLE usage (
    tenant TEXT NOT NULL,
    month TEXT NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, month)
) WITHOUT ROWID;
