"""The archiver: copies logs into immutable Parquet segments and records each in the manifest,
so that every offset of a partition, from where the archive of its lineage begins, is a record or
a gap, with no hole and no overlap across crashes.

The order is what makes a crash harmless: a segment's file is written, synced and put in place,
and only then recorded. A file a crash left unrecorded (or half-written under a temporary name)
is removed before its range is written again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import replace
from typing import cast

import psycopg

from orchestrator.archive.decode_pass import Use, decode_pending
from orchestrator.archive.deletions import end_deleted_lineages
from orchestrator.archive.end_watch import LogEndWatch, WatchedLog
from orchestrator.archive.parquet_store import ParquetStore
from orchestrator.archive.readable import archive_root
from orchestrator.archive_model.decoding import DecodedSegment
from orchestrator.archive_model.segments import (
    ArchivedRecord,
    ArchiveError,
    Lineage,
    PartitionArchive,
    Segment,
    check_contiguous,
    checksum,
    gap_offsets,
    next_offset,
    segment_path,
)
from orchestrator.catalog import archive_manifest as manifest
from orchestrator.errors import KappaError, RegistryUnavailableError
from orchestrator.failpoints import fail_point
from orchestrator.kafka.admin import log_identity, topic_names
from orchestrator.kafka.clients import LogClients
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import log_bounds
from orchestrator.kafka.reader import read_range
from orchestrator.kafka.timestamps import record_timestamps
from orchestrator.kafka.writer_schemas import writer_schemas
from orchestrator.log_identity import LogIdentity
from orchestrator.settings import Settings

log = logging.getLogger("kappa.archive")


def _is_outage(exc: BaseException) -> bool:
    from orchestrator.spark.failures import is_outage

    return is_outage(exc)


def read_archived(kafka: Kafka, topic: str, partition: int, first: int, end: int,
                  group_id: str) -> list[ArchivedRecord]:
    """Every record of [first, end) as the archive keeps it."""
    return [cast(ArchivedRecord, record) for batch in read_range(
        kafka, topic, partition, first, end, group_id, timestamp_types=True) for record in batch]


class Archiver:
    def __init__(self, settings: Settings, conn: psycopg.Connection, kafka: Kafka,
                 log_clients: LogClients | None = None, watch: LogEndWatch | None = None):
        self.settings, self.conn, self.kafka = settings, conn, kafka
        self.log_clients = log_clients  # kept across passes: a warm probe lists no offsets
        self.watch = watch  # notes the log ends while this pass writes
        self.schema = settings.catalog_schema
        self.store = ParquetStore(archive_root(settings))
        self.group_id = f"kappa-archive-{uuid.uuid4().hex[:12]}"

    def archive(self, topics: Sequence[str],
                on_segment: Callable[[Segment], None] = lambda _: None, *,
                skip_missing: bool = False, isolate_topics: bool = False) -> list[Segment]:
        """One pass: every partition of ``topics`` up to the log end found now. A topic the
        broker does not have stops the pass, unless ``skip_missing`` (topics that jobs declare
        but nobody has created yet). With ``isolate_topics`` (a continuous archiver), one
        topic's error stops that topic's pass only: it is logged, kept in ``failed`` and tried
        again on the next pass, while an outage still stops the pass."""
        self.failed: dict[str, str] = {}
        identity = log_identity(self.kafka, topics)
        if not identity.cluster_id:
            raise ArchiveError(f"the broker at {self.kafka} reports no cluster id, so no lineage "
                               "can be recorded: use a broker that does (Kafka 0.10.1 or later)")
        for topic in topics:
            if identity.topics.get(topic) is None and not skip_missing:
                raise ArchiveError(f"topic {topic} does not exist on {self.kafka}: create it, or "
                                   "leave it out of `kappa archive run`")
        present = [t for t in topics if identity.topics.get(t) is not None]
        bounds = self._bounds(present, isolate_topics)
        watched: dict[str, WatchedLog] = {}
        for topic in present:
            if topic in self.failed:
                continue
            topic_id = identity.topics[topic]
            assert topic_id is not None
            seen = Lineage(identity.cluster_id, topic, topic_id)
            ends = {p: end for (name, p), (_, end) in bounds.items() if name == topic}
            with self.conn.transaction():
                known = manifest.root_of(self.conn, self.schema, seen, len(ends))
                if not known.restoring:
                    manifest.note_log_ends(self.conn, self.schema, known.root, ends)
            if known.restoring:
                log.info("%s: being restored from the archive; archived after the restore",
                         topic)
                continue
            watched[topic] = WatchedLog(known.root, seen)
        if self.watch is not None:
            self.watch.watch(watched)
        written: list[Segment] = []
        for topic, logged in watched.items():
            try:
                fail_point("archive.topic")
                for (name, partition), (start, end) in sorted(bounds.items()):
                    if name == topic:
                        written += self._partition(logged.root, logged.seen, partition, start,
                                                   end, on_segment)
            except Exception as exc:
                if not isolate_topics or _is_outage(exc):
                    raise
                self._topic_failed(topic, exc)
        if isolate_topics:
            with self.conn.transaction():
                manifest.clear_errors(self.conn, self.schema,
                                      [t for t in watched if t not in self.failed])
                new = [t for t, reason in self.failed.items()
                       if manifest.note_error(self.conn, self.schema, t, reason)]
            for topic in new:  # once per error, not once a second
                log.warning("%s: the archiver's passes stop on this topic only (%s); the other "
                            "topics are archived, and it is tried again on every pass (`kappa "
                            "archive status` shows it until it passes)", topic,
                            self.failed[topic])
        return written

    def _bounds(self, topics: list[str], isolate_topics: bool
                ) -> dict[tuple[str, int], tuple[int, int]]:
        """The log bounds of ``topics``, in one call; when isolating, a call that fails is made
        again topic by topic, and a topic whose bounds fail is left out of this pass."""
        try:
            return self._bounds_of(topics) if topics else {}
        except Exception as exc:
            if not isolate_topics or _is_outage(exc):
                raise
        found: dict[tuple[str, int], tuple[int, int]] = {}
        for topic in topics:
            try:
                found.update(self._bounds_of([topic]))
            except Exception as exc:
                if _is_outage(exc):
                    raise
                self._topic_failed(topic, exc)
        return found

    def _bounds_of(self, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
        return self.log_clients.bounds(topics) if self.log_clients else log_bounds(self.kafka,
                                                                                   topics)

    def _topic_failed(self, topic: str, exc: Exception) -> None:
        self.failed[topic] = _first_line(exc)

    def _partition(self, lineage: Lineage, seen: Lineage, partition: int, log_start: int,
                   log_end: int, on_segment: Callable[[Segment], None]) -> list[Segment]:
        """``lineage``: the root whose segments are written; ``seen``: the topic as the
        broker holds it (the root itself, or a restore of it)."""
        if not manifest.claim_partition(self.conn, lineage, partition):
            log.info("%s/%d: another archiver is writing it", lineage.topic, partition)
            return []
        try:
            return self._claimed(lineage, seen, partition, log_start, log_end, on_segment)
        finally:
            if not self.conn.closed and not self.conn.broken:
                manifest.release_partition(self.conn, lineage, partition)

    def _claimed(self, lineage: Lineage, seen: Lineage, partition: int, log_start: int,
                 log_end: int, on_segment: Callable[[Segment], None]) -> list[Segment]:
        with self.conn.transaction():
            recorded = manifest.segments(self.conn, self.schema, lineage, partition)
        check_contiguous(recorded)
        position = next_offset(recorded, log_start)
        where = f"{lineage.topic}/{partition}"
        if position < log_start:
            raise ArchiveError(
                f"offsets [{position}, {log_start}) of {where} left the log before they were "
                "archived (retention ran first): the archive cannot hold them. Archive more "
                "often than the retention, or start a new archive under another archive_root")
        removed = self.store.remove_unrecorded(
            lineage.directory(partition), {s.path.rsplit("/", 1)[-1] for s in recorded},
            position)
        if removed:
            log.warning("%s: removed what a crash left unrecorded: %s", where, ", ".join(removed))
        written = []
        size = self.settings.archive_segment_records
        while position < log_end:
            end = min(log_end, position + size)
            segment = self._write(lineage, seen, partition, position, end)
            written.append(segment)
            on_segment(segment)
            position = end
        return written

    def _write(self, lineage: Lineage, seen: Lineage, partition: int, first: int, end: int
               ) -> Segment:
        records = read_archived(self.kafka, lineage.topic, partition, first, end, self.group_id)
        gaps = gap_offsets(first, end, (r[0] for r in records))
        path = segment_path(lineage, partition, first, end)
        size = self.store.write(path, records)
        # The records were read from the lineage the pass began with only if the topic still
        # has its id now: a topic recreated meanwhile is not recorded as the old one's.
        now = log_identity(self.kafka, [lineage.topic])
        if (now.cluster_id, now.topics.get(seen.topic)) != (seen.cluster_id, seen.topic_id):
            raise ArchiveError(f"{lineage.topic} was recreated (or the broker replaced) while "
                               f"{path} was written: it is not recorded; run `kappa archive run` "
                               "again to start the new lineage")
        fail_point("archive.before_record")
        segment = Segment(lineage, partition, first, end, len(records), gaps, size,
                          checksum(records), path)
        with self.conn.transaction():
            manifest.record(self.conn, self.schema, segment)
        return segment

    def status(self, topics: Sequence[str]) -> list[PartitionArchive]:
        """One row per partition and lineage archived, and per partition of ``topics``; the
        log's figures go on the rows of the lineage the broker holds now."""
        with self.conn.transaction():
            segments = manifest.segments(self.conn, self.schema)
            noted = manifest.noted_log_ends(self.conn, self.schema)
            failing = manifest.errors(self.conn, self.schema)
        names = list(dict.fromkeys([*topics, *(s.lineage.topic for s in segments)]))
        try:
            identity = log_identity(self.kafka, names)
            # A deleted topic has no bounds: asked for, it would hide every topic's.
            held = [name for name in names if identity.topics.get(name)]
            bounds = dict(log_bounds(self.kafka, held)) if held else {}
        except KappaError as exc:  # the broker's figures are unknown, the archive's are not
            log.warning("cannot read the log bounds (%s): shown as unknown", exc)
            identity, bounds = None, {}
        current = current_lineages(self.conn, self.schema, identity)
        grouped: dict[tuple[str, int, str | None], list[Segment]] = {}
        for s in segments:
            lineage = f"{s.lineage.cluster_id}-{s.lineage.topic_id}"
            grouped.setdefault((s.lineage.topic, s.partition, lineage), []).append(s)
        for topic, partition in bounds:
            if not any(k[:2] == (topic, partition) and k[2] == current.get(topic)
                       for k in grouped):
                grouped[(topic, partition, current.get(topic))] = []
        rows = []
        for (topic, partition, lineage_text), kept in sorted(
                grouped.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] or "")):
            is_current = lineage_text == current.get(topic)
            start, end = (bounds.get((topic, partition), (None, None)) if is_current
                          else (None, None))
            rows.append(PartitionArchive(
                topic=topic, partition=partition, lineage=lineage_text,
                current=None if identity is None else is_current,
                archived_first=kept[0].first_offset if kept else None,
                archived_end=kept[-1].end_offset if kept else None,
                segments=len(kept), records=sum(s.records for s in kept),
                gaps=sum(len(s.gap_offsets) for s in kept), bytes=sum(s.bytes for s in kept),
                log_start=start, log_end=end,
                noted_end=noted.get((topic, lineage_text or "", partition)),
                error=failing.get(topic) if is_current else None))
        return self._with_lag_seconds(rows)

    def _with_lag_seconds(self, rows: list[PartitionArchive]) -> list[PartitionArchive]:
        """The age of each current partition's oldest record not archived yet: 0 when none
        is behind, unknown when its timestamp cannot be read."""
        behind = {(r.topic, r.partition): (r.archived_end if r.archived_end is not None
                                           else r.log_start or 0)
                  for r in rows if r.current and r.behind}
        try:
            stamps = record_timestamps(self.kafka, behind) if behind else {}
        except KappaError as exc:
            log.warning("cannot read the archive's oldest unarchived records (%s)", exc)
            stamps = {}
        now_ms = time.time() * 1000
        return [replace(r, lag_seconds=(
            0.0 if r.behind == 0 else
            max(0.0, (now_ms - stamps[(r.topic, r.partition)]) / 1000)
            if (r.topic, r.partition) in stamps else None)) if r.current else r for r in rows]


