"""The archive of the log: the archiver, the Parquet segment store, decode passes, verify and
restore. Its domain is orchestrator/archive_model/."""
