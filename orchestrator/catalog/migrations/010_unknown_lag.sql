-- A time lag that could not be measured (no timestamp read for a partition behind) is unknown,
-- stored as NULL, never as 0.
ALTER TABLE lag_samples ALTER COLUMN lag_seconds DROP NOT NULL;