def current_lineages(conn: psycopg.Connection, schema: str, identity: LogIdentity | None
                     ) -> dict[str, str]:
    """topic -> "<cluster id>-<topic id>" of the root lineage the broker holds now: a topic
    restored from the archive continues its root."""
    if identity is None:
        return {}
    with conn.transaction():
        roots = {k.identity: k.root for k in manifest.known_logs(conn, schema)}
    found = {}
    for topic, topic_id in identity.topics.items():
        if topic_id is not None and identity.cluster_id:
            seen = Lineage(identity.cluster_id, topic, topic_id)
            root = roots.get(seen, seen)
            found[topic] = f"{root.cluster_id}-{root.topic_id}"
    return found


def topics_to_archive(conn: psycopg.Connection, settings: Settings, named: Sequence[str],
                      kafka: Kafka | None = None) -> list[str]:
    """The topics named, or every topic of the broker ``kafka`` (the embedded default's
    archiver), or else every topic that a deployed job reads (maybe none yet)."""
    from orchestrator.catalog import versions

    if named:
        return list(dict.fromkeys(named))
    if kafka is not None:
        return topic_names(kafka)
    with conn.transaction():
        deployed = versions.list_all(conn, settings.catalog_schema)
    return sorted({t for v in deployed for t in v.spec.topics})


