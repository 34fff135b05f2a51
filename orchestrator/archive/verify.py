"""`kappa archive verify`: every segment read back against its manifest row and, where the
broker still holds its range, against the log itself, record by record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.archive.archiver import Archiver, current_lineages, read_archived
from orchestrator.archive.decode_pass import verify_decoded
from orchestrator.archive.decoded_check import RedecodeReport, redecode
from orchestrator.archive_model.segments import ArchiveError, first_difference, matches_manifest
from orchestrator.catalog import archive_manifest as manifest
from orchestrator.kafka.admin import log_identity
from orchestrator.kafka.offsets import log_bounds
from orchestrator.kafka.writer_schemas import writer_schemas


@dataclass(frozen=True)
class VerifyReport:
    segments: int  # files read back and checked against their manifest checksum
    compared: int  # of those, compared record by record with the log the broker still holds
    records: int  # records compared with the log
    decoded: int = 0  # decoded segments checked against their checksum
    rebuilt: tuple[str, ...] = ()  # of those, the missing or bad ones, rebuilt
    redecoded: RedecodeReport | None = None  # decoded again and compared, when asked


def verify(archiver: Archiver, topics: Sequence[str], redecode_sample: int | None = None
           ) -> VerifyReport:
    """Read every segment back; its checksum must be the manifest's, and where the broker
    still holds its range (same lineage), its records must be the log's, field by field. With
    ``redecode_sample`` (0: all), decoded segments are also decoded again and compared."""
    with archiver.conn.transaction():
        segments = [s for s in manifest.segments(archiver.conn, archiver.schema)
                    if not topics or s.lineage.topic in topics]
    names = sorted({s.lineage.topic for s in segments})
    identity = log_identity(archiver.kafka, names) if names else None
    bounds = log_bounds(archiver.kafka, names) if names else {}
    current = current_lineages(archiver.conn, archiver.schema, identity)
    compared = records = 0
    for s in segments:
        archived = archiver.store.read(s.path)
        if not matches_manifest(s, archived):
            raise ArchiveError(
                f"segment {archiver.store.location(s.path)} differs from the manifest (its "
                "checksum or record count): it changed after it was written; restore it from a "
                "backup, or remove its manifest row and the rows after it to archive the range "
                "again while the broker still holds it")
        held = bounds.get((s.lineage.topic, s.partition))
        same_log = current.get(s.lineage.topic) == f"{s.lineage.cluster_id}-{s.lineage.topic_id}"
        if not same_log or held is None or not (held[0] <= s.first_offset
                                                and s.end_offset <= held[1]):
            continue
        from_log = read_archived(archiver.kafka, s.lineage.topic, s.partition, s.first_offset,
                                 s.end_offset, archiver.group_id)
        if from_log != archived:
            first = first_difference(archived, from_log, min(len(archived), len(from_log)))
            raise ArchiveError(
                f"segment {archiver.store.location(s.path)} differs from the log at or near "
                f"offset {first}: the log was rewritten under the same topic id, or the "
                "segment was written wrong; do not restore it, and report it")
        compared += 1
        records += len(archived)
    registry = writer_schemas(archiver.settings.schema_registry)
    decoded, rebuilt = verify_decoded(archiver.conn, archiver.schema, archiver.store, topics,
                                      registry)
    again = None if redecode_sample is None else redecode(
        archiver.conn, archiver.schema, archiver.store, topics, redecode_sample, registry)
    return VerifyReport(len(segments), compared, records, decoded, tuple(rebuilt), again)
