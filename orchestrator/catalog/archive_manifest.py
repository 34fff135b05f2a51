"""The archive's manifest in the catalog: which segments exist, per lineage and partition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.archive_model.deletion import Deletion
from orchestrator.archive_model.segments import ArchiveError, Lineage, Segment
from orchestrator.catalog.db import qualified
from orchestrator.log_identity import LogIdentity

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


@dataclass(frozen=True)
class KnownLog:
    """A row of archive_lineages: a log identity the archive has met, and its root lineage."""

    identity: Lineage  # the topic as a broker holds it (cluster id, topic, topic id)
    root: Lineage  # the lineage whose segments it writes and whose offsets it continues
    partitions: int
    restoring: bool  # a restore not yet checked against the manifest
    ended: bool = False  # its topic was found deleted (or replaced) on its broker


_LINEAGE_COLUMNS = ("cluster_id", "topic", "topic_id", "partitions", "root_cluster_id",
                    "root_topic_id", "state")


def known_logs(conn: psycopg.Connection, schema: str) -> list[KnownLog]:
    """Every log identity met, newest last."""
    rows = conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY seen_at, topic").format(
        sql.SQL(", ").join(map(sql.Identifier, _LINEAGE_COLUMNS)),
        qualified(schema, "archive_lineages"))).fetchall()
    return [KnownLog(Lineage(cluster, topic, topic_id), Lineage(root_cluster, topic, root_id),
                     partitions, state == "restoring", state == "ended")
            for cluster, topic, topic_id, partitions, root_cluster, root_id, state in rows]


def end_lineages(conn: psycopg.Connection, schema: str, identities: Sequence[Lineage]) -> None:
    """The topics ``identities`` name were found deleted, or replaced, on their broker."""
    for identity in identities:
        conn.execute(sql.SQL("UPDATE {} SET state = 'ended', ended_at = now() WHERE "
                             "cluster_id = %s AND topic = %s AND topic_id = %s AND "
                             "state = 'live'").format(qualified(schema, "archive_lineages")),
                     (identity.cluster_id, identity.topic, identity.topic_id))


def end_deleted(conn: psycopg.Connection, schema: str, topic: str, deletion: Deletion) -> int:
    """A client deleted ``topic`` (the stack's ack ledger saw it): end its live lineages of the
    ids deleted, or, where a deletion's id is unknown, those the archive met before it (the
    proxy's clock against PostgreSQL's); how many."""
    which = (sql.SQL("topic_id = ANY(%s)") if deletion.by_id
             else sql.SQL("seen_at < to_timestamp(%s / 1000.0)"))
    return conn.execute(
        sql.SQL("UPDATE {} SET state = 'ended', ended_at = now() WHERE topic = %s AND "
                "state = 'live' AND {}").format(qualified(schema, "archive_lineages"), which),
        (topic, sorted(deletion.topic_ids) if deletion.by_id else deletion.at_ms)).rowcount


def root_of(conn: psycopg.Connection, schema: str, identity: Lineage, partitions: int
            ) -> KnownLog:
    """The known log ``identity`` is: a topic met for the first time becomes a root."""
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s, %s, %s, 'live') "
                "ON CONFLICT (cluster_id, topic, topic_id) DO UPDATE "
                "SET partitions = GREATEST({t}.partitions, EXCLUDED.partitions), "
                # Found on its broker again, same id: a listing that missed it ended it.
                "state = CASE WHEN {t}.state = 'ended' THEN 'live' ELSE {t}.state END, "
                "ended_at = NULL").format(
            qualified(schema, "archive_lineages"),
            sql.SQL(", ").join(map(sql.Identifier, _LINEAGE_COLUMNS)),
            t=sql.Identifier("archive_lineages")),
        (identity.cluster_id, identity.topic, identity.topic_id, partitions,
         identity.cluster_id, identity.topic_id))
    row = conn.execute(
        sql.SQL("SELECT root_cluster_id, root_topic_id, partitions, state FROM {} "
                "WHERE cluster_id = %s AND topic = %s AND topic_id = %s").format(
            qualified(schema, "archive_lineages")),
        (identity.cluster_id, identity.topic, identity.topic_id)).fetchone()
    assert row is not None
    return KnownLog(identity, Lineage(row[0], identity.topic, row[1]), row[2],
                    row[3] == "restoring")


def begin_restore(conn: psycopg.Connection, schema: str, identity: Lineage, root: Lineage,
                  partitions: int) -> None:
    """``identity`` (a topic just created) is being filled with ``root``'s records."""
    conn.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s, %s, %s, 'restoring')").format(
            qualified(schema, "archive_lineages"),
            sql.SQL(", ").join(map(sql.Identifier, _LINEAGE_COLUMNS))),
        (identity.cluster_id, identity.topic, identity.topic_id, partitions, root.cluster_id,
         root.topic_id))


def end_restore(conn: psycopg.Connection, schema: str, identity: Lineage) -> None:
    conn.execute(sql.SQL("UPDATE {} SET state = 'live', seen_at = now() WHERE cluster_id = %s "
                         "AND topic = %s AND topic_id = %s").format(
        qualified(schema, "archive_lineages")),
        (identity.cluster_id, identity.topic, identity.topic_id))


