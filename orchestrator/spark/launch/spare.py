"""A warm spare driver: ``python -m orchestrator.spark.launch.spare --dir <spare directory>``.

Started detached by :func:`orchestrator.spark.launch.spares.keep`. It starts the JVM and the Spark
session, warms them and the Python workers with a query shaped like a job's (see warmup.py),
then waits on ``<pid>.sock`` for a deploy. The deploy sends its version, attempt, log file,
working directory and environment; the spare takes them on (its log moves to the version's),
answers, and runs the version's driver in this process, as a cold driver would. Nobody
adopting it within ``spare_idle_s``, it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.logfile import RotatingLog
from orchestrator.settings import load_settings
from orchestrator.spark.launch.driver_process import note_start
from orchestrator.spark.launch.spares import forget

log = logging.getLogger("kappa.spare")
IDLE_WAIT_S = 120.0
_LOOK_AROUND_S = 5.0  # how often a waiting spare checks that it is still wanted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kappa-spare")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--after-deploy", action="store_true")
    args = parser.parse_args(argv)
    directory, pid = args.dir, os.getpid()
    settings = load_settings()
    pump = RotatingLog(directory / f"{pid}.log", settings.driver_log_max_bytes)
    pump.start()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.after_deploy:
            _wait_for_idle_cpu()
        began = time.monotonic()
        spark = _warm_session(settings)
        warm_s = time.monotonic() - began
        request, conn = _wait_for_deploy(directory, pid, settings.spare_idle_s,
                                         settings.state_dir)
    except BaseException:
        log.exception("the spare failed before a deploy adopted it")
        forget(directory, pid)
        pump.finish()
        return 1
    if request is None or conn is None:
        log.info("no deploy within %gs; exiting", settings.spare_idle_s)
        forget(directory, pid)
        pump.finish()
        return 0
    try:
        return _serve(request, conn, spark, pump, directory, pid, warm_s)
    finally:
        pump.finish()


def _wait_for_idle_cpu(most_s: float = IDLE_WAIT_S) -> None:
    """A spare is started when a deploy adopts another: it waits until that version's first
    batches have left the CPUs (half of them idle over a second), or ``most_s``, so that its
    warm-up never slows a replay."""
    import psutil

    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline and psutil.cpu_percent(interval=1.0) > 50.0:
        pass


def _warm_session(settings: Any) -> Any:
    from orchestrator.spark.launch.warmup import warm_up
    from orchestrator.spark.read.source import KafkaLogSource
    from orchestrator.spark.session import build_session

    note_start("spare")
    spark = build_session(settings, "kappa-spare")
    spark.dataSource.register(KafkaLogSource)
    warm_up(spark, parquet=_archive_decoded(settings))
    return spark


def _archive_decoded(settings: Any) -> bool:
    """Whether a deploy may read decoded segments with Spark's Parquet reader: only then is
    that reader worth warming (1.7 CPU-s a spare, a second off such a deploy's first batch)."""
    from orchestrator.catalog import decoded_manifest
    from orchestrator.catalog.db import connect

    if not (settings.decoded_segments and settings.pg_dsn):
        return False
    try:
        with connect(settings.pg_dsn, autocommit=True) as conn:
            return decoded_manifest.holds_any(conn, settings.catalog_schema)
    except Exception:  # a catalog that cannot be asked only costs the warm-up
        log.warning("could not ask the catalog for decoded segments", exc_info=True)
        return False


def _wait_for_deploy(directory: Path, pid: int, idle_s: float, state_dir: Path
                     ) -> tuple[dict[str, Any] | None, socket.socket | None]:
    """The deploy's request and its connection; (None, None) once idle for ``idle_s``, or once
    the socket or the state directory of the deployment that started it was removed."""
    warming, ready = directory / f"{pid}.warming", directory / f"{pid}.sock"
    with contextlib.suppress(FileNotFoundError):
        warming.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(warming))
    server.listen(4)
    os.rename(warming, ready)  # visible to launchers only once it listens
    log.info("warm; waiting for a deploy on %s", ready)
    deadline = time.monotonic() + idle_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            server.settimeout(min(left, _LOOK_AROUND_S))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                wanted = ready.exists() or (directory / f"{pid}.claimed").exists()
                if not (wanted and state_dir.exists()):
                    log.info("%s is gone; exiting", ready if state_dir.exists() else state_dir)
                    break
                continue
            conn.settimeout(10.0)
            try:
                line = conn.makefile("rb").readline()
                request = json.loads(line)
            except (OSError, ValueError):
                conn.close()
                continue
            if isinstance(request, dict) and {"job", "version", "attempt", "log", "env"} <= set(
                    request):
                return request, conn
            conn.close()
        return None, None
    finally:
        server.close()


def _serve(request: dict[str, Any], conn: socket.socket, spark: Any, pump: RotatingLog,
           directory: Path, pid: int, warm_s: float) -> int:
    from orchestrator.spark import driver

    env: dict[str, str] = request["env"]
    for name in [k for k in os.environ if k.startswith("KAPPA_") and k not in env]:
        del os.environ[name]
    os.environ.update(env)
    os.chdir(request["cwd"])
    pump.retarget(Path(request["log"]))
    forget(directory, pid)
    log.info("adopted by %s %s attempt %s (this spare warmed in %.1fs)", request["job"],
             request["version"], request["attempt"], warm_s)
    with contextlib.closing(conn):
        conn.sendall(json.dumps({"adopted": True, "pid": pid}).encode() + b"\n")
    args = argparse.Namespace(job=request["job"], version=request["version"],
                              attempt=int(request["attempt"]))
    return driver.run_driver(args, load_settings(), spark)


if __name__ == "__main__":
    sys.exit(main())
