"""The driver's Spark configuration is sized from the settings and the cluster, not fixed."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from orchestrator.settings import Settings, load_settings
from orchestrator.spark.session import planned_cores, spark_conf


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[3]", 3), ("local[1]", 1), ("local[2, 4]", 2),
    ("local[*]", len(os.sched_getaffinity(0))),
])
def test_shuffle_partitions_follow_the_local_cores(master: str, cores: int) -> None:
    settings = Settings(spark_master=master)
    assert planned_cores(settings) == cores
    assert spark_conf(settings, "t")["spark.sql.shuffle.partitions"] == str(cores)


def test_a_cluster_version_takes_every_core_unless_capped() -> None:
    cluster = Settings(spark_master="spark://10.0.0.1:7077", spark_executor_cores=2)
    conf = spark_conf(cluster, "t")
    assert "spark.cores.max" not in conf and conf["spark.executor.cores"] == "2"
    capped = spark_conf(replace(cluster, spark_cores_max=6), "t")
    assert capped["spark.cores.max"] == "6" and capped["spark.sql.shuffle.partitions"] == "6"


def test_driver_addresses_are_settings() -> None:
    settings = load_settings({}, env={"KAPPA_SPARK_DRIVER_HOST": "10.1.2.3",
                                      "KAPPA_SPARK_DRIVER_BIND_ADDRESS": "0.0.0.0",
                                      "KAPPA_SPARK_CORES_MAX": "4"})
    conf = spark_conf(replace(settings, spark_master="spark://m:7077"), "t")
    assert conf["spark.driver.host"] == "10.1.2.3"
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert conf["spark.cores.max"] == "4"


class _Conf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Session:
    def __init__(self) -> None:
        self.conf = _Conf()


@pytest.mark.parametrize(("location", "through_filesystem"), [
    ("/var/kappa/checkpoints/job/v1", True), ("file:///var/kappa/checkpoints/job/v1", True),
    ("hdfs://namenode:8020/kappa/job/v1", False), ("s3a://bucket/kappa/job/v1", False),
])
def test_only_local_checkpoints_are_written_through_the_filesystem(
        location: str, through_filesystem: bool) -> None:
    from orchestrator.spark.checkpoint import (
        FILE_MANAGER_CONF,
        LOCAL_FILE_MANAGER,
        write_through_filesystem,
    )

    session = _Session()
    write_through_filesystem(session, location)
    expected = {FILE_MANAGER_CONF: LOCAL_FILE_MANAGER} if through_filesystem else {}
    assert session.conf.values == expected
