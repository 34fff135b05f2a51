"""Exactly-once application of one micro-batch.

Executors write a batch's output rows into the version's stage table and its dead letters into
the catalog's dead-letter stage; nothing passes through the driver. The driver then commits the
batch: the staged rows, the dead letters and the offsets it consumed become visible in one
PostgreSQL transaction keyed by (version, batch id). Spark replays a batch whose commit it did not
record (e.g. the driver was killed after our commit); the key makes that replay a no-op. The run's
``attempt`` is checked under a row lock, so a driver replaced by a restart cannot write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified
from orchestrator.catalog.read_accounting import count_reads, move_dead_letters, ranges_of
from orchestrator.errors import ConflictError, KappaError
from orchestrator.lag import total_records
from orchestrator.models import DELETE_COLUMN, DeployedVersion, JobSpec, Offsets
from orchestrator.naming import stage_table

log = logging.getLogger("kappa.batches")

# "cur" is the alias of the output table's existing row in the upsert below.
_MERGE_SQL = {
    "sum": "COALESCE(cur.{c}, 0) + COALESCE(EXCLUDED.{c}, 0)",
    "min": "LEAST(cur.{c}, EXCLUDED.{c})",
    "max": "GREATEST(cur.{c}, EXCLUDED.{c})",
    "replace": "EXCLUDED.{c}",
}


# Aggregates that merge one batch's rows of a key by a MERGE rule (PostgreSQL has no min/max of
# booleans); keyed by "is the column boolean".
_AGGREGATE = {
    False: {"sum": "sum", "min": "min", "max": "max"},
    True: {"min": "bool_and", "max": "bool_or"},
}


class StaleDriverError(KappaError):
    """This driver's attempt was replaced by `kappa restart` or a stop: it must exit."""


@dataclass(frozen=True)
class BatchResult:
    applied: bool  # False: the batch had already been applied, nothing was written
    records: int  # offsets in the batch's ranges
    output_rows: int
    dead_letters: int
    gap_offsets: int = 0  # offsets with no record: transaction markers, aborted, compacted
    archived_offsets: int | None = None  # offsets read from the archive (None: not known)


# Moves a batch's output inside its commit; returns (output rows changed, dead letters added).
Mover = Callable[[psycopg.Connection], tuple[int, int]]


def prune(conn: psycopg.Connection, catalog_schema: str, version_id: int, keep: int) -> int:
    """Fold all but the ``keep`` latest batch records of a version into its summary row;
    return how many were folded. The latest batches stay: replays and audits look at those."""
    batches = qualified(catalog_schema, "batches")
    with conn.transaction():
        row = conn.execute(sql.SQL(
            "SELECT batch_id FROM {} WHERE version_id = %s ORDER BY batch_id DESC "
            "OFFSET %s LIMIT 1").format(batches), (version_id, keep)).fetchone()
        if row is None:
            return 0
        folded = conn.execute(sql.SQL(
            "WITH gone AS (DELETE FROM {b} WHERE version_id = %(v)s AND batch_id <= %(upto)s "
            "RETURNING *) INSERT INTO {s} AS cur (version_id, batches, first_batch_id, "
            "last_batch_id, records, output_rows, dead_letters, gap_offsets, archived_offsets, "
            "decoded_offsets) "
            "SELECT %(v)s, count(*), min(batch_id), max(batch_id), sum(records), "
            "sum(output_rows), sum(dead_letters), coalesce(sum(gap_offsets), 0), "
            "coalesce(sum(archived_offsets), 0), coalesce(sum(decoded_offsets), 0) FROM gone "
            "HAVING count(*) > 0 ON CONFLICT (version_id) DO UPDATE SET "
            "batches = cur.batches + EXCLUDED.batches, "
            "first_batch_id = least(cur.first_batch_id, EXCLUDED.first_batch_id), "
            "last_batch_id = greatest(cur.last_batch_id, EXCLUDED.last_batch_id), "
            "records = cur.records + EXCLUDED.records, "
            "output_rows = cur.output_rows + EXCLUDED.output_rows, "
            "dead_letters = cur.dead_letters + EXCLUDED.dead_letters, "
            "gap_offsets = cur.gap_offsets + EXCLUDED.gap_offsets, "
            # Nothing was read from the archive before it was counted: null there means 0.
            "archived_offsets = coalesce(cur.archived_offsets, 0) + EXCLUDED.archived_offsets, "
            "decoded_offsets = coalesce(cur.decoded_offsets, 0) + EXCLUDED.decoded_offsets "
            "RETURNING batches"
        ).format(b=batches, s=qualified(catalog_schema, "batch_summary")),
            {"v": version_id, "upto": row[0]}).rowcount
    return folded


