-- Model usage per tenant and UTC day (`YYYY-MM-DD`), beside the monthly totals in `usage`:
-- the web console's usage chart and `GET /v1/usage`'s `days`.
CREATE TABLE usage_days (
    tenant TEXT NOT NULL,
    day TEXT NOT NULL,
    calls BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day)
);
