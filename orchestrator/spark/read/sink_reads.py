"""A batch job's micro-batch, read by its sink: decoded segments through Spark's own Parquet
reader (vectorized, in the JVM, with no Python worker), every other range through the
source's read tasks run as a batch read (raw segments or Kafka, as ever).

The streaming source still plans the batches (its offsets, their tiling, the exactly-once
commit, resume and restart are unchanged) but reads nothing itself: one place decides, once
per batch, which of its read tasks the decoded segments serve, so no range is read twice.

The driver reads each decoded file it uses while Spark does: it checks the file's checksum
(rebuilding a missing or bad one from its raw segment, with one line naming it, and then the
batch is read again, so nothing read from a bad file counts), stages what the task found and
its dead letters, which are a few columns of the file. Where the archive
root is not a file system path that every host shares, this is off and the source's read
tasks read the decoded segments as Arrow batches instead (``source.py``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.archive.coverage import ReadTask
from orchestrator.archive_model.segments import ArchiveError
from orchestrator.models import DEAD, DEAD_KEY, DEAD_REASON, DEAD_VALUE, Offsets
from orchestrator.schema import parse_ddl
from orchestrator.spark.read.planner import ArchiveView, plan_reads

if TYPE_CHECKING:
    from orchestrator.kafka.offsets import Bounds

log = logging.getLogger("kappa.driver")
RANGES_SOURCE = "kappa_ranges"
_DEAD_COLUMNS = ["kafka_offset", "kafka_timestamp", DEAD, DEAD_REASON, DEAD_KEY, DEAD_VALUE]


def jvm_root(root: str | None) -> str | None:
    """The archive root as Spark's Parquet reader takes it, or None where it reads no
    decoded segment itself (an object store: the source serves those as Arrow)."""
    if root is None:
        return None
    if root.startswith("file://"):
        return root.removeprefix("file://")
    return None if "://" in root else root


class SinkReads:
    """Builds each micro-batch's events DataFrame from the catalog's view of the archive."""

    def __init__(self, options: Mapping[str, Mapping[str, str]], cores: int, chunk_records: int,
                 catalog_schema: str, version_id: int, kafka: Any,
                 bounds: Callable[[list[str]], Bounds] | None = None):
        self.options = options  # per topic: the source's options
        self.cores, self.chunk_records = cores, chunk_records
        self.catalog_schema, self.version_id, self.kafka = catalog_schema, version_id, kafka
        # The caller's kept probe where it reads on the caller's thread (the batch phase); a
        # streaming query's batches read on Spark's callback thread, with a probe of their own.
        self._probe: Any = None
        if bounds is None:
            self._probe = _probe(kafka)
            bounds = self._probe.bounds
        self._bounds = bounds
        self._gaps: dict[str, tuple[int, ...]] = {}  # raw segment path: its gap offsets
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kappa-sink-stage")
        self._staging: list[Future[bool]] = []
        self._frames: list[Callable[[], Any]] = []  # the last batch's reads, for again()
        self._columns: list[str] = []
        self._views: dict[str, ArchiveView] = {}  # per topic: what the archive holds
        self.phases: dict[str, float] = {}  # the last batch's read plan, seconds by phase

    def events(self, df: Any, start: Offsets, end: Offsets) -> Any:
        """The batch [start, end) as the streaming source's ``df`` would hold it."""
        from pyspark.sql.types import StructType

        from orchestrator.spark.read.source import KafkaLogSource

        spark = df.sparkSession
        self._frames, self._columns = [], list(df.columns)
        self.phases = {"catalog": 0.0, "broker": 0.0, "spark": 0.0}
        for topic, options in self.options.items():
            tasks = self._tasks(topic, options, start, end)
            began = time.monotonic()
            by_jvm = [t for t in tasks if t.decoded_only]
            rest = [t for t in tasks if not t.decoded_only]
            # The topic's own columns, as its streaming source declares them.
            schema = StructType.fromDDL(KafkaLogSource(dict(options)).schema())
            if by_jvm:
                self._frames.append(self._decoded(spark, schema, options, by_jvm))
            if rest:
                self._frames.append(_ranges_frame(spark, schema, options, rest))
            self.phases["spark"] += time.monotonic() - began
        return self.again() if self._frames else df

    def again(self) -> Any:
        """The last batch's events, planned afresh by Spark: after a decoded file it read was
        rebuilt (its size may differ from what Spark listed)."""
        return union([frame() for frame in self._frames]).select(*self._columns)

    def _tasks(self, topic: str, options: Mapping[str, str], start: Offsets, end: Offsets
               ) -> list[ReadTask]:
        """The batch's read tasks of ``topic``, cut by the planner that cuts the source's."""
        from orchestrator.spark.read.source import archive_view

        view = self._views.get(topic)
        if view is None:
            view = self._views[topic] = archive_view(options)
        began, broker = time.monotonic(), [0.0]

        def broker_starts() -> dict[tuple[str, int], int]:
            asked = time.monotonic()
            try:
                return self._broker_starts(topic)
            finally:
                broker[0] += time.monotonic() - asked

        tasks = plan_reads(view, start, end, self.cores, self.chunk_records, broker_starts)
        if tasks:
            for segments in view.held()[0].values():
                self._gaps.update({s.path: s.gap_offsets for s in segments if s.gap_offsets})
        self.phases["catalog"] += time.monotonic() - began - broker[0]
        self.phases["broker"] += broker[0]
        return tasks

    def _broker_starts(self, topic: str) -> dict[tuple[str, int], int]:
        return {k: v[0] for k, v in self._bounds([topic]).items()}

    def _decoded(self, spark: Any, schema: Any, options: Mapping[str, str],
                 tasks: list[ReadTask]) -> Callable[[], Any]:
        """What reads the rows of ``tasks`` from their decoded segments, in Spark. Each file is
        checked, and what each task found and its dead letters staged, on other threads while
        Spark reads: ``finish`` waits for them before the batch's commit, and says whether a
        file Spark read was found bad (and rebuilt), so that the batch is read again."""
        root = options["archive_root"]
        wanted = {ref.decoded_path: ref.decoded_checksum for task in tasks
                  for ref in task.segments
                  if ref.first_offset < task.end and ref.end_offset > task.start}
        self._staging.append(self._pool.submit(self._check_and_stage, root, wanted, tasks,
                                              options))
        ranges: dict[int, list[tuple[int, int]]] = {}
        for task in tasks:
            ranges.setdefault(task.partition, []).append((task.start, task.end))
        event = parse_ddl(options["schema"]).ddl()
        files = {f"{root}/{ref.decoded_path}": (task.partition, ref.first_offset, ref.end_offset)
                 for task in tasks for ref in task.segments if ref.decoded_path in wanted}

        def frame() -> Any:
            return decoded_frame(spark, files, event, schema, tasks[0].topic, ranges)

        try:
            listed = [frame()]
        except Exception:  # Spark lists the files now: one is missing. Rebuilt, it is there.
            if not self.finish():
                raise
            listed = [frame()]
        return lambda: listed.pop() if listed else frame()  # again(): listed afresh

    def _check_and_stage(self, root: str, wanted: dict[str | None, str | None],
                         tasks: list[ReadTask], options: Mapping[str, str]) -> bool:
        """Check the files (rebuilding what is missing or bad), then stage each task's read
        and dead letters; True if a file was rebuilt."""
        letters, rebuilt = self._checked(root, wanted, options)
        work: list[tuple[ReadTask, list[tuple[pa.Table, int, int]], int]] = []
        for task in tasks:
            parts, found = [], 0
            for ref in task.segments:
                lo, hi = max(task.start, ref.first_offset), min(task.end, ref.end_offset)
                if lo >= hi:
                    continue
                parts.append((letters[ref.decoded_path], lo, hi))
                gaps = self._gaps.get(ref.path, ())
                found += hi - lo - sum(1 for g in gaps if lo <= g < hi)
            work.append((task, parts, found))
        self._stage(work)
        return rebuilt

    def _checked(self, root: str, wanted: dict[str | None, str | None],
                 options: Mapping[str, str]) -> tuple[dict[str | None, pa.Table], bool]:
        """{decoded path: its dead letters} once each file is checked, on every core, and
        whether one was rebuilt from its raw segment (missing or bad: one line names it).
        A batch's memory grows with its dead letters, not its records."""
        from orchestrator.archive.decode_pass import read_decoded, rebuild_unless_mended
        from orchestrator.archive.parquet_store import ParquetStore
        from orchestrator.kafka.writer_schemas import writer_schemas
        from orchestrator.spark.read.source import source_registry
        from orchestrator.spark.writer import connection

        store = ParquetStore(root)
        registry = writer_schemas(source_registry(options, os.environ))

        def dead(table: pa.Table) -> pa.Table:
            return table.filter(table.column(DEAD))  # at once: the rest is 3 MB a file

        def check(path: str | None) -> pa.Table | None:
            assert path is not None and wanted[path] is not None
            try:
                return dead(read_decoded(store, path, str(wanted[path]), _DEAD_COLUMNS))
            except ArchiveError:
                return None  # rebuilt below, one file at a time

        with ThreadPoolExecutor(max_workers=self.cores) as pool:
            found = dict(zip(wanted, pool.map(check, wanted), strict=True))
        letters = {path: checked if checked is not None else dead(rebuild_unless_mended(
            connection, self.catalog_schema, store, str(path), str(wanted[path]),
            _DEAD_COLUMNS, registry)) for path, checked in found.items()}
        return letters, None in found.values()

    def finish(self) -> bool:
        """Wait until the batch's files are checked and its reads and dead letters staged
        (raises what that raised); True if a file was rebuilt since the last call, so that
        what Spark read of it meanwhile does not count."""
        staging, self._staging = self._staging, []
        return any([future.result() for future in staging])

    def _stage(self, work: list[tuple[ReadTask, list[tuple[pa.Table, int, int]], int]]
               ) -> None:
        from orchestrator.spark.writer import stage_dead_letters

        dead: list[tuple[Any, ...]] = []
        for task, parts, found in work:
            for table, lo, hi in parts:
                dead += dead_letter_rows(table, self.version_id, task.topic, task.partition,
                                         lo, hi)
            self._stage_read(task, found)
        stage_dead_letters(self.catalog_schema, dead)

    def _stage_read(self, task: ReadTask, found: int) -> None:
        from orchestrator.spark.writer import stage_read

        stage_read(self.catalog_schema, self.version_id, task.topic, task.partition,
                   task.start, task.end, found, archived_offsets=task.end - task.start,
                   decoded_offsets=task.end - task.start)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def _probe(kafka: Any) -> Any:
    """A log-end probe of the sink's own (it connects on its first call)."""
    from orchestrator.kafka.offsets import LogEndProbe

    return LogEndProbe(kafka)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent ranges as one: Spark filters a short OR of ranges far faster than a long one."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def decoded_frame(spark: Any, files: Mapping[str, tuple[int, int, int]], event_ddl: str,
                  schema: Any, topic: str, ranges: Mapping[int, list[tuple[int, int]]]) -> Any:
    """The events of ``topic`` in ``ranges`` ({partition: [(start, end)]}) of its decoded
    ``files`` ({path: (partition, first offset, end offset)}), read by Spark's Parquet reader,
    with the columns of the stream source's ``schema``: what the sink reads a batch's decoded
    segments with. A file that lies wholly inside a range is read with no offset filter, so
    Spark decodes neither offset column for it (a tile's files mostly do)."""
    from pyspark.sql import functions as F

    merged = {p: _merged(spans) for p, spans in ranges.items()}
    inside = [path for path, (p, first, end) in files.items()
              if any(lo <= first and end <= hi for lo, hi in merged.get(p, ()))]
    edges = [path for path in files if path not in inside]
    reads = []
    if inside:
        reads.append(_parquet(spark, inside, event_ddl).where(f"NOT {DEAD}"))
    if edges or not inside:
        where = " OR ".join(f"(kafka_partition = {p} AND kafka_offset >= {lo} AND "
                            f"kafka_offset < {hi})" for p, spans in sorted(merged.items())
                            for lo, hi in spans) or "false"
        reads.append(_parquet(spark, edges, event_ddl).where(f"NOT {DEAD} AND ({where})"))
    columns = [F.lit(topic).alias(f.name) if f.name == "kafka_topic" else F.col(f.name)
               for f in schema.fields]
    return union([read.select(*columns) for read in reads])


