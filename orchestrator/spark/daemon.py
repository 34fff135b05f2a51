"""The daemon that forks Spark's Python workers (``spark.python.daemon.module``): pyspark's
own, with pyspark imported compiled (see orchestrator.spark.pyspark_path). On the driver's host
the worker site does the same for every process; this covers executors on other hosts.

It imports what every worker imports in its first task before it forks any: read tasks import
the log source, pyarrow and (through pyarrow's time zones) pandas, 0.5 CPU-s in each worker
otherwise. ``gc.freeze()`` then keeps those objects out of the workers' collections, so that a
collection neither walks them nor copies their pages."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os

from orchestrator.spark.pyspark_path import use_installed_pyspark

PRELOAD = ("pyspark.worker", "pyarrow", "pandas", "orchestrator.spark.read.source",
           "orchestrator.spark.read.columnar", "orchestrator.kafka.reader")
# Off: the daemon imports nothing before it forks (to compare, or should a preload misbehave).
PRELOAD_VARIABLE = "KAPPA_WORKER_PRELOAD"


def preload() -> None:
    if os.environ.get(PRELOAD_VARIABLE, "on") == "off":
        return
    for module in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    gc.freeze()


if __name__ == "__main__":
    use_installed_pyspark()
    preload()
    from pyspark import daemon

    daemon.manager()
