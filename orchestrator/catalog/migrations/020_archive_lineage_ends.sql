-- A lineage ends when an archiver pass finds its topic gone from the broker of its cluster, or
-- replaced there by another of the same name (deleted; deleted and created again): a restore
-- never brings its records back, and a topic created again under the name starts a lineage of
-- its own.
ALTER TABLE archive_lineages DROP CONSTRAINT archive_lineages_state_check;
ALTER TABLE archive_lineages ADD CONSTRAINT archive_lineages_state_check
    CHECK (state IN ('live', 'restoring', 'ended'));
ALTER TABLE archive_lineages ADD COLUMN ended_at timestamptz;

-- The error that stopped a continuous archiver's pass on one topic (the other topics went on),
-- until a pass archives the topic again: `kappa archive status` names it.
CREATE TABLE archive_errors (
    topic    text PRIMARY KEY,
    error    text NOT NULL,
    since    timestamptz NOT NULL DEFAULT now(),
    seen_at  timestamptz NOT NULL DEFAULT now()
);
