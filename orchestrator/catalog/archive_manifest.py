"""The archive's manifest in the catalog: which segments exist, per lineage and partition."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from orchestrator.archive.segments import ArchiveError, Lineage, Segment
from orchestrator.catalog.db import qualified

_COLUMNS = ("cluster_id", "topic", "topic_id", "partition", "first_offset", "end_offset",
            "records", "gap_offsets", "bytes", "checksum", "path")


def _from_row(row: tuple[Any, ...]) -> Segment:
    cluster, topic, topic_id, partition, first, end, records, gaps, size, digest, path = row
    return Segment(Lineage(cluster, topic, topic_id), partition, first, end, records,
                   tuple(gaps), size, digest, path)


def segments(conn: psycopg.Connection, schema: str, lineage: Lineage | None = None,
             partition: int | None = None) -> list[Segment]:
    """Segments in offset order, of one lineage (and partition) or of all."""
    where: list[str] = []
    args: list[object] = []
    if lineage is not None:
        where.append("cluster_id = %s AND topic = %s AND topic_id = %s")
        args += [lineage.cluster_id, lineage.topic, lineage.topic_id]
    if partition is not None:
        where.append("partition = %s")
        args.append(partition)
    query = sql.SQL("SELECT {} FROM {} {} ORDER BY cluster_id, topic, topic_id, partition, "
                    "first_offset").format(
        sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)), qualified(schema, "archive_segments"),
        sql.SQL("WHERE " + " AND ".join(where) if where else ""))
    return [_from_row(r) for r in conn.execute(query, args).fetchall()]


def _lock_key(lineage: Lineage, partition: int) -> str:
    return f"kappa-archive/{lineage.directory(partition)}"


def lock_partition(conn: psycopg.Connection, lineage: Lineage, partition: int) -> None:
    """One writer per partition at a time (inside the caller's transaction)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                 (_lock_key(lineage, partition),))


def claim_partition(conn: psycopg.Connection, lineage: Lineage, partition: int) -> bool:
    """Claim a partition for this session's archiver until ``release_partition``: False when
    another archiver (the agent's, say) holds it, which then writes it alone."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                       (_lock_key(lineage, partition),)).fetchone()
    return bool(row and row[0])


def release_partition(conn: psycopg.Connection, lineage: Lineage, partition: int) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))",
                 (_lock_key(lineage, partition),))


def record(conn: psycopg.Connection, schema: str, segment: Segment) -> None:
    """Append ``segment`` to its partition: it must start where the last recorded one ends
    (or the partition has none). Call inside a transaction."""
    lineage, partition = segment.lineage, segment.partition
    lock_partition(conn, lineage, partition)
    row = conn.execute(
        sql.SQL("SELECT max(end_offset) FROM {} WHERE cluster_id = %s AND topic = %s AND "
                "topic_id = %s AND partition = %s").format(qualified(schema, "archive_segments")),
        (lineage.cluster_id, lineage.topic, lineage.topic_id, partition)).fetchone()
    last_end = row[0] if row else None
    if last_end is not None and last_end != segment.first_offset:
        raise ArchiveError(
            f"segment {segment.path} starts at {segment.first_offset}, but the archive of "
            f"{lineage.topic}/{partition} ends at {last_end}: another archiver wrote it "
            "meanwhile; run one `kappa archive run` per catalog")
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            qualified(schema, "archive_segments"),
            sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)),
            sql.SQL(", ").join(sql.Placeholder() * len(_COLUMNS))),
        (lineage.cluster_id, lineage.topic, lineage.topic_id, partition, segment.first_offset,
         segment.end_offset, segment.records, list(segment.gap_offsets), segment.bytes,
         segment.checksum, segment.path))
