-- What each read task found in its offset range, written by the executor that read it and
-- summed by the commit of the batch whose offsets hold the range. Offsets with no record
-- (transaction markers, aborted or compacted records) are the batch's gaps, so every offset is
-- a row, a dead letter or a gap. Unlogged, like dead_letter_stage: a replayed batch reads again.
CREATE UNLOGGED TABLE read_stage (
    version_id  bigint NOT NULL,
    topic       text NOT NULL,
    partition   integer NOT NULL,
    range_start bigint NOT NULL,
    range_end   bigint NOT NULL,
    records     bigint NOT NULL
);

CREATE INDEX read_stage_position ON read_stage (version_id, topic, partition, range_start);

-- Null for batches committed before this accounting existed.
ALTER TABLE batches ADD COLUMN gap_offsets bigint;
