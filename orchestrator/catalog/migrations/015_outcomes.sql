-- Cutover by outcome: the outcome metrics declared per job, and every look an outcome cutover
-- took at them (the evidence behind each of its decisions and share changes).
CREATE TABLE outcome_metrics (
    job               text NOT NULL,
    name              text NOT NULL,
    kind              text NOT NULL CHECK (kind IN ('proportion', 'mean')),
    higher_is_better  boolean NOT NULL,
    role              text NOT NULL CHECK (role IN ('decision', 'guardrail')),
    margin            double precision NOT NULL DEFAULT 0,
    query_sql         text,
    query_promql      text,
    defined_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, name),
    CHECK ((query_sql IS NULL) <> (query_promql IS NULL))
);

-- Look 0 is the test's start: the instant its first A/B switch committed.
CREATE TABLE experiment_looks (
    plan_id   bigint NOT NULL REFERENCES cutover_plans(id),
    look      integer NOT NULL,
    at        timestamptz NOT NULL,  -- the observations counted are those before this instant
    percent   integer NOT NULL,      -- the candidate's share of keys when the look was taken
    next_percent integer NOT NULL,   -- its share from the look on
    verdict   text NOT NULL,
    reason    text NOT NULL,
    evidence  jsonb NOT NULL,
    PRIMARY KEY (plan_id, look)
);

CREATE TRIGGER experiment_looks_append_only BEFORE UPDATE OR DELETE ON experiment_looks
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
