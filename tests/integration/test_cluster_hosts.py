"""A replay from the archive on a Spark cluster whose executor runs on another host: a network
namespace of its own, with addresses the test assigns, reaching this host only over a veth pair.

The archive lives in an S3 store (s3rver) on this host's side of the pair; the executor reads
its segments through pyarrow's S3 filesystem, never through a local path. PostgreSQL is reached
over the pair too (a relay in front of the test stack's loopback port). The same cluster, with
a plain local archive_root, is refused at deploy."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import debian_tool, job_file, kappa_cli, missing_tool, wait_until
from integration.helpers import assert_batches_tile_the_log, dead_letters, output, query
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
BUCKET = "kappa-archive"
# s3rver's documented key pair: it guards nothing but a port of this test.
S3_KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}


@dataclass(frozen=True)
class SecondHost:
    namespace: str
    here: str  # this host's address on the pair
    there: str  # the namespace's address


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@contextmanager
def second_host() -> Iterator[SecondHost]:
    """A network namespace joined to this host by a veth pair of a /30 of its own."""
    debian_tool("ip", "iproute2")
    if os.geteuid() != 0:
        missing_tool("root: the second host is a network namespace, and only root may create "
                     "one: run the suite as root, as CI does")
    n = uuid.uuid4().int % 16_000
    name, outer, inner = f"kappa-h{n}", f"kh{n}", f"kn{n}"
    net = f"10.{200 + n // 4000}.{n % 4000 // 16}.{(n % 16) * 16}"
    prefix = net.rsplit(".", 1)[0]
    last = int(net.rsplit(".", 1)[1])
    host = SecondHost(name, f"{prefix}.{last + 1}", f"{prefix}.{last + 2}")
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", name)
        _run("ip", "addr", "add", f"{host.here}/30", "dev", outer)
        _run("ip", "link", "set", outer, "up")
        _run("ip", "netns", "exec", name, "ip", "addr", "add", f"{host.there}/30", "dev", inner)
        _run("ip", "netns", "exec", name, "ip", "link", "set", inner, "up")
        _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield host
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", outer], capture_output=True, check=False)


def _started(argv: list[str], log: Path, env: dict[str, str] | None = None
             ) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


@contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    from orchestrator.process import stop_process

    try:
        yield proc
    finally:
        stop_process(proc)


def _listening(address: str, port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address, port)) == 0


def _await_log(log: Path, needle: str, what: str) -> None:
    wait_until(lambda: log.exists() and needle in log.read_text(errors="replace"), 90, what,
               poll_s=0.2)


def _pg_address(dsn: str) -> str:
    """Where socat reaches the test stack's PostgreSQL: its Unix socket, or its TCP port."""
    info = conninfo_to_dict(dsn)
    where = info.get("host") or "/tmp"
    if where.startswith("/"):
        (socket,) = Path(where).glob(".s.PGSQL.*[0-9]")
        return f"UNIX-CONNECT:{socket}"
    return f"TCP:{where}:{info.get('port') or 5432}"


