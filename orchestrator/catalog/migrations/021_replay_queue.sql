-- The replay budget (replay_slots): a version over it waits in the queue, in order of priority,
-- then of the time it joined. queued_at stays set on a run that the queue started: if the process
-- that took its slot died before launching the driver, the run goes back to the queue.
ALTER TABLE runs ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN queued_at timestamptz;
