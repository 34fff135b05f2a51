"""A Spark Python Data Source that streams one Kafka topic through confluent-kafka.

PySpark bundles no Kafka connector and no Maven repository is reachable, so this source reads the
log itself; a job reads several topics through one source each. Offsets are
``{"<topic>": {"<partition>": next offset}}``. Each valid record becomes one row: the Kafka
metadata columns, then the declared event fields. Invalid records (and tombstones, unless the job
passes them) never enter Spark: the task that read them stages them as dead letters, and the
batch's commit moves them into the dead-letter table, so every offset is accounted for.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from orchestrator.archive.coverage import SegmentRef, spans
from orchestrator.archive_model.decoding import Decoding, decoder_digest
from orchestrator.archive_model.held import readable_bounds
from orchestrator.errors import LogChangedError
from orchestrator.event_formats import format_from_json, format_to_json
from orchestrator.kafka.endpoint import PASSWORD_VARIABLE, SECRETS_VARIABLE, KafkaEndpoint
from orchestrator.kafka.registry_endpoint import (
    TOKEN_VARIABLE,
    USER_INFO_VARIABLE,
    RegistryEndpoint,
)
from orchestrator.kafka.writer_schemas import writer_schemas
from orchestrator.lag import (
    log_changed_reason,
    log_mismatches,
    take_records,
)
from orchestrator.log_identity import LogIdentity, log_gone_reason, replaced
from orchestrator.models import EventFormat, TopicInput
from orchestrator.parsing import EventParser
from orchestrator.record_parsers import record_parser
from orchestrator.schema import Struct, parse_ddl
from orchestrator.spark.read.arrow import arrow_fields
from orchestrator.spark.read.batch_builder import KAFKA_FIELDS, ROWS_PER_ARROW_BATCH, BatchBuilder
from orchestrator.spark.read.planner import ArchiveView, plan_reads

SOURCE_NAME = "kappa_kafka"
_KAFKA_COLUMN_DDL = {
    "kafka_topic": "`kafka_topic` string", "kafka_partition": "`kafka_partition` int",
    "kafka_offset": "`kafka_offset` bigint", "kafka_timestamp": "`kafka_timestamp` timestamp",
    "kafka_key": "`kafka_key` string",
    "kafka_headers": "`kafka_headers` array<struct<key:string,value:binary>>",
}
KAFKA_DDL = ", ".join(_KAFKA_COLUMN_DDL.values())
FIRST_BATCH_RECORDS = 10_000


def source_options(*, kafka: KafkaEndpoint, source: TopicInput, group_id: str,
                   start_offsets: dict[str, dict[str, int]], chunk_records: int,
                   max_batch_records: int, version_id: int, catalog_schema: str,
                   job: str, version: str, cores: int = 1,
                   log_identity: LogIdentity | None = None,
                   archive_root: str | None = None,
                   columns: tuple[str, ...] | None = None,
                   decoded: bool = True,
                   registry: RegistryEndpoint | None = None) -> dict[str, str]:
    read = None if log_identity is None else LogIdentity(
        log_identity.cluster_id, {source.topic: log_identity.topics.get(source.topic)})
    return {
        # The password is not an option: executors read it from their environment.
        "kafka": json.dumps(kafka.public_options()), "topic": source.topic, "group_id": group_id,
        "schema": source.schema, "non_negative": json.dumps(list(source.non_negative)),
        "tombstones": source.tombstones, "format": json.dumps(format_to_json(source.format)),
        # Where Avro and Protobuf writer schemas are asked for; its credentials are no option.
        "registry": json.dumps(None if registry is None or source.format.kind == "json" else
                               {"url": registry.url, "ca_location": registry.ca_location}),
        "start_offsets": json.dumps({source.topic: start_offsets.get(source.topic, {})}),
        "chunk_records": str(chunk_records), "max_batch_records": str(max_batch_records),
        "cores": str(cores),
        "version_id": str(version_id), "catalog_schema": catalog_schema,
        "job": job, "version": version,
        # Which log the version read: checked before every batch is planned, so that a batch
        # is not cut from another log (a topic recreated, a volatile broker restarted).
        "log_identity": json.dumps(read.to_json() if read else None),
        # Offsets below the archive's end are read from its segments there (none: Kafka only).
        "archive_root": archive_root or "",
        # Where the archive holds the segments decoded under this source's decoding, read them
        # with no parse (archive_model/decoding.py).
        "decoded": "true" if decoded else "",
        # The parser's digest, taken where the driver's files are: an executor may import the
        # orchestrator from a zip, whose files it cannot read.
        "decoder": decoder_digest(),
        # The columns the job reads (pruning.py), in the source's order; none: every column.
        "columns": json.dumps(columns),
    }


def source_decoding(options: Mapping[str, str]) -> Decoding:
    """The decoding of the source's records: what decides a row or a dead letter."""
    return Decoding(options["schema"], tuple(sorted(json.loads(options["non_negative"]))),
                    options["tombstones"], decoder=options["decoder"],
                    format=source_format(options))


