"""The archive's side of a version's source: what the archive holds of the log the version
reads (on the driver), and read tasks that serve offset ranges from its segments (on the
executors).

A segment is read whole as an Arrow table, checked against the manifest's record count and
checksum, and only then used: a segment that is gone or differs stops the read task, and with
it the batch, naming the segment; it is never skipped, and never read from another lineage (the
driver takes the segments of the lineage the version's log identity belongs to).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from orchestrator.archive.coverage import SegmentRef
from orchestrator.archive_model.segments import ArchiveError, Lineage, Segment
from orchestrator.log_identity import LogIdentity

if TYPE_CHECKING:
    import pyarrow as pa

    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.record_parsers import WriterSchemas

log = logging.getLogger(__name__)
# (offset, timestamp ms, key, value, headers): a record as the Kafka reader gives it
_CHUNK = 20_000  # records handed to the parser at a time: one Arrow batch's worth


def archived_segments(catalog_schema: str, identity_json: str | None, topic: str,
                      root: str) -> dict[int, list[Segment]]:
    """{partition: segments in offset order} of the lineage the version's log belongs to;
    empty when the version recorded no log identity, the archive never met its log, or the
    archive root is not there on this host (then Kafka serves every range, as before)."""
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.catalog import archive_manifest as manifest
    from orchestrator.spark.writer import connection

    identity = LogIdentity.from_json(json.loads(identity_json or "null"))
    topic_id = identity.topics.get(topic) if identity is not None else None
    if identity is None or identity.cluster_id is None or topic_id is None:
        return {}
    seen = Lineage(identity.cluster_id, topic, topic_id)
    conn = connection()
    known = next((k for k in manifest.known_logs(conn, catalog_schema) if k.identity == seen),
                 None)
    if known is None:
        return {}
    found: dict[int, list[Segment]] = {}
    for segment in manifest.segments(conn, catalog_schema, known.root):
        found.setdefault(segment.partition, []).append(segment)
    if found and not _root_exists(ParquetStore(root)):
        log.warning("the archive root %s is not on this host: %s is read from Kafka", root,
                    topic)
        return {}
    return found


def decoded_segments(catalog_schema: str, held: dict[int, list[Segment]], decoding: str
                     ) -> dict[str, tuple[str, str]]:
    """{raw segment path: (decoded path, checksum)} of the ``held`` segments (one lineage's,
    from ``archived_segments``) decoded under ``decoding`` (a fingerprint), where the decoded
    segment is of the raw one as the manifest holds it now."""
    from orchestrator.catalog import decoded_manifest
    from orchestrator.spark.writer import connection

    raw = {(s.partition, s.first_offset): s for segments in held.values() for s in segments}
    if not raw:
        return {}
    lineage = next(iter(raw.values())).lineage
    decoded = decoded_manifest.decoded(connection(), catalog_schema, lineage, decoding)
    found = {}
    for d in decoded:
        segment = raw.get((d.partition, d.first_offset))
        if segment is not None and segment.checksum == d.raw_checksum:
            found[segment.path] = (d.path, d.checksum)
    return found


def _root_exists(store: ParquetStore) -> bool:
    from pyarrow import fs

    return bool(store.fs.get_file_info(store.base).type == fs.FileType.Directory)


# Executor side ---------------------------------------------------------------------------------
_last: dict[str, pa.Table] = {}  # the last segment read by this Python worker


def read_archived(root: str, segments: tuple[SegmentRef, ...], start: int, end: int
                  ) -> Iterator[pa.Table]:
    """The archived records of [start, end) (parquet_store.SCHEMA), in offset order, a chunk at
    a time."""
    from orchestrator.archive.parquet_store import ParquetStore

    store = ParquetStore(root)
    for ref in segments:
        table = _segment(store, ref)
        offsets = table.column("offset").to_numpy()
        lo, hi = (int(i) for i in offsets.searchsorted([start, end]))
        for at in range(lo, hi, _CHUNK):
            yield table.slice(at, min(hi, at + _CHUNK) - at)


def raw_range(root: str, ref: SegmentRef, start: int, end: int) -> pa.Table:
    """The archived records of [start, end) of one raw segment, checked against the manifest."""
    from orchestrator.archive.parquet_store import ParquetStore

    table = _segment(ParquetStore(root), ref)
    lo, hi = (int(i) for i in table.column("offset").to_numpy().searchsorted([start, end]))
    return table.slice(lo, hi - lo)


def decoded_range(root: str, ref: SegmentRef, start: int, end: int, topic: str,
                  schema: pa.Schema, catalog_schema: str, registry: WriterSchemas | None = None
                  ) -> tuple[pa.Table, list[tuple[int, int, bytes | None, bytes | None,
                                                  str | None]]]:
    """The rows (``schema``) and dead letters of [start, end) of a decoded segment. One that is
    missing or bad is rebuilt from its raw segment (with ``registry``'s writer schemas), and
    one line names it."""
    from orchestrator.archive.decode_pass import read_or_rebuild
    from orchestrator.archive.decoder import read_columns, split_decoded
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.spark.writer import connection

    assert ref.decoded_path is not None and ref.decoded_checksum is not None
    table = read_or_rebuild(connection, catalog_schema, ParquetStore(root), ref.decoded_path,
                            ref.decoded_checksum, read_columns(schema), registry)
    return split_decoded(table, topic, start, end, schema)


def _segment(store: ParquetStore, ref: SegmentRef) -> pa.Table:
    from orchestrator.archive.table_checksum import table_checksum

    location = store.location(ref.path)
    cached = _last.get(location)
    if cached is not None:
        return cached
    table = store.read_table(ref.path)
    if table.num_rows != ref.records or table_checksum(table) != ref.checksum:
        raise ArchiveError(
            f"segment {location} differs from the archive's manifest ({table.num_rows:,} "
            f"records against {ref.records:,}, or another checksum): run `kappa archive "
            "verify`, then restore the segment from a backup")
    _last.clear()
    _last[location] = table
    return table
