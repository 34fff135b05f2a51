"""Starts and stops detached driver processes. No pyspark here: the driver imports it."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from orchestrator.logfile import open_private
from orchestrator.models import RunRecord
from orchestrator.process import spawn_detached
from orchestrator.settings import Settings
from orchestrator.spark.launch import cds, spares
from orchestrator.spark.launch.driver_process import is_alive, note_start, terminate

logger = logging.getLogger("kappa.launcher")
# What a task runner sets for its own process; a driver outlives the task, so neither its events
# nor its environment should carry the task's identity or its connections.
_TASK_ONLY_ENV = ("AIRFLOW_CTX_", "AIRFLOW_CONN_", "AIRFLOW_VAR_")


@dataclass(frozen=True)
class DriverProcess:
    pid: int
    started: float  # psutil create_time: tells our driver from a later process with its PID
    log_path: Path


def driver_environment(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_TASK_ONLY_ENV)}
    env.update(settings.driver_environment())
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def launch(settings: Settings, job: str, version: str, attempt: int) -> DriverProcess:
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{job}__{version}.log"
    env = driver_environment(settings)
    with open_private(log_path) as log:
        log.write(f"\n=== attempt {attempt} starting at {time.ctime()} ===\n".encode())
    try:
        adopted = spares.adopt(settings, env, job, version, attempt, log_path)
    except OSError as exc:  # a spare is a shortcut: never a reason for a deploy to fail
        logger.warning("no warm spare (%s); starting the driver cold", exc)
        adopted = None
    if adopted is not None:
        pid, started = adopted
        note_start("adopted")
        # The spare taken is replaced. Spares are kept for settings that someone keeps them for
        # (`kappa dev up`, `kappa agent`): a deploy of other settings starts none.
        try:
            spares.keep(settings, env, after_deploy=True)
        except OSError as exc:
            logger.warning("could not start a warm spare driver (%s)", exc)
    else:
        note_start("cold")
        pid = spawn_detached(
            [sys.executable, "-m", "orchestrator.spark.driver", "--job", job, "--version",
             version, "--attempt", str(attempt), "--log", str(log_path)], env, log_path)
        try:
            started = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            started = 0.0
    # Once per machine (JDK, Spark): the next drivers start on the class archive.
    cds.build_in_background()
    return DriverProcess(pid, started, log_path)


def keep_spare(settings: Settings) -> int | None:
    """Start a warm spare driver if this host keeps fewer than ``warm_spares`` fitting these
    settings (spark/launch/spares.py); its PID, or None."""
    return spares.keep(settings, driver_environment(settings))


def waiting_spares(settings: Settings) -> list[spares.Spare]:
    """The live spares in the spare directory, ready or warming (`kappa dev status`)."""
    return spares.live_spares(spares.spare_dir(settings))


def withdraw_spares(settings: Settings) -> int:
    """Stop the spares that a deployment with these settings' state directory started."""
    return spares.withdraw_all(settings, state_dir=settings.state_dir)


def this_host() -> str:
    return socket.gethostname()


def driver_alive(run: RunRecord) -> bool | None:
    """Whether the run's driver process exists; None when it runs on another host (a worker
    elsewhere, seen from a triggerer), where only its heartbeats tell."""
    if run.host and run.host != this_host():
        return None
    return is_alive(run.pid, run.pid_started)


def stop_driver(run: RunRecord) -> None:
    """Terminate the run's driver if it runs on this host. One on another host stops itself at
    its next heartbeat, which finds its run no longer active."""
    if run.host and run.host != this_host():
        return
    terminate(run.pid, run.pid_started)


def log_tail(path: str | Path | None, lines: int = 15) -> tuple[str, ...]:
    if not path:
        return ()
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ()
    return tuple(text.splitlines()[-lines:])