def run_archiver(settings: Settings, conn_factory: Callable[[], psycopg.Connection],
                 kafka: Kafka, named: Sequence[str], *, once: bool, interval_s: float,
                 on_segment: Callable[[Segment], None], stop: Callable[[], bool],
                 all_topics: bool = False,
                 on_decoded: Callable[[DecodedSegment], None] = lambda _: None) -> int:
    """Archive passes every ``interval_s`` until ``stop()``, then a last one up to the log end
    found then (or one pass, with ``once``); returns the segments written. After each pass,
    the segments are decoded for every decoding a version reads them with (``decoded_segments``).
    An outage of the broker or PostgreSQL is waited out. ``all_topics``: every topic of the
    broker, not only those deployed jobs read."""
    from orchestrator.spark.failures import is_outage

    written = 0
    with closing(LogClients(kafka)) as clients, \
            LogEndWatch(kafka, conn_factory, settings.catalog_schema) as watch:
        while True:
            stopping = stop()
            try:
                with conn_factory() as conn:
                    topics = topics_to_archive(conn, settings, named,
                                               kafka if all_topics else None)
                    if once and not topics:
                        raise ArchiveError(
                            "no deployed job reads a topic yet: name the topics "
                            "(`kappa archive run TOPIC ...`) or deploy a job first")
                    end_deleted_lineages(conn, settings.catalog_schema, kafka)
                    archiver = Archiver(settings, conn, kafka, clients, watch)
                    written += len(archiver.archive(topics, on_segment, skip_missing=not named,
                                                    isolate_topics=not once))
                    if settings.decoded_segments:
                        _decode(conn, settings, archiver.store, topics, on_decoded, once=once)
            except Exception as exc:
                if once or not is_outage(exc):
                    raise
                log.warning("archive pass stopped by an unreachable service (%s); trying again "
                            "in %gs", exc, interval_s)
            if once or stopping:
                return written
            deadline = time.monotonic() + interval_s
            while time.monotonic() < deadline and not stop():
                time.sleep(min(0.2, interval_s))


