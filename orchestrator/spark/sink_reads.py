"""A batch job's micro-batch, read by its sink: decoded segments through Spark's own Parquet
reader (vectorized, in the JVM, with no Python worker), every other range through the
source's read tasks run as a batch read (raw segments or Kafka, as ever).

The streaming source still plans the batches (its offsets, their tiling, the exactly-once
commit, resume and restart are unchanged) but reads nothing itself: one place decides, once
per batch, which of its read tasks the decoded segments serve, so no range is read twice.

The driver reads each decoded file it uses before Spark does: it checks the file's checksum
(rebuilding a missing or bad one from its raw segment, with one line naming it), stages what
the task found and its dead letters, which are a few columns of the file. Where the archive
root is not a file system path that every host shares, this is off and the source's read
tasks read the decoded segments as Arrow batches instead (``source.py``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.archive.coverage import ReadTask, read_tasks
from orchestrator.archive.decoding import DEAD_KEY, DEAD_REASON, DEAD_VALUE
from orchestrator.lag import chunk_size
from orchestrator.models import Offsets
from orchestrator.schema import parse_ddl

log = logging.getLogger("kappa.driver")
RANGES_SOURCE = "kappa_ranges"
_RECHECK_S = 10.0
_DEAD_COLUMNS = ["kafka_offset", "kafka_timestamp", "_dead", DEAD_REASON, DEAD_KEY, DEAD_VALUE]


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
                 catalog_schema: str, version_id: int, kafka: Any):
        self.options = options  # per topic: the source's options
        self.cores, self.chunk_records = cores, chunk_records
        self.catalog_schema, self.version_id, self.kafka = catalog_schema, version_id, kafka
        self._probe: Any = None
        self._gaps: dict[str, tuple[int, ...]] = {}  # raw segment path: its gap offsets
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kappa-sink-stage")
        self._staging: list[Future[None]] = []
        # {topic: (when, segments, decoded)}: segments never change once recorded, so what
        # was read stays true; asked again after _RECHECK_S for what was added since.
        self._seen: dict[str, tuple[float, dict[int, list[Any]], dict[str, tuple[str, str]]]] = {}

    def events(self, df: Any, start: Offsets, end: Offsets) -> Any:
        """The batch [start, end) as the streaming source's ``df`` would hold it."""
        from pyspark.sql.types import StructType

        from orchestrator.spark.query import union
        from orchestrator.spark.source import KafkaLogSource

        spark = df.sparkSession
        frames = []
        for topic, options in self.options.items():
            tasks = self._tasks(topic, options, start, end)
            by_jvm = [t for t in tasks if t.decoded_only]
            rest = [t for t in tasks if not t.decoded_only]
            # The topic's own columns, as its streaming source declares them.
            schema = StructType.fromDDL(KafkaLogSource(dict(options)).schema())
            if by_jvm:
                frames.append(self._decoded(spark, schema, options, by_jvm))
            if rest:
                frames.append(spark.read.format(RANGES_SOURCE).schema(schema)
                              .options(**options, ranges=_ranges_json(rest)).load())
        return union(frames).select(*df.columns) if frames else df

    def _tasks(self, topic: str, options: Mapping[str, str], start: Offsets, end: Offsets
               ) -> list[ReadTask]:
        """The batch's read tasks of ``topic``, cut as the source would cut them."""
        from orchestrator.spark.archive_source import archived_segments, decoded_segments
        from orchestrator.spark.source import source_decoding

        mine_start, mine_end = {topic: start.get(topic, {})}, {topic: end.get(topic, {})}
        total = sum(stop - mine_start[topic].get(p, stop) for p, stop in mine_end[topic].items())
        if not total:
            return []
        seen = self._seen.get(topic)
        if seen is None or time.monotonic() - seen[0] > _RECHECK_S:
            held = archived_segments(self.catalog_schema, options.get("log_identity"), topic,
                                     options["archive_root"])
            seen = self._seen[topic] = (time.monotonic(), held, decoded_segments(
                self.catalog_schema, held, source_decoding(options).fingerprint)
                if held else {})
        _, archived, decoded = seen
        self._gaps.update({s.path: s.gap_offsets for segments in archived.values()
                           for s in segments if s.gap_offsets})
        broker = self._broker_starts(topic) if archived else {}
        return read_tasks(mine_start, mine_end, chunk_size(total, self.cores,
                                                           self.chunk_records),
                          archived, decoded, broker)

    def _broker_starts(self, topic: str) -> dict[tuple[str, int], int]:
        from orchestrator.kafka.offsets import LogEndProbe

        if self._probe is None:
            self._probe = LogEndProbe(self.kafka)
        return {k: v[0] for k, v in self._probe.bounds([topic]).items()}

    def _decoded(self, spark: Any, schema: Any, options: Mapping[str, str],
                 tasks: list[ReadTask]) -> Any:
        """The rows of ``tasks`` from their decoded segments, read by Spark. Each file is
        checked first; what each task found and its dead letters are staged meanwhile, on
        another thread (``finish`` waits for it before the batch's commit)."""
        from pyspark.sql import functions as F

        root = options["archive_root"]
        # Per file, its dead letters only: a batch's memory grows with those, not its records.
        letters: dict[str, pa.Table] = {}
        work: list[tuple[ReadTask, list[tuple[pa.Table, int, int]], int]] = []
        ranges: dict[int, list[tuple[int, int]]] = {}
        for task in tasks:
            parts, found = [], 0
            for ref in task.segments:
                lo, hi = max(task.start, ref.first_offset), min(task.end, ref.end_offset)
                if lo >= hi:
                    continue
                assert ref.decoded_path is not None
                if ref.decoded_path not in letters:
                    letters[ref.decoded_path] = _checked(root, ref, self.catalog_schema)
                parts.append((letters[ref.decoded_path], lo, hi))
                gaps = self._gaps.get(ref.path, ())
                found += hi - lo - sum(1 for g in gaps if lo <= g < hi)
            work.append((task, parts, found))
            ranges.setdefault(task.partition, []).append((task.start, task.end))
        self._staging.append(self._pool.submit(self._stage, work))
        where = " OR ".join(f"(kafka_partition = {p} AND kafka_offset >= {lo} AND "
                            f"kafka_offset < {hi})" for p, spans in sorted(ranges.items())
                            for lo, hi in _merged(spans))
        event = parse_ddl(options["schema"]).ddl()
        frame = (spark.read.schema(_decoded_ddl(event))
                 .parquet(*(f"{root}/{path}" for path in letters))
                 .where(f"NOT _dead AND ({where})"))
        topic = tasks[0].topic
        return frame.select(*(F.lit(topic).alias(f.name) if f.name == "kafka_topic"
                              else F.col(f.name) for f in schema.fields))

    def finish(self) -> None:
        """Wait until the batch's reads and dead letters are staged (raises what staging
        raised)."""
        staging, self._staging = self._staging, []
        for future in staging:
            future.result()

    def _stage(self, work: list[tuple[ReadTask, list[tuple[pa.Table, int, int]], int]]
               ) -> None:
        from orchestrator.spark.writer import stage_dead_letters

        dead: list[tuple[Any, ...]] = []
        for task, parts, found in work:
            for table, lo, hi in parts:
                self._dead_letters(table, task, lo, hi, dead)
            self._stage_read(task, found)
        stage_dead_letters(self.catalog_schema, dead)

    def _dead_letters(self, table: pa.Table, task: ReadTask, lo: int, hi: int,
                      dead: list[tuple[Any, ...]]) -> None:
        """Add the dead letters of [lo, hi) of one decoded segment (``table``: its dead
        letters) to ``dead``."""
        offsets = table.column("kafka_offset")
        letters = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
        n = letters.num_rows
        if n:
            stamps = letters.column("kafka_timestamp").cast(pa.int64()).to_numpy() // 1000
            dead += zip([self.version_id] * n, [task.topic] * n, [task.partition] * n,
                        letters.column("kafka_offset").to_pylist(), stamps.tolist(),
                        letters.column(DEAD_KEY).to_pylist(),
                        letters.column(DEAD_VALUE).to_pylist(),
                        letters.column(DEAD_REASON).to_pylist(), strict=True)

    def _stage_read(self, task: ReadTask, found: int) -> None:
        from orchestrator.spark.writer import stage_read

        stage_read(self.catalog_schema, self.version_id, task.topic, task.partition,
                   task.start, task.end, found, archived_offsets=task.end - task.start)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._probe is not None:
            self._probe.close()
            self._probe = None


