"""A Spark standalone cluster on loopback: one master and N workers, for tests and benchmarks
that must run on a real cluster rather than in local mode. Spark's own launch scripts come from
the installed pyspark, located without importing it (the orchestrator never imports pyspark)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.dev.processes import free_port
from orchestrator.errors import KappaError
from orchestrator.process import stop_process
from orchestrator.spark.pyspark_path import pyspark_home

START_TIMEOUT_S = 90.0


def spark_home() -> Path:
    home = pyspark_home()
    if home is None:
        raise KappaError("pyspark is not installed: run 'bash scripts/setup.sh'")
    return Path(home)


def _spark_class(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    home = spark_home()
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1")
    with open(log, "wb") as out:
        return subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _await_log(log: Path, needles: tuple[str, ...], proc: subprocess.Popen[bytes],
               what: str) -> str:
    """The log's text once it holds every needle."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        if all(n in text for n in needles):
            return text
        if proc.poll() is not None:
            raise KappaError(f"{what} exited with {proc.returncode}: see {log}")
        if time.monotonic() > deadline:
            raise KappaError(f"{what} did not start within {START_TIMEOUT_S:.0f} s: see {log}")
        time.sleep(0.2)


@contextmanager
def standalone_cluster(directory: Path, workers: int = 1, cores: int = 2,
                       memory: str = "1536m") -> Iterator[str]:
    """Starts a master and ``workers`` workers of ``cores`` cores and ``memory`` each, waits
    until every worker has registered, and yields the master's spark:// URL; stops them all
    on exit. Logs are in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    try:
        master_log = directory / "master.log"
        started.append(_spark_class(["org.apache.spark.deploy.master.Master", "--host",
                                     "127.0.0.1", "--port", str(free_port()),
                                     "--webui-port", str(free_port())], master_log))
        text = _await_log(master_log, ("I have been elected leader",), started[0],
                          "the Spark master")
        # The port chosen may have been taken before the master bound it: the master then
        # binds the next one, and says so.
        url = re.findall(r"Starting Spark master at (spark://\S+)", text)[-1]
        for n in range(workers):
            log = directory / f"worker-{n}.log"
            started.append(_spark_class(
                ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", str(cores), "--memory", memory,
                 "--webui-port", str(free_port()), "--work-dir", str(directory / f"work-{n}")],
                log))
            _await_log(log, ("Successfully registered with master",), started[-1],
                       f"Spark worker {n}")
        yield url
    finally:
        for proc in reversed(started):
            stop_process(proc)
