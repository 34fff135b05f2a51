"""Could a catch-up read the archive in the JVM alone? Spark's own Parquet reader and from_json
over archived segments, with pageview_counts v1's aggregation, on local[2].

    .venv/bin/python bench/spark_json.py [--events 4000000] [--runs 3]

Writes EVENTS sample page views as archive segments (parquet_store's format, 100,000 records
each) into a temporary directory, then times, per run, one pass that parses every value with
`from_json` and aggregates the valid events by URL, as kappa's replay would. It prints the
records/s of a pass on 2 cores and the URL groups found, against the reference's count from
orchestrator.parsing: Spark's JSON reader is more lenient than kappa's (it reads a number where
a string is declared as that number's text), so a difference in groups is a difference in what
counts as valid. It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "user_id bigint, url string, ts bigint, duration_ms bigint"
SEGMENT_RECORDS = 100_000


def write_segments(root: Path, events: int) -> int:
    """Sample page views as archive segments; returns the URL groups of the valid ones."""
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.parsing import EventParser
    from orchestrator.samples.sample import sample_events

    store, parser = ParquetStore(str(root)), EventParser(
        [("user_id", "long"), ("url", "string"), ("ts", "long"), ("duration_ms", "long")],
        ["duration_ms"])
    urls: set[str] = set()
    batch: list[tuple[int, int, int, bytes | None, bytes | None, None]] = []
    for offset, (key, value) in enumerate(sample_events(events, 1)):
        parsed, _ = parser.parse(value)
        if parsed is not None:
            urls.add(parsed[1])
        batch.append((offset, 1_700_000_000_000 + offset, 1, key, value, None))
        if len(batch) == SEGMENT_RECORDS or offset == events - 1:
            store.write(f"{offset // SEGMENT_RECORDS:05d}.parquet", batch)
            batch = []
    return len(urls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # The repository, not bench/, first: bench/profile.py would shadow the standard library's
    # profile module, which pyspark imports.
    sys.path[0] = str(ROOT)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    root = Path(tempfile.mkdtemp(prefix="kappa-bench-spark-json-"))
    try:
        reference_urls = write_segments(root, args.events)
        spark = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "2g")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        for run in range(args.runs):
            events = spark.read.parquet(str(root)).select(
                F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
            valid = events.where("e.user_id IS NOT NULL AND e.url IS NOT NULL AND e.ts IS NOT "
                                 "NULL AND e.duration_ms >= 0")
            began = time.perf_counter()
            groups = valid.groupBy("e.url").agg(F.count(F.lit(1)), F.sum("e.duration_ms"))
            found = len(groups.collect())
            took = time.perf_counter() - began
            print(f"run {run + 1}: {args.events:,} records in {took:.2f} s, "
                  f"{args.events / took:,.0f} records/s on 2 cores, "
                  f"{2e6 * took / args.events:.2f} core-µs a record; {found} URL groups "
                  f"against the reference's {reference_urls}", flush=True)
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
