-- How many times a partition's log was replaced under the version (`kappa restart --allow-gap`
-- onto a recreated topic): the offsets of a new log repeat the old one's, so a dead letter is
-- keyed by (topic, partition, offset, log_epoch), and none of the new log's is lost to the old.
ALTER TABLE processed_offsets ADD COLUMN log_epoch integer NOT NULL DEFAULT 0;
