-- 3: per-model calibration of the token estimator (running totals).
CREATE TABLE calibration (
    model TEXT PRIMARY KEY,
    estimated INTEGER NOT NULL,
    reported INTEGER NOT NULL
);
