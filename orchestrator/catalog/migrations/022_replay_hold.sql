-- Live first (live_lag_protect_s): while a live version is too far behind, the agent holds the
-- replay queue (no catch-up starts) and pauses catch-ups one at a time. One row at most; a hold
-- that its agent stopped renewing (the agent died) ends at renewed_until.
CREATE TABLE replay_hold (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    reason text NOT NULL,
    since timestamptz NOT NULL DEFAULT now(),
    renewed_until timestamptz NOT NULL,
    last_pause_at timestamptz
);