@pytest.fixture
def cluster(settings: Any, tmp_path: Path) -> Iterator[tuple[Any, SecondHost]]:
    """Settings for a version whose only executor runs on the second host, with the archive
    in S3 on this host's side of the pair."""
    from orchestrator.dev.log_store import s3rver_path
    from orchestrator.dev.processes import free_port
    from orchestrator.dev.spark_cluster import spark_home

    debian_tool("socat", "socat")
    with ExitStack() as stack:
        host = stack.enter_context(second_host())
        store_port, pg_port, master_port = free_port(), free_port(), free_port()
        (tmp_path / "s3").mkdir()
        stack.enter_context(running(_started(
            [str(s3rver_path()), "--directory", str(tmp_path / "s3"), "--port", str(store_port),
             "--address", host.here, "--silent", "--configure-bucket", BUCKET],
            tmp_path / "s3.log")))
        wait_until(lambda: _listening(host.here, store_port), 30, "s3rver to listen")
        # PostgreSQL listens on this host only: a relay on this host's side of the pair.
        stack.enter_context(running(_started(
            ["socat", f"TCP-LISTEN:{pg_port},bind={host.here},fork,reuseaddr",
             _pg_address(settings.pg_dsn)], tmp_path / "relay.log")))
        wait_until(lambda: _listening(host.here, pg_port), 30, "the PostgreSQL relay")
        spark_class = str(spark_home() / "bin" / "spark-class")
        spark_env = {"SPARK_HOME": str(spark_home()), "SPARK_NO_DAEMONIZE": "1"}
        master_log = tmp_path / "master.log"
        stack.enter_context(running(_started(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", host.here,
             "--port", str(master_port), "--webui-port", str(free_port())], master_log,
            {**spark_env, "SPARK_LOCAL_IP": host.here})))
        _await_log(master_log, "I have been elected leader", "the Spark master")
        url = f"spark://{host.here}:{master_port}"
        worker_log = tmp_path / "worker.log"
        stack.enter_context(running(_started(
            ["ip", "netns", "exec", host.namespace, spark_class,
             "org.apache.spark.deploy.worker.Worker", url, "--host", host.there, "--cores", "2",
             "--memory", "1536m", "--webui-port", str(free_port()), "--work-dir",
             str(tmp_path / "work")], worker_log,
            {**spark_env, **S3_KEYS, "SPARK_LOCAL_IP": host.there})))
        _await_log(worker_log, "Successfully registered with master", "the Spark worker")
        yield replace(
            settings, pg_dsn=make_conninfo(settings.pg_dsn, host=host.here, port=pg_port),
            spark_master=url, spark_driver_host=host.here,
            spark_driver_bind_address=host.here, spark_executor_memory="1g",
            archive_root=f"s3://{BUCKET}/archive?endpoint_override={host.here}:{store_port}"
                         "&scheme=http&region=us-east-1"), host


def test_a_replay_on_another_host_reads_the_archive_from_s3_exactly(
        cluster: tuple[Any, SecondHost], topic: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.service import Orchestrator

    settings, host = cluster
    for key, value in S3_KEYS.items():
        monkeypatch.setenv(key, value)
    service = Orchestrator(settings)
    service.produce_sample(topic, 20_000, seed=241)
    archived = kappa_cli(settings, "archive", "run", "--once", topic)
    assert archived.returncode == 0, archived.stderr
    assert (tmp_path / "s3" / BUCKET).exists()  # the segments went to the store, not a path

    # A plain local archive_root cannot be read on the second host: refused in one line.
    # (Its own catalog: the manifest above names the segments in S3.)
    local = replace(settings, archive_root=str(tmp_path / "archive"),
                    catalog_schema=f"{settings.catalog_schema}_local")
    kappa_cli(local, "archive", "run", "--once", topic, check=True)
    refused = kappa_cli(local, "deploy", str(job_file(tmp_path, "v1", topic)))
    assert refused.returncode != 0 and "\n" not in refused.stderr.strip(), refused.stderr
    assert "archive_root" in refused.stderr and settings.spark_master in refused.stderr

    try:
        service.deploy(job_file(tmp_path, "v1", topic))
        st = service.wait(JOB, "v1", timeout_s=600)
        assert st.app_id and st.app_id.startswith("app-"), st
        reference = compute(settings.kafka_bootstrap, topic)
        assert output(settings, f"{JOB}__v1") == reference.v1
        assert dead_letters(settings, f"{JOB}__v1__dead_letters") == reference.invalid_offsets
        assert_batches_tile_the_log(settings, JOB, "v1", topic, reference.log_end)
        (from_archive,) = query(
            settings, f"SELECT sum(b.archived_offsets) FROM {settings.catalog_schema}.batches "
            f"b JOIN {settings.catalog_schema}.job_versions v ON v.id = b.version_id WHERE "
            "v.job = %s AND v.version = %s", JOB, "v1")[0]
        assert from_archive == reference.records
        # The read tasks ran in the executor on the second host.
        executor_logs = list((tmp_path / "work").glob("app-*/*/stderr"))
        assert executor_logs, "no executor ran on the second host"
        assert any(host.there in log.read_text(errors="replace") for log in executor_logs)
    finally:
        service.stop_all()
