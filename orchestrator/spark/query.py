"""A version's streaming query: one source per topic, the job's transform, the foreachBatch
sink, and the trigger of its phase (available-now while catching up, a processing-time trigger
once live)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.archive.readable import archive_root, executor_archive_root
from orchestrator.archive_model.decoding import Decoding
from orchestrator.catalog.batches import StaleDriverError
from orchestrator.kafka.endpoint import KafkaEndpoint
from orchestrator.models import KAFKA_COLUMNS, DeployedVersion, Offsets, TopicInput
from orchestrator.schema import parse_ddl
from orchestrator.settings import Settings
from orchestrator.spark.batch_commit import BatchCommit
from orchestrator.spark.failures import spark_reason
from orchestrator.spark.read.pruning import QUARANTINE_COLUMNS, plan_with_pruning, stand_in_sources
from orchestrator.spark.read.sink_reads import SinkReads, jvm_root, union
from orchestrator.spark.read.source import KAFKA_DDL, SOURCE_NAME, source_options
from orchestrator.spark.shape import JobError, shape_output

LIVE_CHUNK = 2**62  # live batches are small: one Spark task per Kafka partition
LAG_CHECK_S = 2.0  # how often a live query not yet caught up measures its lag

log = logging.getLogger("kappa.driver")


class JobQuery:
    def __init__(self, settings: Settings, version: DeployedVersion, kafka: KafkaEndpoint,
                 transform: Callable[..., Any], cores: int, start_offsets: Offsets):
        self.settings, self.version, self.kafka = settings, version, kafka
        self.transform, self.cores, self.start_offsets = transform, cores, start_offsets
        self.read_options: dict[str, dict[str, str]] = {}  # per topic, of the last query built
        self.by_sink = False  # the current query's sink reads each batch itself

    def sink_reads(self, live: bool) -> bool:
        """Whether the sink reads each batch itself (spark/read/sink_reads.py): a batch job's
        catch-up where Spark's Parquet reader can read decoded segments, and there are some."""
        from orchestrator.spark.read.archive_source import archived_segments, decoded_segments

        s, v = self.settings, self.version
        root = executor_archive_root(s)
        if live or v.spec.mode != "batch" or not s.decoded_segments or jvm_root(root) is None:
            return False
        identity = json.dumps(v.log_identity.to_json() if v.log_identity else None)
        for source in v.spec.inputs:
            held = archived_segments(s.catalog_schema, identity, source.topic, root or "")
            if held and decoded_segments(s.catalog_schema, held, Decoding.of(source).fingerprint):
                return True
        return False

    def run(self, spark: Any, sink: BatchCommit, *, live: bool,
            tick: Callable[[], None] | None = None) -> None:
        """Run the query until it ends (catch-up) or fails; ``tick`` every LAG_CHECK_S."""
        s, v = self.settings, self.version
        self.by_sink = self.sink_reads(live)
        if self.by_sink:
            log.info("this catch-up reads decoded segments with Spark's Parquet reader: the "
                     "sink reads each batch")
        stream, output_mode = self._query(spark, live=live)
        sink.reads = SinkReads(self.read_options, self.cores, s.chunk_records, s.catalog_schema,
                               v.id, self.kafka) if self.by_sink else None
        writer = (stream.writeStream.outputMode(output_mode).foreachBatch(sink)
                  .option("checkpointLocation", v.checkpoint_dir)
                  .queryName(f"{v.job}__{v.version}__{'live' if live else 'catchup'}"))
        if live:
            writer = writer.trigger(processingTime=f"{s.live_trigger_seconds} seconds")
        else:
            writer = writer.trigger(availableNow=True)
        try:
            query = writer.start()
        except Exception as exc:
            if "AnalysisException" not in type(exc).__name__:
                raise
            hint = ("an aggregation without a watermark needs OUTPUT_MODE \"upsert\"; redeploy "
                    "under a new VERSION" if "output mode" in str(exc).lower()
                    else "fix transform() and redeploy under a new VERSION")
            raise JobError(f"{v.job} {v.version}: Spark cannot run transform()'s query with "
                           f"OUTPUT_MODE \"{v.spec.output_mode}\": {spark_reason(exc)}; "
                           f"{hint}") from exc
        try:
            # Raises if the query failed; False while it runs on.
            while not query.awaitTermination(LAG_CHECK_S):
                if tick is not None:
                    tick()
        except StaleDriverError:
            query.stop()
            raise
        finally:
            if sink.reads is not None:
                sink.reads.close()
        if not live:
            _log_first_progress(query)

    def batch_transform(self, df: Any) -> Any:
        """A batch job's transform of one micro-batch, given one DataFrame per topic if the
        job declared EVENT_SCHEMAS, shaped for the stage table."""
        from pyspark.sql import functions as F

        spec = self.version.spec
        if not spec.per_topic:
            return shape_output(self.transform(df), spec)
        per_topic = {}
        for source in spec.inputs:
            fields = [name for name, _ in parse_ddl(source.schema).fields]
            # Only the columns the source declares: see pruning.py.
            per_topic[source.topic] = df.where(F.col("kafka_topic") == source.topic).select(
                *(c for c in (*KAFKA_COLUMNS, *fields) if c in df.columns))
        return shape_output(self.transform(per_topic), spec)

    def _streams(self, spark: Any, *, live: bool,
                 columns: dict[str, tuple[str, ...] | None]) -> dict[str, Any]:
        """One streaming DataFrame per topic, each from its own source, declaring ``columns``
        of its topic (all where none are given)."""
        s, v = self.settings, self.version
        root = executor_archive_root(s)
        if root is None:
            log.warning("archive_root %s is a local path and executors may run on other hosts "
                        "(spark_master %s): replays read Kafka only; give it as a URI that "
                        "every host reaches (s3://..., or file://... for a shared mount)",
                        archive_root(s), s.spark_master)
        streams = {}
        for source in v.spec.inputs:
            options = self._options(source, live=live, columns=columns.get(source.topic),
                                    by_sink=self.by_sink)
            self.read_options[source.topic] = options
            if self.by_sink:  # the source plans the batches; the sink reads them
                options = {**options, "sink_reads": "true"}
            streams[source.topic] = spark.readStream.format(SOURCE_NAME).options(**options).load()
        return streams

    def tile_read_options(self) -> dict[str, dict[str, str]]:
        """Per topic, the options that a batch phase's reads take (batch_phase.py): the
        catch-up's, with every column the topic declares (Parquet prunes what the job does
        not read by itself)."""
        return {source.topic: self._options(source, live=False, columns=None, by_sink=True)
                for source in self.version.spec.inputs}

    def _options(self, source: TopicInput, *, live: bool, columns: tuple[str, ...] | None,
                 by_sink: bool) -> dict[str, str]:
        s, v = self.settings, self.version
        return source_options(
            kafka=self.kafka, source=source, group_id=v.consumer_group,
            start_offsets=self.start_offsets,
            chunk_records=LIVE_CHUNK if live else s.chunk_records,
            max_batch_records=max(s.max_batch_records, s.decoded_batch_records)
            if by_sink else s.max_batch_records, version_id=v.id,
            catalog_schema=s.catalog_schema, job=v.job, version=v.version,
            cores=self.cores, log_identity=v.log_identity,
            archive_root=executor_archive_root(s), columns=columns,
            decoded=s.decoded_segments, registry=s.schema_registry)

    def _query(self, spark: Any, *, live: bool) -> tuple[Any, str]:
        """The streaming DataFrame the sink receives, and Spark's output mode."""
        spec = self.version.spec
        batch = spec.mode == "batch"

        def build(streams: dict[str, Any]) -> tuple[Any, Any]:
            """The query's DataFrame, and the one whose plan reads the sources."""
            if batch:
                # The transform runs per batch, in the sink: the query only reads.
                events = union(list(streams.values()))
                return events, self._planned(lambda: self.batch_transform(events))
            shaped = shape_output(self._output(streams), spec)
            return shaped, shaped

        def on_sources(columns: dict[str, tuple[str, ...] | None]) -> tuple[Any, Any]:
            return build(self._streams(spark, live=live, columns=columns))

        if not self.settings.prune_columns:
            query = on_sources({})[0]
        else:
            schemas = {source.topic: source.schema for source in spec.inputs}
            with stand_in_sources(spark, {t: f"{KAFKA_DDL}, {ddl}" for t, ddl in
                                          schemas.items()}) as stand_ins:
                planned = build(stand_ins)[1]
            query = plan_with_pruning(
                spark, on_sources, planned,
                {topic: parse_ddl(ddl).names for topic, ddl in schemas.items()},
                QUARANTINE_COLUMNS if batch else frozenset())
        return query, ("append" if batch or spec.output_mode != "upsert" else "update")

    def _output(self, streams: dict[str, Any]) -> Any:
        spec = self.version.spec
        events: Any = streams if spec.per_topic else union(list(streams.values()))
        try:
            output = self.transform(events)
        except Exception as exc:
            raise JobError(f"{spec.name} {spec.version}: transform() raised "
                           f"{type(exc).__name__}: {spark_reason(exc)}; fix the job and "
                           "redeploy under a new VERSION") from exc
        if not getattr(output, "isStreaming", False):
            raise JobError(f"{spec.name} {spec.version}: transform() returned a "
                           f"{type(output).__name__} that is not a streaming DataFrame, but "
                           "MODE is \"stream\": build the result from the streaming events it "
                           "gets (no spark.read, collect() or toPandas()), or drop MODE")
        return output

    @staticmethod
    def _planned(plan: Callable[[], Any]) -> Any:
        """The DataFrame ``plan`` returns, or None if it cannot be planned on the stream (a
        batch transform that runs an action, say): then no column is pruned."""
        try:
            return plan()
        except Exception:
            return None


def unchanged(df: Any) -> Any:
    return df


def _log_first_progress(query: Any) -> None:
    """Where the run's first micro-batch spent its time, by Spark's own phases: what a deploy
    waits for before its first output."""
    progress = query.recentProgress
    if progress:
        phases = progress[0].get("durationMs") or {}
        log.info("first batch of the run, ms by phase: %s",
                 ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
