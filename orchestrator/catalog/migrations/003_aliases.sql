-- Read aliases: a view per alias in the serving schema, prepared when versions are deployed;
-- switching only updates the routing row below, in a transaction: no DDL, no reader stalls.
CREATE TABLE aliases (
    name              text PRIMARY KEY,
    job               text NOT NULL REFERENCES jobs(name),
    serving_schema    text NOT NULL,
    primary_version   text,              -- serves the keys whose bucket is >= percent
    candidate_version text,              -- serves the keys whose bucket is < percent
    percent           integer NOT NULL DEFAULT 0 CHECK (percent BETWEEN 0 AND 100),
    -- what the alias served entirely before the current cutover began: `kappa rollback`
    rollback_version  text,
    view_versions     jsonb NOT NULL DEFAULT '[]',   -- the versions the view has a branch for
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE alias_history (
    id           bigserial PRIMARY KEY,
    alias        text NOT NULL,
    job          text NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor        text NOT NULL,
    action       text NOT NULL,
    from_version text,
    to_version   text,
    percent      integer NOT NULL,
    reason       text,
    forced       boolean NOT NULL DEFAULT false,
    lag          jsonb NOT NULL DEFAULT '{}'
);

CREATE TRIGGER alias_history_append_only BEFORE UPDATE OR DELETE ON alias_history
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- The latest validation (`kappa diff`) of each version against another.
CREATE TABLE validations (
    version_id   bigint PRIMARY KEY REFERENCES job_versions(id),
    against      text NOT NULL,
    passed       boolean NOT NULL,
    report       jsonb NOT NULL,
    at           timestamptz NOT NULL DEFAULT now()
);

-- A key's A/B bucket, 0..99: md5 is the same on every PostgreSQL, so a key's bucket never
-- changes, and raising the percentage only moves keys towards the candidate.
CREATE FUNCTION key_bucket(key text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT (('x' || substr(md5(key), 1, 8))::bit(32)::bigint % 100)::integer $$;
