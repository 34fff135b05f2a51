-- Runs with search_path set to the catalog schema.
CREATE TABLE jobs (
    name        text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Immutable once deployed: a restart runs exactly the stored source, whatever the file says now.
CREATE TABLE job_versions (
    id                bigserial PRIMARY KEY,
    job               text NOT NULL REFERENCES jobs(name),
    version           text NOT NULL,
    fingerprint       text NOT NULL,
    source            text NOT NULL,
    file_path         text NOT NULL,
    spec              jsonb NOT NULL,
    output_table      text NOT NULL,
    dead_letter_table text NOT NULL,
    checkpoint_dir    text NOT NULL,
    consumer_group    text NOT NULL,
    log_start         jsonb NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job, version)
);

CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only / immutable', TG_TABLE_NAME;
END $$;

CREATE TRIGGER job_versions_immutable BEFORE UPDATE ON job_versions
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- One run per version; `attempt` grows with every (re)start and fences out stale drivers.
CREATE TABLE runs (
    version_id    bigint PRIMARY KEY REFERENCES job_versions(id),
    state         text NOT NULL,
    attempt       integer NOT NULL DEFAULT 0,
    pid           integer,
    pid_started   double precision,
    host          text,
    app_id        text,
    log_path      text,
    reason        text,
    started_at    timestamptz,
    heartbeat_at  timestamptz,
    caught_up_at  timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Each micro-batch is applied once: its rows and offsets commit in the same transaction.
CREATE TABLE batches (
    version_id    bigint NOT NULL REFERENCES job_versions(id),
    batch_id      bigint NOT NULL,
    attempt       integer NOT NULL,
    start_offsets jsonb NOT NULL,
    end_offsets   jsonb NOT NULL,
    records       bigint NOT NULL,
    output_rows   bigint NOT NULL,
    dead_letters  bigint NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (version_id, batch_id)
);

CREATE TABLE processed_offsets (
    version_id  bigint NOT NULL REFERENCES job_versions(id),
    topic       text NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (version_id, topic, partition)
);

CREATE TABLE events (
    id         bigserial PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor      text NOT NULL,
    job        text,
    version    text,
    kind       text NOT NULL,
    detail     jsonb NOT NULL DEFAULT '{}'
);

CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
