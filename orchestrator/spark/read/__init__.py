"""The read path: the log's sources (broker, archive, decoded segments) and their parsers."""
