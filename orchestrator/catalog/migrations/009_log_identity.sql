-- Which log each version reads: the broker's cluster id and each topic's id. Not a column of
-- the immutable job_versions: `kappa restart --allow-gap` moves a version onto a new log.
-- No row for versions deployed before it was recorded: adopted at their next check.
CREATE TABLE version_logs (
    version_id   bigint PRIMARY KEY REFERENCES job_versions(id),
    identity     jsonb NOT NULL,  -- {"cluster_id": ..., "topics": {"<topic>": "<topic id>"}}
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
