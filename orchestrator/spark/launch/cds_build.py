"""Builds the driver JVMs' AppCDS archive (see ``orchestrator.spark.launch.cds``).

    python -m orchestrator.spark.launch.cds_build ARCHIVE

Runs what a driver runs first (a session as drivers configure it, a Python streaming data
source, a stateful aggregation in RocksDB, foreachBatch), so that the archive holds the classes
every driver loads; the JVM writes them when it exits. The archive appears under its final name
only once complete.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _warm_up(spark: Any, checkpoint: str) -> None:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"at": 0}

        def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
            return {"at": 2}

        def partitions(self, start: dict[str, int], end: dict[str, int]
                       ) -> list[InputPartition]:
            return [InputPartition(i) for i in range(start["at"], end["at"])]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield pa.RecordBatch.from_pydict({"k": pa.array(range(100), pa.int64())})

        def commit(self, end: dict[str, int]) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "kappa_cds_warm_up"

        def schema(self) -> str:
            return "k bigint"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return Reader()

    spark.dataSource.register(Source)
    counts = spark.readStream.format("kappa_cds_warm_up").load().groupBy("k").count()
    seen: list[int] = []
    query = (counts.writeStream.outputMode("update")
             .foreachBatch(lambda df, _: seen.append(len(df.toArrow())))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if not seen:
        raise RuntimeError("the warm-up query ran no batch")


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from orchestrator.settings import Settings
    from orchestrator.spark.launch.cds import DRIVER_JAVA_OPTS
    from orchestrator.spark.session import spark_conf

    target = Path(argv[0])
    partial = target.with_suffix(f".{os.getpid()}.partial")
    try:
        conf = spark_conf(Settings(spark_master="local[2]"), "kappa-cds-build")
        conf["spark.driver.extraJavaOptions"] = \
            f"{DRIVER_JAVA_OPTS} -XX:ArchiveClassesAtExit={partial}"
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory(prefix="kappa-cds-") as scratch:
            _warm_up(spark, scratch)
        spark.stop()
        # The JVM writes the archive as it exits, which it does when its stdin closes.
        jvm.stdin.close()
        jvm.wait(timeout=300)
        if not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"the JVM exited ({jvm.returncode}) without writing it")
        os.replace(partial, target)
    except Exception as exc:  # an optimisation only: say why; drivers run without it
        print(f"AppCDS archive not built: {exc}", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return 1
    finally:
        target.with_suffix(".building").unlink(missing_ok=True)
    print(f"AppCDS archive written: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
