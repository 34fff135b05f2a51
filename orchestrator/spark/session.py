"""Builds the driver's SparkSession, sized so two versions, Airflow and the services fit."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from orchestrator.kafka_endpoint import PASSWORD_VARIABLE
from orchestrator.settings import Settings
from orchestrator.spark.writer import DSN_VARIABLE

# Fast start of a short-lived JVM; the replay is CPU-bound in Python workers, not in the JIT.
_DRIVER_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Spark's default pattern, plus the names our secrets travel under.
_REDACT = "(?i)secret|password|token|access[.]?key|dsn"


def spark_conf(settings: Settings, app_name: str, dsn: str | None = None) -> dict[str, str]:
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master,
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.driver.extraJavaOptions": _DRIVER_JAVA_OPTS,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Tiny aggregations per micro-batch: 200 shuffle partitions cost seconds of task overhead.
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.streaming.stopGracefullyOnShutdown": "false",
        "spark.python.worker.reuse": "true",
        # Stream jobs keep their state in the version's own checkpoint, in RocksDB, with
        # changelog checkpointing: a batch writes what changed, not the whole state.
        "spark.sql.streaming.stateStore.providerClass": _ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Timestamps render the same whatever the host's zone: a replay elsewhere is identical.
        "spark.sql.session.timeZone": "UTC",
        # Executors write into PostgreSQL themselves (orchestrator.spark.writer): they get the
        # DSN through their environment; redaction keeps it out of any listing of the conf.
        "spark.redaction.regex": _REDACT,
    }
    if dsn is not None:
        conf[f"spark.executorEnv.{DSN_VARIABLE}"] = dsn
    if settings.kafka_bootstrap and settings.kafka.password:
        # Read tasks connect to Kafka themselves; the name matches the redaction pattern.
        conf[f"spark.executorEnv.{PASSWORD_VARIABLE}"] = settings.kafka.password
    if settings.spark_master.startswith("spark://"):
        conf.update({
            "spark.executor.memory": settings.spark_executor_memory,
            "spark.executor.cores": str(settings.spark_executor_cores),
            "spark.cores.max": str(settings.spark_executor_cores),
        })
    return conf


_SECRET_PREFIX = "spark.executorEnv."


def build_session(settings: Settings, app_name: str) -> Any:
    """The session, with the secrets kept out of every command line.

    PySpark puts each builder option on the spark-submit command line (``--conf k=v``), which
    any user of the host can read. The executors' secrets (the DSN, the SASL password) therefore
    go through a properties file that only this user can read, removed once the JVM has read it.
    """
    from pyspark.sql import SparkSession

    conf = spark_conf(settings, app_name, settings.pg_dsn)
    secrets = {k: v for k, v in conf.items() if k.startswith(_SECRET_PREFIX)}
    builder = SparkSession.builder
    for key, value in conf.items():
        if key not in secrets:
            builder = builder.config(key, value)
    if not secrets:
        return builder.getOrCreate()
    fd, path = tempfile.mkstemp(prefix="kappa-spark-", suffix=".properties")  # mode 0600
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for key, value in secrets.items():
                out.write(f"{key}={_escape(value)}\n")
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {path} pyspark-shell"
        return builder.getOrCreate()
    finally:
        if previous is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = previous
        os.unlink(path)


def _escape(value: str) -> str:
    """A value as java.util.Properties reads it back (Spark reads the file as UTF-8)."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + out if out[:1] in (" ", "\t", "\f") else out
