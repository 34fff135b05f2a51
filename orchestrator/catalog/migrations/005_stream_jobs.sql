-- Every file of a version's deployed code (one row for a single-file job): a restart runs
-- exactly these, whatever the job's files say now.
CREATE TABLE job_files (
    version_id bigint NOT NULL REFERENCES job_versions(id),
    path       text NOT NULL,
    content    bytea NOT NULL,
    sha256     text NOT NULL,
    PRIMARY KEY (version_id, path)
);

CREATE TRIGGER job_files_immutable BEFORE UPDATE ON job_files
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Dead letters, written by the executors that read the log and moved into the version's
-- dead-letter table by the commit of the batch whose offsets hold them. Unlogged: a crash loses
-- only rows that the replay of their batch writes again; the move removes duplicates.
CREATE UNLOGGED TABLE dead_letter_stage (
    version_id   bigint NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    "offset"     bigint NOT NULL,
    timestamp_ms bigint,
    key          bytea,
    raw          bytea,
    error        text NOT NULL
);

CREATE INDEX dead_letter_stage_position ON dead_letter_stage (version_id, topic, partition, "offset");