def forget(conn: psycopg.Connection, schema: str, identity: Lineage) -> None:
    """A restore that failed: its topic is deleted, and it continues nothing."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE cluster_id = %s AND topic = %s AND "
                         "topic_id = %s").format(qualified(schema, "archive_lineages")),
                 (identity.cluster_id, identity.topic, identity.topic_id))


def note_log_ends(conn: psycopg.Connection, schema: str, root: Lineage,
                  ends: dict[int, int]) -> None:
    """The log ends seen now, per partition of ``root`` (kept if higher than before)."""
    for partition, end in ends.items():
        conn.execute(
            sql.SQL("INSERT INTO {} (cluster_id, topic, topic_id, partition, log_end) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (cluster_id, topic, topic_id, "
                    "partition) DO UPDATE SET log_end = GREATEST({}.log_end, EXCLUDED.log_end), "
                    "seen_at = now()").format(qualified(schema, "archive_log_ends"),
                                              sql.Identifier("archive_log_ends")),
            (root.cluster_id, root.topic, root.topic_id, partition, end))


def start_log_ends(conn: psycopg.Connection, schema: str, root: Lineage,
                   ends: dict[int, int]) -> None:
    """A new broker life of ``root`` begins at ``ends`` (a restore's): the ends a lost life
    reached were reported, and must not be reported again after the next crash."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE cluster_id = %s AND topic = %s AND "
                         "topic_id = %s").format(qualified(schema, "archive_log_ends")),
                 (root.cluster_id, root.topic, root.topic_id))
    note_log_ends(conn, schema, root, ends)


def log_ends(conn: psycopg.Connection, schema: str, root: Lineage) -> dict[int, int]:
    rows = conn.execute(
        sql.SQL("SELECT partition, log_end FROM {} WHERE cluster_id = %s AND topic = %s AND "
                "topic_id = %s").format(qualified(schema, "archive_log_ends")),
        (root.cluster_id, root.topic, root.topic_id)).fetchall()
    return {int(p): int(e) for p, e in rows}


def noted_log_ends(conn: psycopg.Connection, schema: str) -> dict[tuple[str, str, int], int]:
    """{(topic, "<cluster id>-<topic id>" of the root lineage, partition): highest end noted}."""
    rows = conn.execute(sql.SQL("SELECT topic, cluster_id || '-' || topic_id, partition, log_end "
                                "FROM {}").format(qualified(schema, "archive_log_ends")))
    return {(str(t), str(lineage), int(p)): int(e) for t, lineage, p, e in rows.fetchall()}


def held_spans(conn: psycopg.Connection, schema: str, identity: LogIdentity | None,
               topics: Sequence[str]) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (first offset, end offset)} that the archive holds of the log
    ``identity`` names (its segments are contiguous, see :func:`record`). Empty for a log the
    archive never met, one whose restore is unchecked, or one with no identity recorded."""
    if identity is None or identity.cluster_id is None:
        return {}
    held: dict[tuple[str, int], tuple[int, int]] = {}
    for topic in topics:
        topic_id = identity.topics.get(topic)
        if topic_id is None:
            continue
        rows = conn.execute(sql.SQL(
            "SELECT s.partition, min(s.first_offset), max(s.end_offset) FROM {lineages} l "
            "JOIN {segments} s ON s.cluster_id = l.root_cluster_id AND s.topic = l.topic "
            "AND s.topic_id = l.root_topic_id WHERE l.cluster_id = %s AND l.topic = %s "
            "AND l.topic_id = %s AND l.state = 'live' GROUP BY s.partition").format(
                lineages=qualified(schema, "archive_lineages"),
                segments=qualified(schema, "archive_segments")),
            (identity.cluster_id, topic, topic_id)).fetchall()
        held.update({(topic, int(p)): (int(first), int(end)) for p, first, end in rows})
    return held


# The stages of a continuous archiver's pass whose errors stop one topic's part of it.
ARCHIVING, DECODING = "archive", "decode"


def note_error(conn: psycopg.Connection, schema: str, topic: str, error: str,
               stage: str = ARCHIVING) -> bool:
    """A pass's ``stage`` stopped on ``topic`` with ``error``; whether that error is new."""
    before = conn.execute(sql.SQL("SELECT error FROM {} WHERE topic = %s AND stage = %s FOR "
                                  "UPDATE").format(qualified(schema, "archive_errors")),
                          (topic, stage)).fetchone()
    conn.execute(sql.SQL("INSERT INTO {} (topic, stage, error) VALUES (%s, %s, %s) ON CONFLICT "
                         "(topic, stage) DO UPDATE SET error = EXCLUDED.error, seen_at = now()")
                 .format(qualified(schema, "archive_errors")), (topic, stage, error))
    return before is None or before[0] != error


def clear_errors(conn: psycopg.Connection, schema: str, topics: Sequence[str],
                 stage: str = ARCHIVING) -> None:
    """A pass's ``stage`` went through for ``topics``: their errors of that stage are over."""
    if topics:
        conn.execute(sql.SQL("DELETE FROM {} WHERE topic = ANY(%s) AND stage = %s").format(
            qualified(schema, "archive_errors")), (list(topics), stage))


def errors(conn: psycopg.Connection, schema: str) -> dict[str, str]:
    """{topic: the errors that stop its archiving or its decoding, in one line}."""
    rows = conn.execute(sql.SQL("SELECT topic, stage, error FROM {} ORDER BY topic, stage")
                        .format(qualified(schema, "archive_errors"))).fetchall()
    found: dict[str, str] = {}
    for topic, stage, error in rows:
        said = f"decoding: {error}" if stage == DECODING else str(error)
        found[str(topic)] = f"{found[topic]}; {said}" if topic in found else said
    return found