def source_format(options: Mapping[str, str]) -> EventFormat:
    """How the source's record values are encoded, with the reader schema they are read with."""
    return format_from_json(json.loads(options.get("format") or "null"))


def source_registry(options: Mapping[str, str], env: Mapping[str, str]
                    ) -> RegistryEndpoint | None:
    """The schema registry as the options name it, with the credentials of this process's
    environment (``env``), driver or executor; None if none is configured."""
    public = json.loads(options.get("registry") or "null")
    if public is None:
        return None
    return RegistryEndpoint(public["url"], env.get(USER_INFO_VARIABLE) or None,
                            env.get(TOKEN_VARIABLE) or None, public["ca_location"])


def archive_view(options: Mapping[str, str]) -> ArchiveView:
    """What the archive holds of the source's topic, as its options say where to look."""
    return ArchiveView(options.get("catalog_schema") or "", options["topic"],
                       options.get("archive_root") or None, options.get("log_identity"),
                       source_decoding(options).fingerprint if options.get("decoded") else None)


def declared_columns(options: Mapping[str, str]) -> tuple[str, ...] | None:
    columns = json.loads(options.get("columns") or "null")
    return None if columns is None else tuple(columns)


class KafkaRange(InputPartition):
    """Offsets [start, end) of one partition: [start, archived_end) from the archive's
    ``segments``, the rest from Kafka."""

    def __init__(self, topic: str, partition: int, start: int, end: int,
                 segments: tuple[SegmentRef, ...] = (), archived_end: int | None = None):
        cut = start if not segments else end if archived_end is None else archived_end
        super().__init__((topic, partition, start, end, cut))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.segments, self.archived_end = segments, cut


class KafkaLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        columns = declared_columns(self.options)
        if columns is None:
            return f"{KAFKA_DDL}, {self.options['schema']}"
        event = parse_ddl(self.options["schema"])
        kept = Struct(tuple((name, t) for name, t in event.fields if name in columns))
        return ", ".join([*(ddl for name, ddl in _KAFKA_COLUMN_DDL.items() if name in columns),
                          *([kept.ddl()] if kept.fields else [])])

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]):
        self.options = options
        self._kafka: KafkaEndpoint | None = None
        self.topic = options["topic"]
        self.group_id = options["group_id"]
        self.chunk_records = int(options["chunk_records"])
        self.cores = int(options.get("cores", "1"))
        self.max_batch_records = int(options["max_batch_records"])
        self.archive_root = options.get("archive_root") or None
        self._probe: Any = None
        self._archive = archive_view(options)
        self._last_bounds: dict[tuple[str, int], tuple[int, int]] = {}
        self._available_now_end: dict[str, dict[str, int]] | None = None
        self._served = False  # whether this query has offered a batch yet

    @property
    def kafka(self) -> KafkaEndpoint:
        """The endpoint with its secrets, which are no options: each process, driver or
        executor, reads them from its own environment."""
        if self._kafka is None:
            secrets = json.loads(os.environ.get(SECRETS_VARIABLE) or "{}")
            self._kafka = KafkaEndpoint.from_options(json.loads(self.options["kafka"]),
                                                     os.environ.get(PASSWORD_VARIABLE),
                                                     tuple(sorted(secrets.items())))
        return self._kafka

    def __getstate__(self) -> dict[str, Any]:
        # pyspark pickles the reader into every read task: never the secrets, nor the probe.
        return {**self.__dict__, "_kafka": None, "_probe": None}

    # Driver side -------------------------------------------------------------------------
    def _bounds(self) -> dict[tuple[str, int], tuple[int, int]]:
        """{(topic, partition): (log start, log end)} of the topic, from a probe kept open."""
        from orchestrator.kafka.offsets import LogEndProbe

        if self._probe is None:
            self._probe = LogEndProbe(self.kafka)
        bounds: dict[tuple[str, int], tuple[int, int]] = self._probe.bounds([self.topic])
        self._last_bounds = bounds
        return bounds

    def _log_ends(self) -> dict[str, dict[str, int]]:
        return _offsets(self._bounds(), 1)

    def initialOffset(self) -> dict[str, dict[str, int]]:
        start: dict[str, dict[str, int]] = json.loads(self.options["start_offsets"])
        return start

    def prepareForTriggerAvailableNow(self) -> None:
        # An available-now run stops at the log end seen when it started.
        self._available_now_end = self._log_ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_batch_records)

    def _check_log(self) -> None:
        from orchestrator.kafka.admin import log_identity

        recorded = LogIdentity.from_json(json.loads(self.options.get("log_identity") or "null"))
        if recorded is None:
            return
        gone = replaced(recorded, log_identity(self.kafka, [self.topic]), [self.topic])
        if gone:
            raise LogChangedError(log_gone_reason(gone, self.options["job"],
                                                  self.options["version"]))

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit
                     ) -> dict[str, dict[str, int]]:
        self._check_log()
        bounds = self._readable(self._bounds())
        starts, ends = _offsets(bounds, 0), _offsets(bounds, 1)
        mismatches = log_mismatches(start, bounds)
        if mismatches:
            raise LogChangedError(log_changed_reason(mismatches, self.options["job"],
                                                     self.options["version"]))
        if self._available_now_end is not None:
            # The log end seen when the run started, plus partitions that appeared since.
            ends = {t: {**ps, **self._available_now_end.get(t, {})} for t, ps in ends.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not self._served and not self.options.get("sink_reads"):
            # A small first batch: the deploy shows committed output within seconds, and the
            # query's start-up is not paid again by a full-size batch. (Where the sink reads
            # decoded segments, a full batch takes seconds too, and a small one costs a
            # Spark job: a second at a million records.)
            max_rows = min(max_rows or FIRST_BATCH_RECORDS, FIRST_BATCH_RECORDS)
        end = take_records(start, ends, max_rows, starts)
        self._served = self._served or end != start
        return end

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return self._log_ends()

    def partitions(self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
                   ) -> list[InputPartition]:
        if self.options.get("sink_reads"):
            return []  # the sink reads the batch itself (spark/read/sink_reads.py)

        def broker_starts() -> dict[tuple[str, int], int]:
            # As latestOffset just saw them, unless a restart plans its unfinished batch first.
            return {k: v[0] for k, v in (self._last_bounds or self._bounds()).items()}

        return [KafkaRange(t.topic, t.partition, t.start, t.end, t.segments, t.cut)
                for t in plan_reads(self._archive, start, end, self.cores, self.chunk_records,
                                    broker_starts)]

    def _readable(self, broker: dict[tuple[str, int], tuple[int, int]]
                  ) -> dict[tuple[str, int], tuple[int, int]]:
        """The broker's bounds, reaching down into the archive where retention took what it
        holds; the archive is asked only once the log has lost its first offsets."""
        if not self.archive_root or all(first == 0 for first, _ in broker.values()):
            return broker
        return readable_bounds(broker, spans(self.topic, self._archived()))

    def _archived(self) -> dict[int, list[Any]]:
        """{partition: segments} the archive holds of the log this version reads."""
        return self._archive.held()[0]

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        # Offsets are committed by the sink, in the same transaction as the output rows.
        pass

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    # Executor side -----------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from orchestrator.failpoints import fail_point
        from orchestrator.kafka.reader import read_range
        from orchestrator.spark.read.columnar import ColumnarParser
        from orchestrator.spark.writer import stage_read

        assert isinstance(partition, KafkaRange)
        fail_point("source.read")
        schema = parse_ddl(self.options["schema"])
        columns = declared_columns(self.options)
        wanted = None if columns is None else frozenset(columns)
        non_negative = json.loads(self.options["non_negative"])
        pass_tombstones = self.options["tombstones"] == "pass"
        registry = writer_schemas(source_registry(self.options, os.environ))
        parser = record_parser(schema, non_negative, source_format(self.options), registry)
        builder = BatchBuilder(
            pa.schema([*KAFKA_FIELDS, *arrow_fields(schema)]), partition.topic,
            partition.partition, len(parser.fields),
            pass_tombstones=pass_tombstones,
            version_id=int(self.options["version_id"]),
            catalog_schema=self.options["catalog_schema"], wanted=wanted,
        )
        # Batches are built in the full schema (offsets order the archive's merges) with the
        # columns the job does not read left null, and leave with only those it reads.
        out = (lambda batch: batch) if columns is None else \
            (lambda batch: batch.select(list(columns)))
        # Flat JSON schemas are checked a chunk at a time; any other keeps the per-record loop.
        columnar = ColumnarParser.for_schema(schema, parser, non_negative, pass_tombstones) \
            if isinstance(parser, EventParser) else None
        parse = parser.parse
        add = builder.add
        found = decoded = 0
        cut = partition.archived_end
        chunks: Iterator[Any] = iter(())
        if partition.segments:  # imported only where the archive is read
            from orchestrator.archive.decoder import parsed_chunks
            from orchestrator.spark.read.archive_source import decoded_range, raw_range

            decoding = source_decoding(self.options)
            root = self.archive_root or ""
            read_schema = builder.schema if columns is None else pa.schema(
                [builder.schema.field(c) for c in columns])
            for ref in partition.segments:
                lo, hi = max(partition.start, ref.first_offset), min(cut, ref.end_offset)
                if lo >= hi:
                    continue
                if ref.decoded_path is not None:  # decoded once: no parse, no Python row
                    rows, dead = decoded_range(root, ref, lo, hi, partition.topic, read_schema,
                                               self.options["catalog_schema"], registry)
                    found += rows.num_rows + len(dead)
                    decoded += hi - lo
                    builder.add_dead_letters(dead)
                    builder.flush_dead_letters()
                    yield from rows.to_batches(max_chunksize=ROWS_PER_ARROW_BATCH)
                    continue
                for batch, dead in parsed_chunks(raw_range(root, ref, lo, hi), decoding,
                                                 partition.topic, partition.partition, wanted,
                                                 registry=registry):
                    found += batch.num_rows + len(dead)
                    builder.add_dead_letters(dead)
                    if len(builder.dead) >= ROWS_PER_ARROW_BATCH:
                        builder.flush_dead_letters()
                    if batch.num_rows:
                        yield out(batch)
        if cut < partition.end:
            chunks = itertools.chain(chunks, read_range(
                self.kafka, partition.topic, partition.partition, cut, partition.end,
                self.group_id, headers=True))
        for records in chunks:
            found += len(records)
            if columnar is not None:
                builder.extend(*columnar.parse(records))  # type: ignore[arg-type]
            else:
                for offset, timestamp_ms, key, value, headers in records:  # type: ignore[misc]
                    values, error = parse(value)
                    add(offset, timestamp_ms, key, value, headers, values, error)
            if len(builder.dead) >= ROWS_PER_ARROW_BATCH:
                builder.flush_dead_letters()
            if builder.size >= ROWS_PER_ARROW_BATCH:
                yield out(builder.flush())
        builder.flush_dead_letters()
        stage_read(self.options["catalog_schema"], int(self.options["version_id"]),
                   partition.topic, partition.partition, partition.start, partition.end, found,
                   archived_offsets=cut - partition.start, decoded_offsets=decoded)
        if builder.size:
            yield out(builder.flush())


def _offsets(bounds: dict[tuple[str, int], tuple[int, int]], side: int
             ) -> dict[str, dict[str, int]]:
    """One side of the bounds (0: log starts, 1: log ends) as source offsets."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), pair in bounds.items():
        out.setdefault(topic, {})[str(partition)] = pair[side]
    return out