def dead_letter_total(conn: psycopg.Connection, catalog_schema: str, version_id: int) -> int:
    """Dead letters the version's batches moved, summary included: no scan of the table."""
    row = conn.execute(sql.SQL(
        "SELECT coalesce((SELECT dead_letters FROM {s} WHERE version_id = %(v)s), 0) + "
        "coalesce((SELECT sum(dead_letters) FROM {b} WHERE version_id = %(v)s), 0)").format(
        s=qualified(catalog_schema, "batch_summary"), b=qualified(catalog_schema, "batches")),
        {"v": version_id}).fetchone()
    return int(row[0]) if row else 0


def next_batch_id(conn: psycopg.Connection, catalog_schema: str, version_id: int) -> int:
    row = conn.execute(sql.SQL(
        "SELECT greatest((SELECT max(batch_id) FROM {b} WHERE version_id = %(v)s), "
        "(SELECT last_batch_id FROM {s} WHERE version_id = %(v)s))").format(
        b=qualified(catalog_schema, "batches"), s=qualified(catalog_schema, "batch_summary")),
        {"v": version_id}).fetchone()
    return 0 if row is None or row[0] is None else int(row[0]) + 1


def apply_batch(
    conn: psycopg.Connection, catalog_schema: str, data_schema: str, version: DeployedVersion,
    attempt: int, batch_id: int, start: Offsets, end: Offsets, write_id: str | None,
    *, move: Mover | None = None,
) -> BatchResult:
    """Commit one batch: move the rows that write ``write_id`` staged (output rows) and the
    dead letters staged for the batch's offsets into the version's tables, and store its end
    offsets, all in one transaction keyed by (version, batch id).

    ``move`` replaces the move of one write's rows (a quarantined batch moves several, and
    dead-letters the records that fail): it returns (output rows changed, dead letters added)."""
    records = total_records(start, end)
    with conn.transaction():
        # A quarantine runs Spark jobs inside the batch's transaction: it fences the attempt
        # only after them, so that heartbeats, `kappa stop` and status reads are not blocked
        # on the run row for its whole length (a replaced driver still cannot commit).
        _fence(conn, catalog_schema, version, attempt, lock=move is None)
        applied = conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE version_id = %s AND batch_id = %s")
            .format(qualified(catalog_schema, "batches")), (version.id, batch_id)).fetchone()
        if applied is not None:
            return BatchResult(False, records, 0, 0)
        _check_contiguous(conn, catalog_schema, version, batch_id, start)
        if move is not None:
            output_rows, isolated = move(conn)
            _fence(conn, catalog_schema, version, attempt, lock=True)
        elif write_id is not None:
            output_rows, isolated = move_output(conn, data_schema, version, batch_id, write_id), 0
        else:
            raise KappaError(f"batch {batch_id}: nothing to commit (no write id, no mover)")
        ranges = ranges_of(start, end)
        dead = move_dead_letters(conn, catalog_schema, data_schema, version, ranges) + isolated
        reads = count_reads(conn, catalog_schema, version, batch_id, ranges, records)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (version_id, batch_id, attempt, start_offsets, end_offsets, "
                "records, output_rows, dead_letters, gap_offsets, archived_offsets, "
                "decoded_offsets) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(qualified(catalog_schema, "batches")),
            (version.id, batch_id, attempt, Jsonb(start), Jsonb(end), records, output_rows,
             dead, reads.gaps, reads.archived, reads.decoded),
        )
        _store_offsets(conn, catalog_schema, version.id, end)
    return BatchResult(True, records, output_rows, dead, reads.gaps or 0, reads.archived)


