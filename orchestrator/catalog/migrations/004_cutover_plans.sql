-- Resumable cutover plans: the steps, and how far a plan has come.
CREATE TABLE cutover_plans (
    id          bigserial PRIMARY KEY,
    job         text NOT NULL,
    alias       text NOT NULL,
    version     text NOT NULL,
    steps       jsonb NOT NULL,
    next_step   integer NOT NULL DEFAULT 0,
    status      text NOT NULL DEFAULT 'running',  -- running | succeeded | rolled_back
    reason      text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- At most one running plan per alias.
CREATE UNIQUE INDEX cutover_plans_one_running ON cutover_plans (alias) WHERE status = 'running';
