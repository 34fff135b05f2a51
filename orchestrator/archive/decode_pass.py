"""Who decodes: after each archive pass, every raw segment of a lineage that a version reads is
decoded under that version's decoding, once; a decoded segment found missing or bad is rebuilt
from its raw segment; a decoding that no version uses any more is removed on command only.

A decoded segment's file is written whole and put in place before its manifest row is
recorded, as a raw segment's is; the row names the raw segment it came from by its checksum.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.archive.decoder import decode, file_checksum
from orchestrator.archive.parquet_store import ParquetStore, parquet_bytes
from orchestrator.archive_model.decoding import (
    DecodedSegment,
    Decoding,
    DecodingProgress,
    decoded_path,
)
from orchestrator.archive_model.segments import ArchiveError, Lineage, Segment
from orchestrator.catalog import archive_manifest as manifest
from orchestrator.catalog import decoded_manifest
from orchestrator.failpoints import fail_point
from orchestrator.models import DEAD, DeployedVersion
from orchestrator.record_parsers import WriterSchemas
from orchestrator.states import RunState

log = logging.getLogger("kappa.archive")


@dataclass(frozen=True)
class Use:
    """A root lineage that a version which is not retired reads, and its decoding there."""

    lineage: Lineage
    decoding: Decoding


def uses(conn: psycopg.Connection, schema: str) -> list[Use]:
    """What the versions that are not retired read, per root lineage and decoding."""
    from orchestrator.catalog import runs, versions

    roots = {k.identity: k.root for k in manifest.known_logs(conn, schema)}
    found: dict[tuple[Lineage, str], Use] = {}
    for version in versions.list_all(conn, schema):
        identity = version.log_identity
        if identity is None or identity.cluster_id is None or \
                runs.get(conn, schema, version.id).state is RunState.RETIRED:
            continue
        for source in version.spec.inputs:
            topic_id = identity.topics.get(source.topic)
            if topic_id is None:
                continue
            seen = Lineage(identity.cluster_id, source.topic, topic_id)
            root = roots.get(seen)
            if root is not None:
                decoding = Decoding.of(source)
                found.setdefault((root, decoding.fingerprint), Use(root, decoding))
    return list(found.values())


def version_progress(conn: psycopg.Connection, schema: str, version: DeployedVersion
                     ) -> tuple[int, int] | None:
    """(segments decoded under the version's decodings, segments) of the lineages it reads;
    None (unknown, not 0) where the archive holds nothing of its log."""
    identity = version.log_identity
    if identity is None or identity.cluster_id is None:
        return None
    roots = {k.identity: k.root for k in manifest.known_logs(conn, schema)}
    found: tuple[int, int] | None = None
    for source in version.spec.inputs:
        topic_id = identity.topics.get(source.topic)
        root = roots.get(Lineage(identity.cluster_id, source.topic, topic_id or ""))
        if root is not None:
            done, held = decoded_manifest.counts(conn, schema, root,
                                                 Decoding.of(source).fingerprint)
            found = (done, held) if found is None else (found[0] + done, found[1] + held)
    return found


def decoded_table(store: ParquetStore, segment: Segment, decoding: Decoding,
                  registry: WriterSchemas | None = None) -> pa.Table:
    """One raw segment (read and checked against its manifest row), decoded; Avro and
    Protobuf values with ``registry``'s writer schemas."""
    from orchestrator.archive.table_checksum import table_checksum

    fail_point("archive.decode")
    raw = store.read_table(segment.path)
    if raw.num_rows != segment.records or table_checksum(raw) != segment.checksum:
        raise ArchiveError(f"segment {store.location(segment.path)} differs from the archive's "
                           "manifest: run `kappa archive verify`, then restore it from a backup")
    return decode(raw, decoding, segment.lineage.topic, segment.partition, registry)


def decode_segment(store: ParquetStore, segment: Segment, decoding: Decoding,
                   registry: WriterSchemas | None = None) -> tuple[DecodedSegment, pa.Table]:
    """Decode one raw segment and put the file in place; the caller records the row."""
    table = decoded_table(store, segment, decoding, registry)
    data = parquet_bytes(table, plain=("kafka_offset", "kafka_timestamp"))
    path = decoded_path(decoding.fingerprint, segment.lineage, segment.partition,
                        segment.first_offset, segment.end_offset)
    size = store.write_bytes(path, data)
    dead = int(pa.compute.sum(table.column(DEAD)).as_py() or 0)
    return DecodedSegment(decoding.fingerprint, segment.lineage, segment.partition,
                          segment.first_offset, segment.end_offset, table.num_rows - dead, dead,
                          size, file_checksum(data), segment.checksum, path), table


def rebuild(conn: psycopg.Connection, schema: str, store: ParquetStore, path: str,
            registry: WriterSchemas | None = None) -> pa.Table:
    """Decode again, from its raw segment, the decoded segment recorded at ``path`` (its file
    missing or bad), put it in place and record it; returns its table."""
    with conn.transaction():
        found = [d for d in decoded_manifest.decoded(conn, schema) if d.path == path]
        if not found:
            raise ArchiveError(f"no decoded segment is recorded at {store.location(path)}: run "
                               "`kappa archive status`")
        was = found[0]
        raw = [s for s in manifest.segments(conn, schema, was.lineage, was.partition)
               if s.first_offset == was.first_offset]
        decoding = decoded_manifest.decodings(conn, schema).get(was.decoding)
    if not raw or decoding is None:
        raise ArchiveError(f"decoded segment {store.location(path)} has no raw segment or "
                           "decoding left to rebuild it from: run `kappa archive verify`")
    segment, table = decode_segment(store, raw[0], decoding, registry)
    with conn.transaction():
        decoded_manifest.record(conn, schema, segment)
    return table


def decode_pending(conn: psycopg.Connection, schema: str, store: ParquetStore,
                   topics: Sequence[str] | None = None,
                   on_decoded: Callable[[DecodedSegment], None] = lambda _: None,
                   on_error: Callable[[Use, Exception], None] | None = None,
                   registry: WriterSchemas | None = None) -> list[DecodedSegment]:
    """Decode every raw segment that a use lacks (of ``topics``, or all); returns them. An error
    stops the pass, unless ``on_error`` takes it (it may raise it): then it stops that use's
    decoding only, and the other uses go on."""
    with conn.transaction():
        wanted = [u for u in uses(conn, schema) if topics is None or u.lineage.topic in topics]
    written: list[DecodedSegment] = []
    for use in wanted:
        fingerprint = use.decoding.fingerprint
        with conn.transaction():
            decoded_manifest.register(conn, schema, use.decoding)
            raw = manifest.segments(conn, schema, use.lineage)
            done = {(d.partition, d.first_offset): d.raw_checksum for d in
                    decoded_manifest.decoded(conn, schema, use.lineage, fingerprint)}
        todo = [s for s in raw if done.get((s.partition, s.first_offset)) != s.checksum]
        if not todo or not _claim(conn, use):
            continue
        try:
            for segment in todo:
                decoded, _ = decode_segment(store, segment, use.decoding, registry)
                with conn.transaction():
                    # Again with its row: a prune may have forgotten the decoding meanwhile.
                    decoded_manifest.register(conn, schema, use.decoding)
                    decoded_manifest.record(conn, schema, decoded)
                written.append(decoded)
                on_decoded(decoded)
        except Exception as exc:
            if on_error is None or conn.broken:
                raise
            on_error(use, exc)
        finally:
            if not conn.closed and not conn.broken:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))",
                             (_lock_key(use),))
    return written


