"""A replay on a real Spark standalone cluster (master and worker started here on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file
from integration.helpers import assert_batches_tile_the_log, dead_letters, output
from reference import compute

# One worker starts the module's master and worker, once (--dist loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.spark,
              pytest.mark.xdist_group("standalone_cluster")]


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from orchestrator.dev.spark_cluster import standalone_cluster

    # 2 cores and 1.5 GiB: one executor of 1 GiB per driver, beside the other services.
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=1, cores=2,
                            memory="1536m") as url:
        yield url


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


def test_a_master_port_taken_before_the_master_binds_it_is_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port chosen for the master can be taken by another process before the master binds
    it (CI saw it: the master moved to the next port, and its worker, sent to the chosen one,
    never registered). The cluster's URL is where the master bound, whatever was chosen."""
    import socket

    from orchestrator.dev import spark_cluster
    from orchestrator.dev.processes import free_port

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # a server that is not Spark's, as it was in CI
    chosen = taken.getsockname()[1]
    ports = iter([chosen])
    monkeypatch.setattr(spark_cluster, "free_port", lambda: next(ports, None) or free_port())
    try:
        with spark_cluster.standalone_cluster(tmp_path, workers=1, cores=1,
                                              memory="512m") as url:
            assert url.startswith("spark://127.0.0.1:") and not url.endswith(f":{chosen}")
            assert f"could not bind on port {chosen}" in (tmp_path / "master.log").read_text()
    finally:
        taken.close()
