"""A batch's read counts, taken from what its read tasks staged (catalog/read_accounting.py),
count every offset once however the batch's attempts cut it into read tasks (#60: one way to
account reads)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = [pytest.mark.integration]

# (first offset, end, records, offsets the archive served, of those from decoded segments)
Task = tuple[int, int, int, int, int]


def _staged_then_counted(settings, topic: str, version_id: int, *attempts: list[Task]) -> object:
    from orchestrator.catalog.db import connect
    from orchestrator.catalog.read_accounting import count_reads
    from orchestrator.service import Orchestrator

    Orchestrator(settings).archive_status([topic])  # the catalog exists now
    schema = settings.catalog_schema
    version = SimpleNamespace(id=version_id, job="counted", version="v1")
    with connect(settings.pg_dsn, autocommit=True) as conn:
        for tasks in attempts:
            for first, end, records, archived, decoded in tasks:
                conn.execute(
                    f'INSERT INTO "{schema}".read_stage (version_id, topic, partition, '
                    "range_start, range_end, records, archived, archived_offsets, "
                    "decoded_offsets) VALUES (%s, %s, 0, %s, %s, %s, %s, %s, %s)",
                    (version_id, topic, first, end, records, archived > 0, archived, decoded))
        reads = count_reads(conn, schema, version, 7, [(topic, 0, 0, 1_000)], 1_000)  # type: ignore[arg-type]
        left = conn.execute(f'SELECT count(*) FROM "{schema}".read_stage WHERE version_id = %s',
                            (version_id,)).fetchone()
    assert left == (0,)  # the commit takes what it counted, and what it did not use
    return reads


@pytest.mark.parametrize(("version_id", "attempts"), [
    # A driver crashed after its one read task staged [0, 1000); its retry, given more cores
    # (Kreps's "bump up the parallelism" of a replay), cut the batch in two.
    (987_701, ([(0, 1_000, 990, 1_000, 400)],
                [(0, 500, 495, 500, 200), (500, 1_000, 495, 500, 200)])),
    # Cuts that do not align, and a crashed attempt that staged only part of its tasks.
    (987_702, ([(0, 600, 594, 600, 240)],
                [(0, 500, 495, 500, 200), (500, 1_000, 495, 500, 200)])),
    # The same cut twice: a task that ran twice (a speculative or retried task).
    (987_703, ([(0, 500, 495, 500, 200), (500, 1_000, 495, 500, 200)],
                [(0, 500, 495, 500, 200), (500, 1_000, 495, 500, 200)])),
], ids=["more-cores", "unaligned-and-partial", "same-cut"])
def test_a_batch_cut_into_other_read_tasks_by_a_retry_counts_every_offset_once(
        settings, topic: str, version_id: int, attempts: tuple[list[Task], ...]) -> None:
    """Every attempt's staged rows tile [0, 1000) or part of it. Keeping one row per first
    offset (DISTINCT ON) counted overlapping rows of two cuts both: 1,500 offsets of a batch
    of 1,000, its gaps and archived offsets with them."""
    from orchestrator.catalog.read_accounting import Reads

    assert _staged_then_counted(settings, topic, version_id, *attempts) == Reads(
        gaps=10, archived=1_000, decoded=400)


def test_a_batch_that_its_tasks_did_not_all_read_counts_what_they_read_once(
        settings, topic: str, caplog: pytest.LogCaptureFixture) -> None:
    """No cut covers the batch (a plan that skipped part of it): what was read is counted once,
    and a line says how much of the batch the read tasks accounted for."""
    from orchestrator.catalog.read_accounting import Reads

    reads = _staged_then_counted(settings, topic, 987_699,
                                 [(0, 600, 594, 600, 0)], [(0, 500, 495, 0, 0)])
    assert reads in (Reads(gaps=6, archived=600, decoded=0), Reads(gaps=5, archived=0, decoded=0))
    assert "read tasks accounted for" in caplog.text
