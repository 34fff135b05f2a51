-- Lag history, sampled by `kappa agent`, `kappa lag` and `kappa wait`: rates, ETA and states
-- are judged from it.
CREATE TABLE lag_samples (
    version_id   bigint NOT NULL REFERENCES job_versions(id),
    at           timestamptz NOT NULL,
    processed    bigint NOT NULL,
    log_end      bigint NOT NULL,
    lag_seconds  double precision NOT NULL,
    driver_alive boolean NOT NULL,
    PRIMARY KEY (version_id, at)
);

-- The last judged lag state, so that only changes reach the event log.
CREATE TABLE lag_states (
    version_id bigint PRIMARY KEY REFERENCES job_versions(id),
    state      text NOT NULL,
    since      timestamptz NOT NULL DEFAULT now()
);