def _checked(root: str, ref: Any, catalog_schema: str) -> pa.Table:
    """The dead letters of a decoded segment, once its file is checked (rebuilt first if it
    is missing or bad)."""
    from orchestrator.archive.decode_pass import read_or_rebuild
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.spark.writer import connection

    table = read_or_rebuild(connection, catalog_schema, ParquetStore(root), ref.decoded_path,
                            ref.decoded_checksum, _DEAD_COLUMNS)
    return table.filter(table.column("_dead"))


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent ranges as one: Spark filters a short OR of ranges far faster than a long one."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _decoded_ddl(event_ddl: str) -> str:
    return ", ".join(["`kafka_partition` int", "`kafka_offset` bigint",
                      "`kafka_timestamp` timestamp", "`kafka_key` string",
                      "`kafka_headers` array<struct<key:string,value:binary>>", event_ddl,
                      "`_dead` boolean", f"`{DEAD_REASON}` string", f"`{DEAD_KEY}` binary",
                      f"`{DEAD_VALUE}` binary"])


def _ranges_json(tasks: list[ReadTask]) -> str:
    return json.dumps([[t.topic, t.partition, t.start, t.end, t.cut,
                        [[r.path, r.first_offset, r.end_offset, r.records, r.checksum,
                          r.decoded_path, r.decoded_checksum] for r in t.segments]]
                       for t in tasks])