def _lock_key(use: Use) -> str:
    return f"kappa-decode/{use.decoding.fingerprint}/{use.lineage.cluster_id}-" \
           f"{use.lineage.topic_id}/{use.lineage.topic}"


def _claim(conn: psycopg.Connection, use: Use) -> bool:
    """One decoder per decoding and lineage at a time: another archiver's pass decodes it."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                       (_lock_key(use),)).fetchone()
    return bool(row and row[0])


def progress(conn: psycopg.Connection, schema: str) -> list[DecodingProgress]:
    """Per decoding and lineage decoded or in use: raw segments against decoded ones."""
    with conn.transaction():
        in_use = {(u.decoding.fingerprint, u.lineage) for u in uses(conn, schema)}
        raw: dict[Lineage, int] = {}
        for s in manifest.segments(conn, schema):
            raw[s.lineage] = raw.get(s.lineage, 0) + 1
        done: dict[tuple[str, Lineage], list[DecodedSegment]] = {}
        for d in decoded_manifest.decoded(conn, schema):
            done.setdefault((d.decoding, d.lineage), []).append(d)
    keys = sorted(in_use | set(done), key=lambda k: (k[1].topic, k[0], k[1].topic_id))
    return [DecodingProgress(
        decoding=fp, root=lineage, in_use=(fp, lineage) in in_use, raw_segments=raw.get(lineage, 0),
        decoded_segments=len(done.get((fp, lineage), [])),
        rows=sum(d.rows for d in done.get((fp, lineage), [])),
        dead_letters=sum(d.dead_letters for d in done.get((fp, lineage), [])),
        bytes=sum(d.bytes for d in done.get((fp, lineage), []))) for fp, lineage in keys]


def prune_unused(conn: psycopg.Connection, schema: str, store: ParquetStore, *,
                 dry_run: bool = False) -> list[DecodingProgress]:
    """Remove the decoded segments of each lineage that no version reads under their decoding
    any more (rows, then files); returns what was (with ``dry_run``: would be) removed."""
    found = progress(conn, schema)
    unused = [p for p in found if not p.in_use and p.decoded_segments]
    if dry_run:
        return unused
    # A decoding that a version reads on another lineage stays, even with no segment yet: a
    # pass may be decoding its first one.
    used = {p.decoding for p in found if p.in_use}
    for p in unused:
        with conn.transaction():
            # Where the rows say the files are, too: ones decoded before lineage folders named
            # topic ids in base64url stand under a folder of the id as it came.
            recorded = {d.path.rsplit("/", 2)[0]
                        for d in decoded_manifest.decoded(conn, schema, p.root, p.decoding)}
            decoded_manifest.forget(conn, schema, p.decoding, p.root,
                                    keep_decoding=p.decoding in used)
        for directory in sorted(recorded | {p.directory}):
            store.remove_tree(directory)
        log.info("removed %d decoded segments of %s (lineage %s, decoding %s): no version reads "
                 "them", p.decoded_segments, p.topic, p.lineage, p.decoding)
    return unused


def verify_decoded(conn: psycopg.Connection, schema: str, store: ParquetStore,
                   topics: Sequence[str] = (), registry: WriterSchemas | None = None
                   ) -> tuple[int, list[str]]:
    """Check every decoded segment (of ``topics``) against its checksum; one missing or bad is
    rebuilt from its raw segment, and one line names it. Returns (checked, rebuilt paths)."""
    with conn.transaction():
        found = [d for d in decoded_manifest.decoded(conn, schema)
                 if not topics or d.lineage.topic in topics]
    rebuilt = []
    for d in found:
        try:
            read_decoded(store, d.path, d.checksum, columns=("kafka_offset",))
        except ArchiveError as exc:
            log.warning("decoded segment %s is missing or bad (%s); rebuilt from its raw "
                        "segment", store.location(d.path), exc)
            rebuild(conn, schema, store, d.path, registry)
            rebuilt.append(d.path)
    return len(found), rebuilt


def read_or_rebuild(connect: Callable[[], psycopg.Connection], schema: str, store: ParquetStore,
                    path: str, checksum: str, columns: Sequence[str],
                    registry: WriterSchemas | None = None) -> pa.Table:
    """A decoded segment's ``columns``, once its file matches its checksum; one missing or bad
    is rebuilt from its raw segment, and one line names it. Readers that find it bad together
    (read tasks of one segment) take turns: one rebuilds it, the others read what it put in
    place."""
    try:
        return read_decoded(store, path, checksum, columns)
    except ArchiveError:
        return rebuild_unless_mended(connect, schema, store, path, checksum, columns, registry)


def rebuild_unless_mended(connect: Callable[[], psycopg.Connection], schema: str,
                          store: ParquetStore, path: str, checksum: str,
                          columns: Sequence[str], registry: WriterSchemas | None = None
                          ) -> pa.Table:
    """``read_or_rebuild`` for a file already found missing or bad: under the segment's lock,
    read it again (another reader may have rebuilt it meanwhile), else rebuild it."""
    conn = connect()
    key = f"kappa-rebuild/{path}"
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
    try:
        return read_decoded(store, path, checksum, columns)
    except ArchiveError as exc:
        log.warning("decoded segment %s is missing or bad (%s); rebuilt from its raw segment",
                    store.location(path), exc)
        return rebuild(conn, schema, store, path, registry).select(list(columns))
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def read_decoded(store: ParquetStore, path: str, checksum: str,
                 columns: Sequence[str] | None = None) -> pa.Table:
    """A decoded segment's table (``columns`` of it), once its file matches its checksum."""
    data = store.read_bytes(path)
    if file_checksum(data) != checksum:
        raise ArchiveError(f"decoded segment {store.location(path)} differs from its manifest "
                           "checksum")
    # ParquetFile, not read_table: one file needs no dataset discovery (a few ms a file).
    return pq.ParquetFile(pa.BufferReader(data)).read(columns=list(columns) if columns else None)
