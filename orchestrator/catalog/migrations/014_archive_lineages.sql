-- Every log identity (cluster id, topic, topic id) the archive has met, and the lineage it
-- continues. A topic the archiver meets first is a root: its root is itself. A topic that
-- `kappa dev up` restored from the archive is a new topic id on the broker that continues its
-- root's offsets, so the archive goes on writing the root's segments, and versions that read
-- the root go on reading it. 'restoring' marks a restore not yet checked against the manifest:
-- a crash leaves it so, and the next restore starts that topic again.
CREATE TABLE archive_lineages (
    cluster_id       text NOT NULL,
    topic            text NOT NULL,
    topic_id         text NOT NULL,
    partitions       integer NOT NULL CHECK (partitions > 0),
    root_cluster_id  text NOT NULL,
    root_topic_id    text NOT NULL,
    state            text NOT NULL CHECK (state IN ('live', 'restoring')),
    seen_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_id, topic, topic_id)
);

-- The highest log end the archiver has seen per partition of a root lineage: after a crash of
-- a volatile broker, the offsets between the archive's end and this one were acknowledged and
-- then lost, and are reported, never skipped.
CREATE TABLE archive_log_ends (
    cluster_id  text NOT NULL,
    topic       text NOT NULL,
    topic_id    text NOT NULL,
    partition   integer NOT NULL CHECK (partition >= 0),
    log_end     bigint NOT NULL CHECK (log_end >= 0),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_id, topic, topic_id, partition)
);
