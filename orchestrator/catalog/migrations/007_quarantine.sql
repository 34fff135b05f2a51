-- `kappa restart --quarantine` marks the batch that kept failing: the next driver re-runs it
-- record range by record range, moves the records that fail to the dead-letter table with
-- their error, and clears the mark in the batch's commit.
ALTER TABLE runs ADD COLUMN quarantine_batch bigint;

-- When the batch the driver is working on began (null between batches), written with each
-- heartbeat: a long batch (a quarantine, a large stateful one) is busy, not stalled.
ALTER TABLE runs ADD COLUMN busy_since timestamptz;