def _parquet(spark: Any, paths: list[str], event_ddl: str) -> Any:
    return spark.read.schema(_decoded_ddl(event_ddl)).parquet(*paths)


def dead_letter_rows(table: pa.Table, version_id: int, topic: str, partition: int, lo: int,
                     hi: int) -> list[tuple[Any, ...]]:
    """The dead letters of offsets [lo, hi) of one decoded segment (``table``: its dead
    letters' columns) as the stage takes them: (version id, topic, partition, offset,
    timestamp ms, key, value, reason)."""
    offsets = table.column("kafka_offset")
    letters = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
    n = letters.num_rows
    if not n:
        return []
    stamps = letters.column("kafka_timestamp").cast(pa.int64()).to_numpy() // 1000
    return list(zip([version_id] * n, [topic] * n, [partition] * n,
                    letters.column("kafka_offset").to_pylist(), stamps.tolist(),
                    letters.column(DEAD_KEY).to_pylist(), letters.column(DEAD_VALUE).to_pylist(),
                    letters.column(DEAD_REASON).to_pylist(), strict=True))


def _decoded_ddl(event_ddl: str) -> str:
    return ", ".join(["`kafka_partition` int", "`kafka_offset` bigint",
                      "`kafka_timestamp` timestamp", "`kafka_key` string",
                      "`kafka_headers` array<struct<key:string,value:binary>>", event_ddl,
                      f"`{DEAD}` boolean", f"`{DEAD_REASON}` string", f"`{DEAD_KEY}` binary",
                      f"`{DEAD_VALUE}` binary"])


def _ranges_frame(spark: Any, schema: Any, options: Mapping[str, str], tasks: list[ReadTask]
                  ) -> Callable[[], Any]:
    """What reads ``tasks`` through the source's own read tasks (raw segments or Kafka)."""
    ranges = _ranges_json(tasks)
    return lambda: (spark.read.format(RANGES_SOURCE).schema(schema)
                    .options(**options, ranges=ranges).load())


def _ranges_json(tasks: list[ReadTask]) -> str:
    return json.dumps([[t.topic, t.partition, t.start, t.end, t.cut,
                        [[r.path, r.first_offset, r.end_offset, r.records, r.checksum,
                          r.decoded_path, r.decoded_checksum] for r in t.segments]]
                       for t in tasks])


def union(streams: list[Any]) -> Any:
    """One DataFrame of several topics' events; columns a topic lacks are null."""
    first, *rest = streams
    for other in rest:
        first = first.unionByName(other, allowMissingColumns=True)
    return first