def _fence(conn: psycopg.Connection, schema: str, version: DeployedVersion, attempt: int, *,
           lock: bool) -> None:
    """Refuse the commit of a driver whose attempt was replaced; with ``lock``, hold the run
    row until the commit, so that a restart cannot replace it in between."""
    run = conn.execute(
        sql.SQL("SELECT attempt FROM {} WHERE version_id = %s" + (" FOR UPDATE" if lock else ""))
        .format(qualified(schema, "runs")), (version.id,)).fetchone()
    if run is None or run[0] != attempt:
        raise StaleDriverError(
            f"driver attempt {attempt} of {version.job} {version.version} was replaced "
            f"(current attempt {run[0] if run else None}); exiting")


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


def move_output(conn: psycopg.Connection, data_schema: str, version: DeployedVersion,
                 batch_id: int, write_id: str) -> int:
    """Merge the staged rows of ``write_id`` into the output table; return rows changed."""
    spec = version.spec
    stage = qualified(data_schema, stage_table(spec.name, spec.version))
    target = qualified(data_schema, version.output_table)
    columns = sql.SQL(", ").join(map(sql.Identifier, spec.output_columns))
    keys = sql.SQL(", ").join(map(sql.Identifier, spec.key_columns))
    # Each task's rows commit with the task; a task that ran twice (a retried stage, a
    # speculative copy) staged its rows twice, so only its first attempt's rows count. The
    # attempts are chosen once, so that a late attempt committing meanwhile changes nothing.
    chosen = conn.execute(sql.SQL(
        "SELECT _task, min(_attempt) FROM {} WHERE _write = %s GROUP BY _task"
    ).format(stage), (write_id,)).fetchall()
    if not chosen:
        conn.execute(sql.SQL("DELETE FROM {}").format(stage))
        return 0
    staged = sql.SQL("(SELECT * FROM {} WHERE _write = %(w)s AND (_task, _attempt) IN ({}))") \
        .format(stage, sql.SQL(", ").join(sql.SQL("({}, {})").format(sql.Literal(t),
                                                                      sql.Literal(a))
                                          for t, a in chosen))
    params = {"w": write_id}
    what = f"{spec.name} {spec.version} batch {batch_id}"
    changed = 0
    try:
        deletes = conn.execute(sql.SQL("SELECT count(*) FROM {} s WHERE s._delete").format(
            staged), params).fetchone()
        if deletes and deletes[0]:
            if spec.output_mode == "append":
                raise KappaError(f"{what}: transform() returned rows with {DELETE_COLUMN} = true, "
                                 "but an append job only inserts: use OUTPUT_MODE = \"upsert\"")
            _refuse_delete_and_upsert_of_one_key(conn, staged, spec.key_columns, params, what)
            on_keys = sql.SQL(" AND ").join(
                sql.SQL("t.{c} = s.{c}").format(c=sql.Identifier(k)) for k in spec.key_columns)
            changed += conn.execute(sql.SQL("DELETE FROM {} t USING {} s WHERE s._delete AND {}")
                                    .format(target, staged, on_keys), params).rowcount
        insert = sql.SQL("INSERT INTO {} AS cur ({}) SELECT {} FROM {} s WHERE NOT s._delete") \
            .format(target, columns, _merged_selection(spec) or columns, staged)
        if _merged_selection(spec) is not None:
            insert += sql.SQL(" GROUP BY {}").format(keys)
        if spec.output_mode == "upsert":
            updates = [
                sql.SQL("{} = ").format(sql.Identifier(c))
                + sql.SQL(_MERGE_SQL[rule]).format(c=sql.Identifier(c))
                for c, rule in spec.merge
            ]
            insert += sql.SQL(" ON CONFLICT ({}) ").format(keys) + (
                (sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(updates)) if updates
                else sql.SQL("DO NOTHING"))
        changed += conn.execute(insert, params).rowcount
    except psycopg.errors.CardinalityViolation as exc:
        raise KappaError(
            f"{what}: transform() returned several rows for one key "
            f"({', '.join(spec.key_columns)}) in one batch; aggregate by the key in transform()"
        ) from exc
    except psycopg.errors.NotNullViolation as exc:
        raise KappaError(f"{what}: transform() returned a row with a null key column "
                         f"({_first_line(exc)}); filter or fill null keys in transform()") \
            from exc
    except psycopg.errors.UniqueViolation as exc:
        raise KappaError(f"{what}: an append job inserted a key that the table already holds "
                         f"({_first_line(exc)}); make KEY_COLUMNS unique per output row") from exc
    except psycopg.errors.DataError as exc:
        raise KappaError(f"{what}: an output value does not fit its column "
                         f"({_first_line(exc)}); fix transform() or OUTPUT_SCHEMA") from exc
    # Everything staged is now merged or belongs to a write that was abandoned.
    conn.execute(sql.SQL("DELETE FROM {}").format(stage))
    return changed


