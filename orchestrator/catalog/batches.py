"""Exactly-once application of one micro-batch.

The batch's output rows, its dead letters and the offsets it consumed commit in one PostgreSQL
transaction keyed by (version, batch id). Spark replays a batch whose commit it did not record
(e.g. the driver was killed after our commit); the key makes that replay a no-op. The run's
``attempt`` is checked under a row lock, so a driver replaced by a restart cannot write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified
from orchestrator.catalog.output import DEAD_LETTER_COLUMNS
from orchestrator.errors import ConflictError, KappaError
from orchestrator.models import DeployedVersion, Offsets

# "cur" is the alias of the output table's existing row in the upsert below.
_MERGE_SQL = {
    "sum": "COALESCE(cur.{c}, 0) + COALESCE(EXCLUDED.{c}, 0)",
    "min": "LEAST(cur.{c}, EXCLUDED.{c})",
    "max": "GREATEST(cur.{c}, EXCLUDED.{c})",
    "replace": "EXCLUDED.{c}",
}


class StaleDriverError(KappaError):
    """This driver's attempt was replaced by `kappa restart` or a stop: it must exit."""


@dataclass(frozen=True)
class BatchResult:
    applied: bool  # False: the batch had already been applied, nothing was written
    records: int
    output_rows: int
    dead_letters: int


def total_records(start: Offsets, end: Offsets) -> int:
    return sum(end[t][p] - start.get(t, {}).get(p, end[t][p]) for t in end for p in end[t])


def apply_batch(
    conn: psycopg.Connection, catalog_schema: str, data_schema: str, version: DeployedVersion,
    attempt: int, batch_id: int, start: Offsets, end: Offsets,
    output_rows: Sequence[Sequence[Any]], dead_letters: Sequence[Sequence[Any]],
) -> BatchResult:
    records = total_records(start, end)
    with conn.transaction():
        run = conn.execute(
            sql.SQL("SELECT attempt FROM {} WHERE version_id = %s FOR UPDATE")
            .format(qualified(catalog_schema, "runs")), (version.id,)).fetchone()
        if run is None or run[0] != attempt:
            raise StaleDriverError(
                f"driver attempt {attempt} of {version.job} {version.version} was replaced "
                f"(current attempt {run[0] if run else None}); exiting"
            )
        inserted = conn.execute(
            sql.SQL(
                "INSERT INTO {} (version_id, batch_id, attempt, start_offsets, end_offsets, "
                "records, output_rows, dead_letters) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING RETURNING batch_id"
            ).format(qualified(catalog_schema, "batches")),
            (version.id, batch_id, attempt, Jsonb(start), Jsonb(end), records,
             len(output_rows), len(dead_letters)),
        ).fetchone()
        if inserted is None:
            return BatchResult(False, records, 0, 0)
        _check_contiguous(conn, catalog_schema, version, batch_id, start)
        if output_rows:
            _upsert_output(conn, data_schema, version, output_rows)
        if dead_letters:
            _copy_rows(conn, qualified(data_schema, version.dead_letter_table),
                       DEAD_LETTER_COLUMNS, dead_letters)
        _store_offsets(conn, catalog_schema, version.id, end)
    return BatchResult(True, records, len(output_rows), len(dead_letters))


def _check_contiguous(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                      batch_id: int, start: Offsets) -> None:
    """A batch must start exactly where the last applied one ended: no gap, no overlap."""
    rows = conn.execute(
        sql.SQL("SELECT topic, partition, next_offset FROM {} WHERE version_id = %s")
        .format(qualified(schema, "processed_offsets")), (version.id,)).fetchall()
    stored = {(t, str(p)): o for t, p, o in rows}
    expected = stored or {(t, p): o for t, ps in version.log_start.items() for p, o in ps.items()}
    for topic, partitions in start.items():
        for partition, offset in partitions.items():
            want = expected.get((topic, partition))
            if want is not None and want != offset:
                raise ConflictError(
                    f"batch {batch_id} of {version.job} {version.version} starts at "
                    f"{topic}/{partition}@{offset} but the catalog has processed up to {want}: "
                    "the checkpoint and the catalog disagree; redeploy under a new version"
                )


def _copy_rows(conn: psycopg.Connection, table: sql.Composable, columns: Sequence[str],
               rows: Sequence[Sequence[Any]]) -> None:
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
            table, sql.SQL(", ").join(map(sql.Identifier, columns)))) as copy:
        for row in rows:
            copy.write_row(row)


def _upsert_output(conn: psycopg.Connection, data_schema: str, version: DeployedVersion,
                   rows: Sequence[Sequence[Any]]) -> None:
    spec = version.spec
    columns = spec.output_columns
    target = qualified(data_schema, version.output_table)
    conn.execute(sql.SQL(
        "CREATE TEMP TABLE IF NOT EXISTS kappa_staging (LIKE {} INCLUDING DEFAULTS) "
        "ON COMMIT DELETE ROWS").format(target))
    staging = sql.Identifier("kappa_staging")
    _copy_rows(conn, staging, columns, rows)
    updates = [
        sql.SQL("{} = ").format(sql.Identifier(c))
        + sql.SQL(_MERGE_SQL[rule]).format(c=sql.Identifier(c))
        for c, rule in spec.merge
    ]
    action = (sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(updates)) if updates \
        else sql.SQL("DO NOTHING")
    try:
        insert = sql.SQL("INSERT INTO {} AS cur ({}) SELECT {} FROM {} ON CONFLICT ({}) ")
        conn.execute(insert.format(
            target, sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(map(sql.Identifier, columns)), staging,
            sql.SQL(", ").join(map(sql.Identifier, spec.key_columns))) + action)
    except psycopg.errors.CardinalityViolation as exc:
        raise KappaError(
            f"{spec.name} {spec.version}: transform() returned several rows for one key in one "
            f"batch; aggregate by {', '.join(spec.key_columns)} in transform()"
        ) from exc


def _store_offsets(conn: psycopg.Connection, schema: str, version_id: int, end: Offsets) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {} (version_id, topic, partition, next_offset) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (version_id, topic, partition) "
                "DO UPDATE SET next_offset = EXCLUDED.next_offset"
            ).format(qualified(schema, "processed_offsets")),
            [(version_id, t, int(p), o) for t, ps in end.items() for p, o in ps.items()],
        )
