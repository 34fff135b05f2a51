-- Of the offsets a read task read from the archive, how many its decoded segments served (read
-- with no parse) rather than its raw ones; each batch records their sum, and the summary of
-- pruned batches their total. Null for rows staged and batches committed before this.
ALTER TABLE read_stage ADD COLUMN decoded_offsets bigint;
ALTER TABLE batches ADD COLUMN decoded_offsets bigint;
ALTER TABLE batch_summary ADD COLUMN decoded_offsets bigint;
