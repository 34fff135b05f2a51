"""Which source columns a version declares, given the names its plan reads (pruning.py)."""

from __future__ import annotations

from orchestrator.spark.read.pruning import QUARANTINE_COLUMNS, pruned_columns

FIELDS = ("user_id", "url", "ts", "duration_ms")


def test_only_the_columns_read_in_the_sources_order() -> None:
    assert pruned_columns(frozenset({"duration_ms", "url", "views"}), FIELDS) == (
        "url", "duration_ms")
    assert pruned_columns(frozenset({"url", "kafka_timestamp"}), FIELDS) == (
        "kafka_timestamp", "url")


def test_a_batch_job_keeps_the_offsets_for_its_quarantine() -> None:
    assert pruned_columns(frozenset({"url"}), FIELDS, QUARANTINE_COLUMNS) == (
        "kafka_topic", "kafka_partition", "kafka_offset", "url")


def test_names_match_without_regard_to_case_as_spark_resolves_them() -> None:
    assert pruned_columns(frozenset({"URL"}), FIELDS) == ("url",)


def test_every_column_or_an_unreadable_plan_prunes_nothing() -> None:
    every = frozenset({"kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp",
                       "kafka_key", "kafka_headers", *FIELDS})
    assert pruned_columns(every, FIELDS) is None
    assert pruned_columns(None, FIELDS) is None


def test_a_plan_that_reads_no_column_still_gets_a_row_per_record() -> None:
    assert pruned_columns(frozenset({"count"}), FIELDS) == ("kafka_partition",)
