"""`kappa archive verify --decoded`: decoded segments decoded again from their raw segments and
compared with what they hold, row for row (#60).

A decoded segment's checksum says that its file is the one its decoder wrote, not that its
decoder wrote what the parser makes of the raw records. Replays read decoded segments with no
parse, so a decoder that lied would go unseen: this looks. Only decodings of the parser's code
as it is now are compared (the fingerprint holds its digest): older code's segments may differ
by design, and no version of this code reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
import pyarrow as pa

from orchestrator.archive.decode_pass import decoded_table, read_decoded, rebuild
from orchestrator.archive.parquet_store import ParquetStore
from orchestrator.archive_model.decoding import DecodedSegment, decoder_digest
from orchestrator.archive_model.segments import ArchiveError, Lineage, Segment
from orchestrator.catalog import archive_manifest as manifest
from orchestrator.catalog import decoded_manifest
from orchestrator.record_parsers import WriterSchemas

log = logging.getLogger("kappa.archive")


@dataclass(frozen=True)
class RedecodeReport:
    compared: int  # decoded segments decoded again and compared row for row
    other_code: int  # not compared: decoded by the parser's code of another release
    differed: tuple[str, ...]  # one line for each that differed (then rebuilt)


def spread(items: Sequence[DecodedSegment], sample: int | None) -> list[DecodedSegment]:
    """All of ``items`` (``sample`` None or 0), or ``sample`` of them spread evenly from the
    first to the last."""
    if not sample or sample >= len(items):
        return list(items)
    if sample == 1:
        return [items[0]]
    return [items[round(i * (len(items) - 1) / (sample - 1))] for i in range(sample)]


def first_difference(fresh: pa.Table, stored: pa.Table) -> str:
    """Where two decodes of one segment part, in words."""
    if fresh.schema != stored.schema:
        return f"its columns ({stored.schema.names} against {fresh.schema.names})"
    if fresh.num_rows != stored.num_rows:
        return f"its row count ({stored.num_rows:,} against {fresh.num_rows:,})"
    offsets = stored.column("kafka_offset").to_pylist()
    for name in fresh.schema.names:
        for n, (a, b) in enumerate(zip(fresh.column(name).to_pylist(),
                                       stored.column(name).to_pylist(), strict=True)):
            if a != b:
                return f"column {name} at offset {offsets[n]}"
    return "nothing found row by row"  # equal values, unequal chunks or metadata


def redecode(conn: psycopg.Connection, schema: str, store: ParquetStore,
             topics: Sequence[str] = (), sample: int | None = None,
             registry: WriterSchemas | None = None) -> RedecodeReport:
    """Decode the decoded segments (of ``topics``; all, or ``sample`` of them) again from their
    raw segments and compare; one that differs is named in one line and rebuilt."""
    with conn.transaction():
        found = [d for d in decoded_manifest.decoded(conn, schema)
                 if not topics or d.lineage.topic in topics]
        decodings = decoded_manifest.decodings(conn, schema)
    current = [d for d in found if d.decoding in decodings
               and decodings[d.decoding].decoder == decoder_digest()]
    differed = []
    chosen = spread(current, sample)
    raw_segments: dict[tuple[Lineage, int], dict[int, Segment]] = {}
    for d in chosen:
        key = (d.lineage, d.partition)
        if key not in raw_segments:  # one manifest read per partition, not per segment
            with conn.transaction():
                raw_segments[key] = {s.first_offset: s for s in manifest.segments(
                    conn, schema, d.lineage, d.partition)}
        raw = raw_segments[key].get(d.first_offset)
        if raw is None:
            raise ArchiveError(f"decoded segment {store.location(d.path)} has no raw segment: "
                               "run `kappa archive verify`")
        fresh = decoded_table(store, raw, decodings[d.decoding], registry)
        stored = read_decoded(store, d.path, d.checksum)
        if fresh.equals(stored):
            continue
        line = (f"decoded segment {store.location(d.path)} differs from its raw segment "
                f"decoded again, in {first_difference(fresh, stored)}: rebuilt")
        log.warning("%s", line)
        rebuild(conn, schema, store, d.path, registry)
        differed.append(line)
    return RedecodeReport(len(chosen), len(found) - len(current), tuple(differed))
