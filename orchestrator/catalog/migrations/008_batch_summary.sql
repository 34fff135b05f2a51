-- Older batches, folded into one row per version when the `batches` records are pruned: the
-- catalog keeps recent batches in full (replays, audits) and totals for the rest.
CREATE TABLE batch_summary (
    version_id     bigint PRIMARY KEY REFERENCES job_versions(id),
    batches        bigint NOT NULL,
    first_batch_id bigint NOT NULL,
    last_batch_id  bigint NOT NULL,
    records        bigint NOT NULL,
    output_rows    bigint NOT NULL,
    dead_letters   bigint NOT NULL,
    gap_offsets    bigint NOT NULL
);
