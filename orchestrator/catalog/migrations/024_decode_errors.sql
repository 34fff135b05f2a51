-- A continuous archiver's decoding of a topic can fail while its archiving goes on (#60): the
-- two stages' errors are kept apart, so that a pass that archives a topic clears its archiving
-- error only, and one that decodes it its decoding error only.
ALTER TABLE archive_errors ADD COLUMN stage text NOT NULL DEFAULT 'archive'
    CHECK (stage IN ('archive', 'decode'));
ALTER TABLE archive_errors DROP CONSTRAINT archive_errors_pkey;
ALTER TABLE archive_errors ADD PRIMARY KEY (topic, stage);