def _first_line(exc: Exception) -> str:
    """An error as archive_errors keeps it: its first line, or its type where it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _decode(conn: psycopg.Connection, settings: Settings, store: ParquetStore,
            topics: Sequence[str], on_decoded: Callable[[DecodedSegment], None], *,
            once: bool) -> None:
    """Decode what the pass archived. A single pass stops on any error. In a continuous
    archiver, an error of any kind but an outage stops that topic's decoding only, not the
    archiving nor the other topics' decoding (replays parse its raw segments meanwhile): it is
    kept in archive_errors, which `kappa archive status` shows, and tried again every pass."""
    registry = writer_schemas(settings.schema_registry)
    if once:
        decode_pending(conn, settings.catalog_schema, store, topics, on_decoded,
                       registry=registry)
        return
    failed: dict[str, str] = {}

    def keep(use: Use, exc: Exception) -> None:
        # A schema registry away stops only the decodings that need it, till a later pass.
        if _is_outage(exc) and not isinstance(exc, RegistryUnavailableError):
            raise exc
        failed.setdefault(use.lineage.topic, _first_line(exc))

    decode_pending(conn, settings.catalog_schema, store, topics, on_decoded, keep, registry)
    with conn.transaction():
        manifest.clear_errors(conn, settings.catalog_schema,
                              [t for t in topics if t not in failed], manifest.DECODING)
        new = [t for t, reason in failed.items() if manifest.note_error(
            conn, settings.catalog_schema, t, reason, manifest.DECODING)]
    for topic in new:  # once per error, not once a pass
        log.warning("%s: its decoding stopped (%s); replays parse its raw segments meanwhile, "
                    "and every pass tries it again (`kappa archive status` shows it until it "
                    "passes)", topic, failed[topic])
