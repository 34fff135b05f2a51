"""The daemon that forks Spark's Python workers (``spark.python.daemon.module``): pyspark's
own, with pyspark imported compiled (see orchestrator.spark.pyspark_path). On the driver's host
the worker site does the same for every process; this covers executors on other hosts."""

from __future__ import annotations

from orchestrator.spark.pyspark_path import use_installed_pyspark

if __name__ == "__main__":
    use_installed_pyspark()
    from pyspark import daemon

    daemon.manager()
