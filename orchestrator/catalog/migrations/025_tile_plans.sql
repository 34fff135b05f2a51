-- A batch job's catch-up over decoded segments runs as Spark batch jobs, one tile at a time
-- (#60). Each tile's plan (its batch id and offsets) is recorded before anything of it is
-- staged, so that the driver that follows one that died mid-tile runs the same tile again,
-- as Spark's offset log makes a micro-batch's retry read what the first try read. One row per
-- version: its newest plan; one whose batch the catalog holds is spent.
CREATE TABLE tile_plans (
    version_id    bigint PRIMARY KEY REFERENCES job_versions(id),
    batch_id      bigint NOT NULL,
    attempt       integer NOT NULL,
    start_offsets jsonb NOT NULL,
    end_offsets   jsonb NOT NULL,
    planned_at    timestamptz NOT NULL DEFAULT now()
);
