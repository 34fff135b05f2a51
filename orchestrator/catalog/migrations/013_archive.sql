-- The archive's manifest: one row per segment, recorded only once its file is in place. A
-- lineage is (cluster_id, topic, topic_id): a recreated topic starts a new one. The writer
-- appends each partition's segments in order under an advisory lock, so that they tile their
-- range; the keys refuse a second segment at the same first or end offset.
CREATE TABLE archive_segments (
    cluster_id    text NOT NULL,
    topic         text NOT NULL,
    topic_id      text NOT NULL,
    partition     integer NOT NULL CHECK (partition >= 0),
    first_offset  bigint NOT NULL CHECK (first_offset >= 0),
    end_offset    bigint NOT NULL,
    records       bigint NOT NULL CHECK (records >= 0),
    gap_offsets   bigint[] NOT NULL,
    bytes         bigint NOT NULL CHECK (bytes >= 0),
    checksum      text NOT NULL,
    path          text NOT NULL,  -- relative to archive_root
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_id, topic, topic_id, partition, first_offset),
    UNIQUE (cluster_id, topic, topic_id, partition, end_offset),
    CHECK (end_offset > first_offset),
    CHECK (records + cardinality(gap_offsets) = end_offset - first_offset)
);
