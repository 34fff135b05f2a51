"""The driver's zygote runs the Python processes that a JVM starts: pyspark's daemon, started
as Spark starts it (``python -m pyspark.daemon``, the worker site on its path), is forked by the
zygote and speaks to its starter through the started process's streams; without a zygote it
starts as before."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from orchestrator.spark.launch.zygote_client import HASH_SEED_VARIABLE, SOCKET_VARIABLE
from orchestrator.spark.pyspark_path import WORKER_SITE

from conftest import wait_until
from integration.helpers import reap

pytestmark = [pytest.mark.integration]
ZYGOTE = "orchestrator.spark.launch.zygote"


@pytest.fixture
def socket_path() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="kappa-zt-")  # a socket's path stays under 108 bytes
    try:
        yield os.path.join(directory, "zygote.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _daemon(path: str, seed: str = "0", module: str = "pyspark.daemon"
            ) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon, started as the JVM starts it; killed and reaped on the way out if a check
    failed before :func:`_close`, rather than left running with its pipes open."""
    env = {**os.environ, SOCKET_VARIABLE: path, HASH_SEED_VARIABLE: "0", "PYTHONHASHSEED": seed,
           "PYTHONPATH": os.pathsep.join([WORKER_SITE, os.environ.get("PYTHONPATH", "")])}
    daemon = subprocess.Popen([sys.executable, "-m", module, "pyspark.worker"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        yield daemon
    finally:
        reap(daemon)


def _port(daemon: subprocess.Popen[bytes]) -> int:
    assert daemon.stdout is not None
    (port,) = struct.unpack("!i", daemon.stdout.read(4))
    return int(port)


def _close(daemon: subprocess.Popen[bytes]) -> int:
    """Close its stdin, as the JVM's end does: the daemon shuts down. Its exit status."""
    assert daemon.stdin is not None and daemon.stdout is not None
    daemon.stdin.close()
    status = daemon.wait(30)
    daemon.stdout.close()
    return status


# Spark's daemon (data source lookup, creation, planning) and the read tasks' (the workers of a
# batch), which holds their imports for them.
@pytest.mark.parametrize("module", ["pyspark.daemon", "orchestrator.spark.daemon"])
def test_a_daemon_the_jvm_starts_is_forked_by_the_zygote(socket_path: str, module: str) -> None:
    zygote = subprocess.Popen([sys.executable, "-m", ZYGOTE, socket_path],
                              stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"})
    try:
        wait_until(lambda: Path(socket_path).exists(), 60, "the zygote to listen", poll_s=0.1)
        with _daemon(socket_path, module=module) as daemon:
            port = _port(daemon)
            assert 0 < port < 65536  # written by the forked daemon into the starter's stdout
            (forked,) = psutil.Process(zygote.pid).children()
            assert "orchestrator.spark.launch.zygote" in " ".join(forked.cmdline())
            assert psutil.Process(daemon.pid).children() == []  # the starter only waits
            assert not _listens(daemon.pid, port)  # the forked child does
            assert _close(daemon) == 1  # its stdin closed: 1, as when started alone
        wait_until(lambda: not psutil.Process(zygote.pid).children(), 30, "the child to end")
    finally:
        zygote.terminate()
        zygote.wait(30)


def test_without_a_zygote_the_daemon_starts_as_before(socket_path: str) -> None:
    with _daemon(socket_path) as daemon:  # nothing listens there
        port = _port(daemon)
        assert 0 < port < 65536
        assert _listens(daemon.pid, port)  # the started process serves, as Spark's own would
        assert _close(daemon) == 1  # pyspark's daemon shuts down with 1 when its stdin closes


def test_the_starter_exits_with_the_status_of_the_process_run_for_it(socket_path: str) -> None:
    """The streaming source's runner, started with no JVM to answer it, fails (status 1): run
    by the zygote (its traceback comes from the zygote's child), its starter exits with that
    status, as the runner started alone does."""
    from orchestrator.spark.launch.zygote_client import RUNNER

    zygote = subprocess.Popen([sys.executable, "-m", ZYGOTE, socket_path],
                              stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"})
    try:
        wait_until(lambda: Path(socket_path).exists(), 60, "the zygote to listen", poll_s=0.1)
        ran = {}
        for path in (socket_path, socket_path + ".none"):
            env = {**os.environ, SOCKET_VARIABLE: path, HASH_SEED_VARIABLE: "0",
                   "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
                       [WORKER_SITE, os.environ.get("PYTHONPATH", "")])}
            done = subprocess.run([sys.executable, "-m", RUNNER, "pyspark.worker"], env=env,
                                  check=False, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=60)
            ran[path] = (done.returncode, "orchestrator/spark/launch/zygote.py" in done.stderr)
        assert ran == {socket_path: (1, True), socket_path + ".none": (1, False)}
    finally:
        zygote.terminate()
        zygote.wait(30)


def _listens(pid: int, port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
               for c in psutil.Process(pid).net_connections(kind="tcp"))


def test_a_process_asking_for_another_hash_seed_starts_on_its_own(socket_path: str) -> None:
    """A forked child keeps the zygote's hash seed: one that asks for another is not handed
    over, or its string hashes would differ from its peers'."""
    zygote = subprocess.Popen([sys.executable, "-m", ZYGOTE, socket_path],
                              stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"})
    try:
        wait_until(lambda: Path(socket_path).exists(), 60, "the zygote to listen", poll_s=0.1)
        with _daemon(socket_path, seed="7") as daemon:
            assert 0 < _port(daemon) < 65536
            assert psutil.Process(zygote.pid).children() == []
            _close(daemon)
    finally:
        zygote.terminate()
        zygote.wait(30)
