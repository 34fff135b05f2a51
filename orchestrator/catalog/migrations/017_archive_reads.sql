-- A replay reads the offsets below the archive's end from the archive's segments: each read
-- task stages whether the archive served its range, and each batch records how many of its
-- offsets came from the archive (null for batches committed before this).
ALTER TABLE read_stage ADD COLUMN archived boolean NOT NULL DEFAULT false;
ALTER TABLE batches ADD COLUMN archived_offsets bigint;
ALTER TABLE batch_summary ADD COLUMN archived_offsets bigint;