def _merged_selection(spec: JobSpec) -> sql.Composable | None:
    """When every value column merges by sum, min or max, several rows of one key in a batch
    (a stream job's deltas, say) merge by the same rules before they meet the table's row."""
    rules = dict(spec.merge)
    if spec.output_mode != "upsert" or not rules or "replace" in rules.values():
        return None
    kinds = dict(spec.output_schema)
    return sql.SQL(", ").join(
        sql.Identifier(c) if c not in rules
        else sql.SQL("{}({})").format(sql.SQL(_AGGREGATE[kinds[c] == "boolean"][rules[c]]),
                                      sql.Identifier(c))
        for c in spec.output_columns)


def _refuse_delete_and_upsert_of_one_key(conn: psycopg.Connection, staged: sql.Composable,
                                         keys: Sequence[str], params: dict[str, Any],
                                         what: str) -> None:
    on_keys = sql.SQL(" AND ").join(
        sql.SQL("d.{c} = u.{c}").format(c=sql.Identifier(k)) for k in keys)
    both = conn.execute(sql.SQL(
        "SELECT 1 FROM {} d JOIN {} u ON {} WHERE d._delete AND NOT u._delete LIMIT 1"
    ).format(staged, staged, on_keys), params).fetchone()
    if both is not None:
        raise KappaError(f"{what}: transform() returned a delete and an upsert for one key "
                         f"({', '.join(keys)}) in one batch; keep one row per key")


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def gap_to_new_log(conn: psycopg.Connection, schema: str, version_id: int, topic: str,
                   partition: int, log_start: int, *, recreated: bool) -> None:
    """Move a partition's position to its log start (``kappa restart --allow-gap``). A
    recreated log starts a new log epoch, and what the old log's reads staged is dropped: its
    offsets would be taken for the new log's."""
    # A partition added to the topic since has no row yet.
    conn.execute(sql.SQL(
        "INSERT INTO {t} (version_id, topic, partition, next_offset) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (version_id, topic, partition) DO UPDATE SET next_offset = "
        "EXCLUDED.next_offset, log_epoch = {t}.log_epoch + %s").format(
        t=qualified(schema, "processed_offsets")),
        (version_id, topic, partition, log_start, 1 if recreated else 0))
    if recreated:
        for stage in ("dead_letter_stage", "read_stage"):
            conn.execute(sql.SQL("DELETE FROM {} WHERE version_id = %s AND topic = %s "
                                 "AND partition = %s").format(qualified(schema, stage)),
                         (version_id, topic, partition))


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
