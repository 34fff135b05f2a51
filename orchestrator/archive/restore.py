"""Restore archived topics into a broker that lost them (the embedded broker keeps its log in
memory), with the same offsets, record by record, and then record that each restored topic
continues its lineage, so that the archive and the versions that read it go on from where they
were.

Every segment is checked against its manifest checksum before a record of it is produced, and
the restored log is read back and checked again: a log that fails either check is deleted, and
is a log that is gone, as if there were no archive; unless it holds a record that the restore
did not write (another client's, acknowledged to it): then nothing is deleted, and the restore
stops, saying so. Offsets that the archiver saw in the log (or
a version read) past the archive's end were acknowledged and then lost with the broker: they are
reported by offset, and a version that read them fails, saying so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg

from orchestrator.archive.archiver import read_archived
from orchestrator.archive.parquet_store import ParquetStore
from orchestrator.archive.readable import archive_root
from orchestrator.archive_model.deletion import Deletion
from orchestrator.archive_model.restore_plan import plan_runs
from orchestrator.archive_model.segments import (
    ArchivedRecord,
    ArchiveError,
    Lineage,
    Segment,
    check_contiguous,
    first_difference,
    matches_manifest,
)
from orchestrator.catalog import archive_manifest as manifest
from orchestrator.catalog import events, runs, versions
from orchestrator.failpoints import fail_point
from orchestrator.kafka.admin import delete_topic, ensure_topic, log_identity
from orchestrator.kafka.endpoint import (
    RESTORE_CLIENT_ID_PREFIX,
    Kafka,
    KafkaEndpoint,
    as_endpoint,
)
from orchestrator.kafka.exact_producer import ExactProducer
from orchestrator.kafka.offsets import log_bounds
from orchestrator.log_identity import (
    LogIdentity,
    is_log_gone,
    lost_records_reason,
    read_lost_records,
)
from orchestrator.models import DeployedVersion
from orchestrator.settings import Settings
from orchestrator.spark.checkpoint import Checkpoint, is_local
from orchestrator.states import RunState

log = logging.getLogger("kappa.archive")


@dataclass(frozen=True)
class LostRange:
    """Offsets [first_offset, end_offset) acknowledged by the broker and lost before they were
    archived."""

    topic: str
    partition: int
    first_offset: int
    end_offset: int

    def describe(self) -> str:
        return f"{self.topic}/{self.partition} [{self.first_offset}, {self.end_offset})"


Acknowledged = Mapping[str, Mapping[int, int]]  # topic -> partition -> acknowledged end


@dataclass(frozen=True)
class RestoredTopic:
    topic: str
    root: Lineage  # the lineage it continues
    topic_id: str  # the new topic's id on the broker
    records: int
    gaps: int
    ends: Mapping[int, int]  # partition -> its end offset, as restored
    lost: tuple[LostRange, ...]


@dataclass(frozen=True)
class RestoreReport:
    restored: tuple[RestoredTopic, ...] = ()
    kept: tuple[str, ...] = ()  # topics the broker still holds: nothing to restore
    failed_versions: tuple[str, ...] = ()  # "job/version: why", for versions that read a loss
    # (job, version) of versions that read a restored topic and were running, or failed only
    # because the broker's log was gone: they go on from their offsets, restarted.
    continuing: tuple[tuple[str, str], ...] = ()
    # Acknowledged by the lost broker in topics the archive never held a record of.
    unarchived: tuple[LostRange, ...] = ()
    ended: tuple[str, ...] = ()  # deleted on the broker before it was lost: not restored

    @property
    def lost(self) -> tuple[LostRange, ...]:
        return tuple(r for t in self.restored for r in t.lost) + self.unarchived


class Restorer:
    def __init__(self, settings: Settings, conn: psycopg.Connection, kafka: Kafka):
        self.settings, self.conn, self.kafka = settings, conn, _as_restore_client(kafka)
        self.schema = settings.catalog_schema
        self.store = ParquetStore(archive_root(settings))

    def restore(self, topics: Sequence[str] = (), acknowledged: Acknowledged | None = None,
                deleted: Mapping[str, Deletion] | None = None) -> RestoreReport:
        """Every archived topic the broker does not hold (or ``topics``), newest lineage.
        ``acknowledged``: the ends the lost broker acknowledged, ``deleted``: the topics its
        clients deleted, when and which ids (the stack's ack ledger)."""
        acknowledged = acknowledged or {}
        fail_point("restore.start")
        with self.conn.transaction():
            for topic, deletion in sorted((deleted or {}).items()):
                # Deleted too soon before the crash for an archiver pass to see it.
                if manifest.end_deleted(self.conn, self.schema, topic, deletion):
                    log.warning("%s was deleted on the lost broker: its archive's lineage "
                                "ends, and no restore brings it back", topic)
            known = manifest.known_logs(self.conn, self.schema)
        newest = {k.identity.topic: k for k in known if not topics or k.identity.topic in topics}
        # Deleted on the broker before it was lost: never brought back.
        ended = tuple(sorted(t for t, k in newest.items() if k.ended))
        newest = {t: k for t, k in newest.items() if not k.ended}
        unarchived = tuple(LostRange(topic, p, 0, end)
                           for topic, ends in sorted(acknowledged.items())
                           if topic not in newest and not topic.startswith("__")
                           and (not topics or topic in topics)
                           for p, end in sorted(ends.items()) if end > 0)
        if not newest:
            return RestoreReport(unarchived=unarchived, ended=ended)
        identity = log_identity(self.kafka, sorted(newest))
        if not identity.cluster_id:
            raise ArchiveError(f"the broker at {self.kafka} reports no cluster id: it cannot "
                               "hold a restored log")
        restored, kept, failed = [], [], []
        for topic, latest in sorted(newest.items()):
            now_id = identity.topics.get(topic)
            if now_id is not None:
                seen = next((k for k in known if k.identity == Lineage(
                    identity.cluster_id, topic, now_id)), None)
                if seen is None or not seen.restoring:
                    kept.append(topic)  # the log it had, or a new topic of that name
                    continue
                log.warning("%s: a restore was cut off; restoring it again", topic)
                with self.conn.transaction():
                    segments = {p: manifest.segments(self.conn, self.schema, latest.root, p)
                                for p in range(latest.partitions)}
                self._delete_if_ours(topic, segments)
            for stale in (k for k in known if k.identity.topic == topic and k.restoring):
                with self.conn.transaction():
                    manifest.forget(self.conn, self.schema, stale.identity)
            done = self._topic(identity.cluster_id, topic, latest.root, latest.partitions,
                               acknowledged.get(topic, {}))
            restored.append(done)
            failed += self._fail_readers_of_losses(done)
        return RestoreReport(tuple(restored), tuple(kept), tuple(failed),
                             self._continuing(restored), unarchived, ended)

    def _continuing(self, restored: Sequence[RestoredTopic]) -> tuple[tuple[str, str], ...]:
        readers = {(v.job, v.version): v for t in restored for v in self._readers(t.topic,
                                                                                t.topic_id)}
        going_on = []
        with self.conn.transaction():
            for key, version in sorted(readers.items()):
                run = runs.get(self.conn, self.schema, version.id)
                if run.state.is_active or (run.state == RunState.FAILED and is_log_gone(
                        run.reason) and not read_lost_records(run.reason)):
                    going_on.append(key)
        return tuple(going_on)

    def _topic(self, cluster_id: str, topic: str, root: Lineage, partitions: int,
               acknowledged: Mapping[int, int]) -> RestoredTopic:
        # Every segment is checked before the topic exists, so a damaged one stops the restore
        # with nothing of the topic on the broker; each is checked again as it is produced.
        with self.conn.transaction():
            planned = [s for p in range(partitions)
                       for s in manifest.segments(self.conn, self.schema, root, p)]
        for segment in planned:
            self._checked(segment)
        ensure_topic(self.kafka, topic, partitions)
        topic_id = log_identity(self.kafka, [topic]).topics.get(topic)
        if topic_id is None:
            raise ArchiveError(f"the broker at {self.kafka} gives topic {topic} no id: it "
                               "cannot hold a restored log")
        seen = Lineage(cluster_id, topic, topic_id)
        with self.conn.transaction():
            manifest.begin_restore(self.conn, self.schema, seen, root, partitions)
            segments = {p: manifest.segments(self.conn, self.schema, root, p)
                        for p in range(partitions)}
        try:
            ends = {p: self._partition(topic, p, kept) for p, kept in segments.items()}
            fail_point("restore.before_check")
            self._check(topic, segments, ends)
        except BaseException:
            self._delete_if_ours(topic, segments)
            with self.conn.transaction():
                manifest.forget(self.conn, self.schema, seen)
            raise
        with self.conn.transaction():
            manifest.end_restore(self.conn, self.schema, seen)
            adopted = self._adopt(root, seen)
            # The log reached at least as far as the broker acknowledged it, as the archiver
            # saw it, and as versions read it.
            known_ends = manifest.log_ends(self.conn, self.schema, root)
            for partition, acked in acknowledged.items():
                known_ends[partition] = max(known_ends.get(partition, 0), acked)
            for version in self._readers(topic, topic_id):
                read = runs.processed_offsets(self.conn, self.schema, version.id).get(topic, {})
                for p, n in [*read.items(), *_planned_ends(version, topic).items()]:
                    known_ends[int(p)] = max(known_ends.get(int(p), 0), n)
            lost = tuple(LostRange(topic, p, ends.get(p, 0), known)
                         for p, known in sorted(known_ends.items()) if known > ends.get(p, 0))
            manifest.start_log_ends(self.conn, self.schema, root, ends)
            events.record(self.conn, self.schema, "log_restored", topic=topic,
                          topic_id=topic_id, lineage=f"{root.cluster_id}-{root.topic_id}",
                          ends={str(p): e for p, e in ends.items()}, versions=adopted,
                          lost=[r.describe() for r in lost])
        kept_segments = [s for kept in segments.values() for s in kept]
        return RestoredTopic(topic, root, topic_id, sum(s.records for s in kept_segments),
                             sum(len(s.gap_offsets) for s in kept_segments), ends, lost)

    def _partition(self, topic: str, partition: int, segments: list[Segment]) -> int:
        check_contiguous(segments)
        where = f"{topic}/{partition}"
        planned = plan_runs(((s.first_offset, s.end_offset, self._checked(s), s.gap_offsets)
                             for s in segments), where)
        return ExactProducer(self.kafka, topic, partition).write(planned)

    def _checked(self, segment: Segment) -> list[ArchivedRecord]:
        """A segment's records, only if they are what the manifest recorded."""
        records = self.store.read(segment.path)
        if not matches_manifest(segment, records):
            raise ArchiveError(
                f"segment {self.store.location(segment.path)} differs from its manifest "
                "checksum: it is not restored, and neither is the rest of its topic. Put the "
                "file back from a backup and run `kappa dev up` again; without it, the topic's "
                "log is gone")
        return records

    def _check(self, topic: str, segments: dict[int, list[Segment]], ends: dict[int, int]
               ) -> None:
        """Read the restored log back: each segment's range must give its checksum."""
        bounds = log_bounds(self.kafka, [topic])
        for partition, kept in segments.items():
            end = kept[-1].end_offset if kept else 0
            if bounds.get((topic, partition), (0, 0))[1] != end or ends[partition] != end:
                raise ArchiveError(f"restored {topic}/{partition} ends at "
                                   f"{bounds.get((topic, partition))}, not at {end}: the broker "
                                   "did not keep the offsets; the log is not restored")
            for s in kept:
                back = read_archived(self.kafka, topic, partition, s.first_offset, s.end_offset,
                                     f"kappa-restore-check-{topic}")
                if not matches_manifest(s, back):
                    first = first_difference(self.store.read(s.path), back, s.first_offset)
                    raise ArchiveError(
                        f"restored {topic}/{partition} differs from segment {s.path} at or near "
                        f"offset {first}: the broker changed a record (its timestamp type, "
                        "say); the log is not restored")

    def _delete_if_ours(self, topic: str, segments: dict[int, list[Segment]]) -> None:
        """Delete a topic that a restore wrote, but only if every record it holds is one the
        restore wrote: the archive's record at its offset. Another client's records (a producer
        whose Metadata request created the topic again, with no hold to keep it off) were
        acknowledged to it: they are never deleted, and the topic is left as it is."""
        bounds = log_bounds(self.kafka, [topic])
        for partition, kept in sorted(segments.items()):
            end = bounds.get((topic, partition), (0, 0))[1]
            archived_end = kept[-1].end_offset if kept else 0
            ours = end <= archived_end and all(
                read_archived(self.kafka, topic, partition, s.first_offset,
                              min(s.end_offset, end), f"kappa-restore-check-{topic}")
                == [r for r in self.store.read(s.path) if r[0] < end]
                for s in kept if s.first_offset < end)
            if not ours:
                raise ArchiveError(
                    f"{topic}/{partition} holds records that the restore did not write (it ends "
                    f"at {end}; the archive's records end at {archived_end}): another client "
                    "wrote to the topic during the restore. The topic is left as it is, those "
                    "records with it, and the restore stops. Stop the clients that write to it, "
                    "keep what they wrote if it matters, delete the topic, and run `kappa archive "
                    f"restore {topic}` again")
        delete_topic(self.kafka, topic)

    def _adopt(self, root: Lineage, seen: Lineage) -> list[str]:
        """Versions that read any log of ``root``'s lineage read the restored topic now."""
        family = {k.identity.topic_id for k in manifest.known_logs(self.conn, self.schema)
                  if k.root == root} | {root.topic_id}
        adopted = []
        for version in versions.list_all(self.conn, self.schema):
            recorded = version.log_identity
            if recorded is None or recorded.topics.get(root.topic) not in family:
                continue
            versions.set_log_identity(self.conn, self.schema, version, LogIdentity(
                seen.cluster_id, {**recorded.topics, root.topic: seen.topic_id}))
            adopted.append(f"{version.job}/{version.version}")
        return adopted

    def _readers(self, topic: str, topic_id: str) -> list[DeployedVersion]:
        """Versions that read the lineage restored as ``topic_id`` (adopted by the restore)."""
        return [v for v in versions.list_all(self.conn, self.schema)
                if v.log_identity is not None and v.log_identity.topics.get(topic) == topic_id]

    def _fail_readers_of_losses(self, done: RestoredTopic) -> list[str]:
        """A version that read past the restored end read records the log no longer has:
        records produced from now on would take their offsets, unseen by it."""
        failed = []
        with self.conn.transaction():
            for version in self._readers(done.topic, done.topic_id):
                read = runs.processed_offsets(self.conn, self.schema, version.id).get(
                    done.topic, {})
                past = sorted((int(p), n) for p, n in read.items()
                              if n > done.ends.get(int(p), 0))
                if not past:
                    continue
                ranges = ", ".join(f"{done.topic}/{p} [{done.ends.get(p, 0)}, {n})"
                                   for p, n in past)
                reason = lost_records_reason(ranges)
                run = runs.get(self.conn, self.schema, version.id, for_update=True)
                if run.state == RunState.RETIRED:
                    continue
                if run.state == RunState.FAILED:
                    runs.note_reason(self.conn, self.schema, version.id, run.attempt, reason)
                else:
                    runs.change_state(self.conn, self.schema, version, RunState.FAILED,
                                      reason=reason, expected=run.as_seen())
                failed.append(f"{version.job}/{version.version}: {reason}")
        return failed


def _as_restore_client(kafka: Kafka) -> KafkaEndpoint:
    """The restore's clients carry a restore's client id (the stack's ack proxy tells them by
    it), unless the caller gave one (`kappa dev up` gives the one it lets through)."""
    endpoint = as_endpoint(kafka)
    if any(key == "client.id" for key, _ in endpoint.extra):
        return endpoint
    return replace(endpoint, extra=(*endpoint.extra,
                                    ("client.id", f"{RESTORE_CLIENT_ID_PREFIX}cli")))


def _planned_ends(version: DeployedVersion, topic: str) -> dict[str, int]:
    """Where a version's unfinished batch was planned to end: offsets its source saw in the
    log, though no batch applied them yet (a local checkpoint; a remote one needs Spark)."""
    if not is_local(version.checkpoint_dir):
        return {}
    plan = Checkpoint(version.checkpoint_dir).unfinished_plan()
    return {} if plan is None else plan[1].get(topic, {})
