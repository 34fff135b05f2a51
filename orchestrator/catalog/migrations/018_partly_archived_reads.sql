-- A read task that starts below the broker's log start reads what retention took from the
-- archive and the rest from Kafka: it stages how many of its offsets the archive served (null
-- for rows staged before this, where `archived` says all or none).
ALTER TABLE read_stage ADD COLUMN archived_offsets bigint;
