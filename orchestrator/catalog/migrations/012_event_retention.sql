-- The event log stays append-only, but bounded: its oldest rows may be deleted by retention
-- (events.prune, which says so with SET LOCAL kappa.retention = 'on'), and by nothing else.
DROP TRIGGER events_append_only ON events;

CREATE FUNCTION refuse_change_but_retention() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('kappa.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only / immutable', TG_TABLE_NAME;
END $$;

CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION refuse_change_but_retention();
