"""The archive's domain (pure; no driver library): segments and lineages, decodings, the log a
version can read through the archive, and how an archived partition is written back. The archive's
adapters (archive/), the catalog and the Kafka producer build on it."""
