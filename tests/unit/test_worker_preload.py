"""The reads' daemon (orchestrator.spark.daemon) imports what its workers import in their first
task before it forks any, so that each forked worker starts with it (kappa's workers imported
pyarrow, pandas and the log source in each, 0.5 CPU-s apiece); KAPPA_WORKER_PRELOAD=off turns
that off."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

from orchestrator.spark.daemon import PRELOAD_VARIABLE

# Shared objects that only an import of pandas, of pyarrow and of the log source maps.
LIBRARIES = {"pandas": "pandas/_libs/lib.", "pyarrow": "libarrow.so",
             "confluent_kafka": "confluent_kafka/cimpl."}


def _mapped_by_a_started_daemon(preload: str) -> set[str]:
    env = {**os.environ, PRELOAD_VARIABLE: preload}
    daemon = subprocess.Popen([sys.executable, "-m", "orchestrator.spark.daemon", "pyspark.worker"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert daemon.stdin is not None and daemon.stdout is not None
    try:
        # It writes its port once it listens, after the preload: ready to fork workers.
        (port,) = struct.unpack("!i", daemon.stdout.read(4))
        assert 0 < port < 65536
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
        return {name for name, library in LIBRARIES.items() if library in maps}
    finally:
        daemon.stdin.close()  # as the JVM's end does: the daemon shuts down
        daemon.wait(30)
        daemon.stdout.close()


def test_the_daemon_holds_what_its_workers_need_before_it_forks_them() -> None:
    assert _mapped_by_a_started_daemon("on") == set(LIBRARIES)


def test_the_preload_can_be_turned_off() -> None:
    assert _mapped_by_a_started_daemon("off") == set()
