"""A replay on a real Spark standalone cluster (master and worker started here on loopback)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyspark
import pytest

from conftest import job_file, wait_until
from integration.helpers import assert_batches_tile_the_log, dead_letters, output
from integration.observability import free_port as _free_port
from integration.observability import stop_process
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
SPARK_HOME = Path(pyspark.__file__).parent


def _spark_class(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1")
    with open(log, "wb") as out:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-cluster")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _spark_class(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                           "--port", str(port), "--webui-port", str(_free_port())],
                          logs / "master.log")
    worker = None
    try:
        wait_until(lambda: "Starting Spark master" in (logs / "master.log").read_text()
                   and "I have been elected leader" in (logs / "master.log").read_text(),
                   90, "the Spark master")
        # 2 cores and 1.5 GiB: one executor of 1 GiB per driver, beside the other services.
        worker = _spark_class(["org.apache.spark.deploy.worker.Worker", url, "--host",
                               "127.0.0.1", "--cores", "2", "--memory", "1536m",
                               "--webui-port", str(_free_port()),
                               "--work-dir", str(logs / "work")], logs / "worker.log")
        wait_until(lambda: "Successfully registered with master"
                   in (logs / "worker.log").read_text(), 90, "the Spark worker to register")
        yield url
    finally:
        for proc in (worker, master):
            if proc is not None:
                stop_process(proc)


def test_replay_on_a_standalone_cluster_is_exact(service, settings, spark_master: str, topic,
                                                 tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator

    settings = replace(settings, spark_master=spark_master, spark_executor_memory="1g")
    cluster = Orchestrator(settings)
    cluster.produce_sample(topic, 100_000, seed=41)
    cluster.deploy(job_file(tmp_path, "v2", topic))
    try:
        st = cluster.wait("pageview_counts", "v2", timeout_s=300)
        assert st.app_id and st.app_id.startswith("app-")  # a standalone application id
        ref = compute(settings.kafka_bootstrap, topic)
        assert output(settings, "pageview_counts__v2") == ref.v2
        assert dead_letters(settings, "pageview_counts__v2__dead_letters") == ref.invalid_offsets
        assert_batches_tile_the_log(settings, "pageview_counts", "v2", topic, ref.log_end)
    finally:
        cluster.stop("pageview_counts", "v2")


def test_stream_job_on_a_standalone_cluster_is_exact(service, settings, spark_master: str,
                                                     tmp_path: Path) -> None:
    """A stateful stream job whose code and state run on the cluster's executors."""
    import uuid

    from orchestrator.service import Orchestrator

    from integration.stream_helpers import dead_letter_offsets, example, table
    from reference_streams import Log, read_records, user_profiles

    settings = replace(settings, spark_master=spark_master, spark_executor_memory="1g")
    cluster = Orchestrator(settings)
    topic = f"profiles_{uuid.uuid4().hex[:8]}"
    cluster.produce_sample(topic, 5_000, seed=42, kind="profiles")
    cluster.deploy(example(tmp_path, "user_profiles", {"profiles": topic}))
    try:
        cluster.wait("user_profiles", "v1", timeout_s=300)
        log = Log([], read_records(settings.kafka_bootstrap, topic))
        columns = ["plan", "country", "city", "tags", "updated_at"]
        assert table(settings, "user_profiles__v1", "user_id", columns) == user_profiles(log)
        assert dead_letter_offsets(settings, "user_profiles__v1__dead_letters", topic) == \
            log.invalid_profiles
    finally:
        cluster.stop("user_profiles", "v1")
