"""The decoded segments' manifest in the catalog: which decodings exist, and which raw segments
each has decoded."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.archive_model.decoding import DecodedSegment, Decoding
from orchestrator.archive_model.segments import Lineage
from orchestrator.catalog.db import qualified

_COLUMNS = ("decoding", "cluster_id", "topic", "topic_id", "partition", "first_offset",
            "end_offset", "rows", "dead_letters", "bytes", "checksum", "raw_checksum", "path")


def register(conn: psycopg.Connection, schema: str, decoding: Decoding) -> None:
    conn.execute(sql.SQL("INSERT INTO {} (decoding, spec) VALUES (%s, %s) ON CONFLICT DO NOTHING")
                 .format(qualified(schema, "archive_decodings")),
                 (decoding.fingerprint, Jsonb(decoding.to_json())))


def decodings(conn: psycopg.Connection, schema: str) -> dict[str, Decoding]:
    rows = conn.execute(sql.SQL("SELECT decoding, spec FROM {} ORDER BY created_at")
                        .format(qualified(schema, "archive_decodings"))).fetchall()
    return {str(fp): Decoding.from_json(spec) for fp, spec in rows}


def holds_any(conn: psycopg.Connection, schema: str) -> bool:
    """Whether the archive holds any decoded segment (False before migration 019 ran)."""
    table = qualified(schema, "archive_decoded")
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                          (table.as_string(conn),)).fetchone()
    if not exists or not exists[0]:
        return False
    found = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table)).fetchone()
    return bool(found and found[0])


def _from_row(row: tuple[Any, ...]) -> DecodedSegment:
    fp, cluster, topic, topic_id, partition, first, end, rows, dead, size, digest, raw, path = row
    return DecodedSegment(fp, Lineage(cluster, topic, topic_id), partition, first, end, rows,
                          dead, size, digest, raw, path)


def decoded(conn: psycopg.Connection, schema: str, lineage: Lineage | None = None,
            decoding: str | None = None) -> list[DecodedSegment]:
    """Decoded segments in offset order, of one lineage and decoding, or of all."""
    where: list[str] = []
    args: list[object] = []
    if lineage is not None:
        where.append("cluster_id = %s AND topic = %s AND topic_id = %s")
        args += [lineage.cluster_id, lineage.topic, lineage.topic_id]
    if decoding is not None:
        where.append("decoding = %s")
        args.append(decoding)
    query = sql.SQL("SELECT {} FROM {} {} ORDER BY decoding, cluster_id, topic, topic_id, "
                    "partition, first_offset").format(
        sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)), qualified(schema, "archive_decoded"),
        sql.SQL("WHERE " + " AND ".join(where) if where else ""))
    return [_from_row(r) for r in conn.execute(query, args).fetchall()]


def record(conn: psycopg.Connection, schema: str, segment: DecodedSegment) -> None:
    """Record a decoded segment whose file is in place; a rebuilt one replaces its row."""
    s = segment
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (decoding, cluster_id, topic, "
                "topic_id, partition, first_offset) DO UPDATE SET rows = EXCLUDED.rows, "
                "dead_letters = EXCLUDED.dead_letters, bytes = EXCLUDED.bytes, "
                "checksum = EXCLUDED.checksum, raw_checksum = EXCLUDED.raw_checksum, "
                "path = EXCLUDED.path, decoded_at = now()").format(
            qualified(schema, "archive_decoded"),
            sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)),
            sql.SQL(", ").join(sql.Placeholder() * len(_COLUMNS))),
        (s.decoding, s.lineage.cluster_id, s.lineage.topic, s.lineage.topic_id, s.partition,
         s.first_offset, s.end_offset, s.rows, s.dead_letters, s.bytes, s.checksum,
         s.raw_checksum, s.path))


def forget(conn: psycopg.Connection, schema: str, decoding: str, lineage: Lineage, *,
           keep_decoding: bool = False) -> int:
    """Remove the rows of one decoding's segments of ``lineage``, and the decoding once it has
    none left (unless ``keep_decoding``); returns how many rows there were."""
    removed = conn.execute(sql.SQL(
        "DELETE FROM {} WHERE decoding = %s AND cluster_id = %s AND topic = %s AND topic_id = %s")
        .format(qualified(schema, "archive_decoded")),
        (decoding, lineage.cluster_id, lineage.topic, lineage.topic_id)).rowcount
    if keep_decoding:
        return int(removed)
    conn.execute(sql.SQL("DELETE FROM {} d WHERE decoding = %s AND NOT EXISTS "
                         "(SELECT 1 FROM {} s WHERE s.decoding = d.decoding)").format(
        qualified(schema, "archive_decodings"), qualified(schema, "archive_decoded")),
        (decoding,))
    return int(removed)


def counts(conn: psycopg.Connection, schema: str, lineage: Lineage, decoding: str
           ) -> tuple[int, int]:
    """(segments decoded under ``decoding`` as the manifest holds them now, segments) of
    ``lineage``."""
    row = conn.execute(sql.SQL(
        "SELECT count(d.decoding), count(*) FROM {segments} s LEFT JOIN {decoded} d "
        "ON d.decoding = %s AND d.cluster_id = s.cluster_id AND d.topic = s.topic "
        "AND d.topic_id = s.topic_id AND d.partition = s.partition "
        "AND d.first_offset = s.first_offset AND d.raw_checksum = s.checksum "
        "WHERE s.cluster_id = %s AND s.topic = %s AND s.topic_id = %s").format(
            segments=qualified(schema, "archive_segments"),
            decoded=qualified(schema, "archive_decoded")),
        (decoding, lineage.cluster_id, lineage.topic, lineage.topic_id)).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)
