-- Who hands out the replay slots (#61 path 10). Each process that does so at a steady
-- interval (`kappa agent`, the embedded stack's queue keeper) notes every look here, so that
-- `kappa queue` and `kappa status` can say when nobody does: queued versions then never start.
-- One row per process; a row unseen for a day is dropped by the next look.
CREATE TABLE queue_keepers (
    keeper    text PRIMARY KEY,
    every_s   double precision NOT NULL CHECK (every_s > 0),
    looked_at timestamptz NOT NULL DEFAULT now()
);
