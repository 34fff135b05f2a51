"""Builds the driver's SparkSession, sized so two versions, Airflow and the services fit."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.kafka.endpoint import PASSWORD_VARIABLE, SECRETS_VARIABLE
from orchestrator.kafka.registry_endpoint import TOKEN_VARIABLE, USER_INFO_VARIABLE
from orchestrator.settings import DSN_VARIABLE, Settings
from orchestrator.spark.launch import zygote
from orchestrator.spark.launch.cds import driver_java_options
from orchestrator.spark.pyspark_path import WORKER_SITE

_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Spark's default pattern, plus the names our secrets travel under.
_REDACT = "(?i)secret|password|token|access[.]?key|dsn|user_info"


def spark_conf(settings: Settings, app_name: str, dsn: str | None = None) -> dict[str, str]:
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master,
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.driver.extraJavaOptions": driver_java_options(),
        "spark.driver.host": settings.spark_driver_host,
        "spark.driver.bindAddress": settings.spark_driver_bind_address,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # One shuffle partition per core: Spark's 200 cost seconds of task overhead per batch,
        # a fixed 2 would leave a cluster's other cores idle. (A stateful query keeps the number
        # its checkpoint was started with.)
        "spark.sql.shuffle.partitions": str(planned_cores(settings)),
        "spark.sql.adaptive.enabled": "false",
        # A decoded catch-up names its Parquet files (spark/read/sink_reads.py): above 32 paths,
        # Spark would list them with a job of its own, a second per 10 M records.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "10000",
        "spark.sql.streaming.stopGracefullyOnShutdown": "false",
        "spark.python.worker.reuse": "true",
        # Workers import pyspark compiled, not from the source zip (see that module).
        "spark.python.daemon.module": "orchestrator.spark.daemon",
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
    if settings.kafka_secret_properties:
        conf[f"spark.executorEnv.{SECRETS_VARIABLE}"] = json.dumps(
            dict(settings.kafka_secret_properties))
    registry = settings.schema_registry
    if registry is not None:
        # Read tasks of Avro and Protobuf topics ask the registry for writer schemas themselves,
        # with the credentials resolved here (a file named by a setting may be this host's).
        for variable, secret in ((USER_INFO_VARIABLE, registry.user_info),
                                 (TOKEN_VARIABLE, registry.token)):
            if secret:
                conf[f"spark.executorEnv.{variable}"] = secret
    if settings.spark_master.startswith("spark://"):
        conf.update({
            "spark.executor.memory": settings.spark_executor_memory,
            "spark.executor.cores": str(settings.spark_executor_cores),
        })
        if settings.spark_cores_max is not None:
            conf["spark.cores.max"] = str(settings.spark_cores_max)
    return conf


def planned_cores(settings: Settings) -> int:
    """The cores a version will run on, as far as is known before Spark starts: local[N], this
    host's usable cores for local[*], else spark_cores_max or one executor's cores (the driver
    corrects it with :func:`cluster_cores` once executors have registered)."""
    master = settings.spark_master.strip()
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master)
    if match:
        n = match.group(1)
        if n is None:
            return 1
        return len(os.sched_getaffinity(0)) if n == "*" else max(1, int(n))
    return settings.spark_cores_max or settings.spark_executor_cores


def cluster_cores(settings: Settings, spark: Any) -> int:
    """The cores the running session has: on a cluster, the executors' cores that registered
    (Spark's default parallelism), capped by spark_cores_max."""
    planned = planned_cores(settings)
    if not settings.spark_master.startswith("spark://"):
        return planned
    offered = int(spark.sparkContext.defaultParallelism)
    if settings.spark_cores_max is not None:
        offered = min(offered, settings.spark_cores_max)
    return max(planned, offered)


_SECRET_PREFIX = "spark.executorEnv."


def build_session(settings: Settings, app_name: str, code: Path | None = None) -> Any:
    """The session, with the secrets kept out of every command line.

    The Python processes that its JVM starts on this host get the worker site and ``code`` (a
    version's deployed package, if known) on their path, and the driver's zygote when
    python_fork_server is on (see zygote.py): they inherit this process's environment.

    PySpark puts each builder option on the spark-submit command line (``--conf k=v``), which
    any user of the host can read. The executors' secrets (the DSN, the SASL password) therefore
    go through a properties file that only this user can read, removed once the JVM has read it.
    """
    from pyspark.sql import SparkSession

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(code) if code else None, WORKER_SITE, os.environ.get("PYTHONPATH")) if p)
    if settings.python_fork_server:
        zygote.start()
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
