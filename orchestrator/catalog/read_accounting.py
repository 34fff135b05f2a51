"""What a batch's read tasks found, accounted for in its commit: every offset of the batch is an
output row, a dead letter or a gap, and the offsets read from the archive are counted apart.

Read tasks stage what they found (``read_stage``: per range, the records and whether the
archive served it) and the dead letters they read (``dead_letter_stage``); a task that ran twice
staged its range twice, and a batch retried with other cores or another ``chunk_records`` is cut
into other tasks than its crashed attempt was: the commit counts a set of staged ranges that
tiles the batch (``tiling``), so that every offset is counted once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.catalog.db import qualified
from orchestrator.catalog.output import DEAD_LETTER_COLUMNS
from orchestrator.models import DeployedVersion, Offsets

log = logging.getLogger("kappa.batches")


@dataclass(frozen=True)
class Reads:
    gaps: int | None  # offsets that hold no record; None when no read task staged
    archived: int | None  # offsets read from the archive; None when no read task staged
    decoded: int | None = None  # of those, read from decoded segments; None: not known


Range = tuple[str, int, int, int]  # topic, partition, first offset, end (exclusive)
# A staged read task: its first offset, end, records, offsets the archive served, and of those
# the ones its decoded segments served.
Staged = tuple[int, int, int, int, int]


def tiling(lo: int, hi: int, tasks: Sequence[Staged]) -> list[Staged]:
    """Staged tasks that tile [lo, hi) with no overlap, where some do (each attempt's own tasks
    do, once all of them staged); else as much of it as tasks that do not overlap cover. Offsets
    are the nodes and tasks the edges: any path from ``lo`` to ``hi`` is a tiling."""
    starting: dict[int, list[Staged]] = {}
    for task in sorted(set(tasks)):
        starting.setdefault(task[0], []).append(task)
    came_by: dict[int, Staged] = {}
    ahead = [lo]
    while ahead and hi not in came_by:
        for task in starting.get(ahead.pop(), []):
            if task[1] not in came_by and task[1] != lo:
                came_by[task[1]] = task
                ahead.append(task[1])
    exact: list[Staged] | None = None
    if hi in came_by:
        exact, at = [], hi
        while at != lo:
            exact.append(came_by[at])
            at = came_by[at][0]
        exact.reverse()
    if exact is not None:
        return exact
    kept: list[Staged] = []
    for task in sorted(set(tasks), key=lambda t: (t[0], -t[1])):
        if not kept or task[0] >= kept[-1][1]:
            kept.append(task)
    return kept


def ranges_of(start: Offsets, end: Offsets) -> list[Range]:
    return [(t, int(p), start.get(t, {}).get(p, hi), hi)
            for t, ps in end.items() for p, hi in ps.items()]


def _values(ranges: Sequence[Range]) -> tuple[sql.Composable, list[Any]]:
    values = sql.SQL(", ").join(sql.SQL("(%s, %s::integer, %s::bigint, %s::bigint)")
                                for _ in ranges)
    return values, [v for r in ranges for v in r]


def count_reads(conn: psycopg.Connection, catalog_schema: str, version: DeployedVersion,
                batch_id: int, ranges: Sequence[Range], records: int) -> Reads:
    """The batch's offsets that hold no record, and those read from the archive, from what
    its read tasks staged."""
    if not ranges:
        return Reads(0, 0, 0)
    values, params = _values(ranges)
    stage = qualified(catalog_schema, "read_stage")
    rows = conn.execute(sql.SQL(
        "SELECT r.topic, r.partition, r.lo, r.hi, s.range_start, s.range_end, s.records, "
        "coalesce(s.archived_offsets, CASE WHEN s.archived THEN s.range_end - s.range_start "
        "ELSE 0 END), coalesce(s.decoded_offsets, 0) FROM {stage} s "
        "JOIN (VALUES {values}) r(topic, partition, lo, hi) ON s.topic = r.topic "
        "AND s.partition = r.partition AND s.range_start >= r.lo AND s.range_end <= r.hi "
        "WHERE s.version_id = %s"
    ).format(stage=stage, values=values), [*params, version.id]).fetchall()
    staged: dict[Range, list[Staged]] = {}
    for topic, partition, lo, hi, *task in rows:
        staged.setdefault((topic, partition, lo, hi), []).append(tuple(task))  # type: ignore[arg-type]
    counted = [task for (_, _, lo, hi), tasks in staged.items() for task in tiling(lo, hi, tasks)]
    row = (sum(end - first for first, end, *_ in counted) if counted else None,
           sum(end - first - records for first, end, records, *_ in counted),
           sum(t[3] for t in counted), sum(t[4] for t in counted))
    conn.execute(sql.SQL(
        "DELETE FROM {stage} s USING (VALUES {values}) r(topic, partition, lo, hi) "
        "WHERE s.version_id = %s AND s.topic = r.topic AND s.partition = r.partition "
        "AND s.range_end <= r.hi").format(stage=stage, values=values), [*params, version.id])
    covered, gaps, archived, decoded = (row or (None, None, None, None))
    if covered is None:
        return Reads(None, None)
    if covered != records:
        # A query whose plan skipped reading part of the batch (e.g. a transform that filters
        # everything out): those offsets were not read, so they cannot be told apart.
        log.warning("%s %s batch %d: read tasks accounted for %d of its %d offsets", version.job,
                    version.version, batch_id, covered, records)
    return Reads(int(gaps), int(archived or 0), int(decoded or 0))


def move_dead_letters(conn: psycopg.Connection, catalog_schema: str, data_schema: str,
                       version: DeployedVersion, ranges: Sequence[Range]) -> int:
    """Move the dead letters staged for the batch's offsets; a read that ran twice staged them
    twice, and DISTINCT ON keeps one."""
    if not ranges:
        return 0
    values, params = _values(ranges)
    stage = qualified(catalog_schema, "dead_letter_stage")
    columns = sql.SQL(", ").join(map(sql.Identifier, DEAD_LETTER_COLUMNS))
    # Each dead letter carries its partition's log epoch: a log recreated under the version
    # repeats the old one's offsets, and its dead letters must not be taken for the old ones.
    moved = conn.execute(sql.SQL(
        "INSERT INTO {dlq} ({cols}, log_epoch) "
        "SELECT DISTINCT ON (s.topic, s.partition, s.\"offset\") {s_cols}, "
        "coalesce(p.log_epoch, 0) FROM {stage} s JOIN (VALUES {values}) r(topic, partition, lo, "
        "hi) ON s.topic = r.topic AND s.partition = r.partition AND s.\"offset\" >= r.lo "
        "AND s.\"offset\" < r.hi LEFT JOIN {processed} p ON p.version_id = s.version_id "
        "AND p.topic = s.topic AND p.partition = s.partition WHERE s.version_id = %s "
        "ORDER BY s.topic, s.partition, s.\"offset\" ON CONFLICT DO NOTHING"
    ).format(dlq=qualified(data_schema, version.dead_letter_table), cols=columns,
             s_cols=sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(c))
                                       for c in DEAD_LETTER_COLUMNS),
             stage=stage, values=values,
             processed=qualified(catalog_schema, "processed_offsets")),
        [*params, version.id]).rowcount
    conn.execute(sql.SQL(
        "DELETE FROM {stage} s USING (VALUES {values}) r(topic, partition, lo, hi) "
        "WHERE s.version_id = %s AND s.topic = r.topic AND s.partition = r.partition "
        "AND s.\"offset\" < r.hi").format(stage=stage, values=values),
        [*params, version.id])
    return moved


def clear_staged_reads(conn: psycopg.Connection, catalog_schema: str, version_id: int) -> int:
    """Remove every dead letter and read count the version's read tasks staged (those of a
    batch whose plan was forgotten: its offsets will hold other records); how many."""
    cleared = 0
    for table in ("dead_letter_stage", "read_stage"):
        cleared += conn.execute(sql.SQL("DELETE FROM {} WHERE version_id = %s").format(
            qualified(catalog_schema, table)), [version_id]).rowcount
    return cleared
