-- Decoded segments: a raw segment's records parsed once under one decoding (the event schema,
-- its validation rules and the metadata kept) and kept as typed Parquet, so that every version
-- with that decoding replays them without a parse. A row is recorded only once its file is in
-- place; it names the raw segment it came from (by its key and checksum), whose gaps it keeps.
CREATE TABLE archive_decodings (
    decoding    text PRIMARY KEY,  -- the fingerprint: 16 hex digits of SHA-256 over spec
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE archive_decoded (
    decoding      text NOT NULL REFERENCES archive_decodings (decoding),
    cluster_id    text NOT NULL,
    topic         text NOT NULL,
    topic_id      text NOT NULL,
    partition     integer NOT NULL,
    first_offset  bigint NOT NULL,
    end_offset    bigint NOT NULL,
    rows          bigint NOT NULL CHECK (rows >= 0),
    dead_letters  bigint NOT NULL CHECK (dead_letters >= 0),
    bytes         bigint NOT NULL CHECK (bytes >= 0),
    checksum      text NOT NULL,  -- SHA-256 of the file
    raw_checksum  text NOT NULL,  -- the raw segment's, when it was decoded
    path          text NOT NULL,  -- relative to archive_root
    decoded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (decoding, cluster_id, topic, topic_id, partition, first_offset),
    FOREIGN KEY (cluster_id, topic, topic_id, partition, first_offset)
        REFERENCES archive_segments (cluster_id, topic, topic_id, partition, first_offset)
        ON DELETE CASCADE
);
