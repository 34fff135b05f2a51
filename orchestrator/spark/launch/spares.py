"""Warm spare drivers, seen from the launcher: start them, adopt one for a deploy, withdraw the
ones that do not fit. No pyspark here: the spare (orchestrator.spark.launch.spare) imports it.

A spare is a driver process that has started its JVM, its Spark session and its Python workers
and waits, on a Unix socket in the spare directory, for a deploy to name its version. Adopted,
it serves that version alone, as a cold driver would, and exits with it.

Files in the spare directory (mode 0700, this user's), per spare PID:
- ``<pid>.json``: written by whoever started it: its fingerprint and create time;
- ``<pid>.sock``: appears once the spare is warm (bound under another name, then renamed);
- ``<pid>.claimed``: a launcher renamed the socket to claim it; renaming is atomic, so two
  launchers never adopt one spare.

A spare is adopted only when its fingerprint (the Spark conf, the secrets its executors get, the
interpreter and its environment, the orchestrator's code) equals the deploy's: what a session
fixed at start must be what the deploy would have started. One that differs is withdrawn.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from orchestrator.failpoints import ENV as FAIL_POINTS_ENV
from orchestrator.process import spawn_detached
from orchestrator.settings import Settings
from orchestrator.spark.launch.cds import DRIVER_JAVA_OPTS
from orchestrator.spark.session import spark_conf

log = logging.getLogger("kappa.spares")
FINGERPRINT_VARIABLE = "KAPPA_SPARE_FINGERPRINT"
ADOPT_TIMEOUT_S = 15.0
HOST_CAP = 3  # spares waiting on a host, of any settings, per warm_spares
# Besides its heap (spark_driver_memory), what a spare holds: the JVM's other memory, the
# Python driver and its idle workers (measured in bench/replay.py; README).
OVERHEAD_BYTES = 640 * 2**20
# Variables that differ between two identical deploys (a shell's, pytest's, a task's): not part
# of what a spare fixed at start.
_VOLATILE = ("PWD", "OLDPWD", "_", "SHLVL", "TERM", "COLUMNS", "LINES", "DISPLAY", "MAIL",
             "LS_COLORS", "PS1", "HISTFILE", "WINDOWID", "STY", FINGERPRINT_VARIABLE)
# Airflow's configuration reaches a task's deploy, and neither Spark nor a driver reads it.
_VOLATILE_PREFIXES = ("PYTEST_", "SSH_", "TMUX", "XDG_SESSION_", "TERM_", "AIRFLOW_")


@dataclass(frozen=True)
class Spare:
    pid: int
    started: float
    fingerprint: str
    ready: bool


def spare_dir(settings: Settings) -> Path:
    directory = settings.spare_dir or Path(tempfile.gettempdir()) / f"kappa-spares-{os.getuid()}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user: set spare_dir")
    os.chmod(directory, 0o700)
    return directory


def usable(settings: Settings, env: dict[str, str]) -> bool:
    """Spares serve local masters only (on a cluster a waiting spare would hold executors), and
    never a deploy with fail points: a read task's point is fixed when its worker starts."""
    return (settings.warm_spares > 0 and settings.spark_master.strip().startswith("local")
            and not env.get(FAIL_POINTS_ENV))


def fingerprint(settings: Settings, env: dict[str, str]) -> str:
    conf = spark_conf(settings, "kappa", settings.pg_dsn)
    conf.pop("spark.app.name")
    # The class archive only speeds a JVM's start, which a spare has paid: one started before
    # the archive was built (a fresh machine) still serves a deploy started after it.
    conf["spark.driver.extraJavaOptions"] = DRIVER_JAVA_OPTS
    outside = {k: v for k, v in env.items() if not k.startswith(("KAPPA_", *_VOLATILE_PREFIXES))
               and k not in _VOLATILE}
    digest = hashlib.sha256()
    for part in (sorted(conf.items()), sorted(outside.items()), sys.executable, _code_version(),
                 settings.spare_idle_s, settings.python_fork_server):
        digest.update(json.dumps(part, default=str).encode())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.cache
def _code_version() -> str:
    """The orchestrator's files as loaded by a new process: an upgrade withdraws old spares."""
    root = Path(__file__).resolve().parents[2]
    entries = sorted((str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size)
                     for p in root.rglob("*.py"))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def spares(directory: Path) -> list[Spare]:
    found = []
    for meta in directory.glob("*.json"):
        try:
            record = json.loads(meta.read_text())
            pid = int(record["pid"])
            found.append(Spare(pid, float(record["started"]), str(record["fingerprint"]),
                               (directory / f"{pid}.sock").exists()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def live_spares(directory: Path) -> list[Spare]:
    """The spares alive in ``directory``, ready, warming or adopted. On the way, the files of
    dead ones are removed and those whose deployment is gone are withdrawn."""
    live = []
    for spare in spares(directory):
        if not _alive(spare):
            forget(directory, spare.pid)
        elif _orphaned(directory, spare):
            withdraw(directory, spare, "the deployment that started it is gone")
        else:
            live.append(spare)
    return live


def adopt(settings: Settings, env: dict[str, str], job: str, version: str, attempt: int,
          log_path: Path) -> tuple[int, float] | None:
    """Hand the version to a warm spare whose fingerprint matches; (pid, create time), or None
    when there is none (the caller starts a driver cold). This deployment's spares that no
    longer match are withdrawn."""
    if not usable(settings, env):
        return None
    directory = spare_dir(settings)
    wanted = fingerprint(settings, env)
    for spare in live_spares(directory):
        if spare.fingerprint != wanted:
            # This deployment's settings changed since it started the spare; another
            # deployment's spares are its own to withdraw.
            if started_by(directory, spare.pid) == str(settings.state_dir):
                withdraw(directory, spare, "its settings differ from this deploy's")
        elif spare.ready:
            claim = directory / f"{spare.pid}.claimed"
            try:
                os.rename(directory / f"{spare.pid}.sock", claim)
            except FileNotFoundError:
                continue  # another launcher took it
            if _hand_over(claim, spare, env, job, version, attempt, log_path):
                return spare.pid, spare.started
            withdraw(directory, spare, "it did not take the deploy")
    return None


def _hand_over(claim: Path, spare: Spare, env: dict[str, str], job: str, version: str,
               attempt: int, log_path: Path) -> bool:
    request = {"job": job, "version": version, "attempt": attempt, "log": str(log_path),
               "cwd": os.getcwd(), "env": env}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(ADOPT_TIMEOUT_S)
            conn.connect(str(claim))
            conn.sendall(json.dumps(request).encode() + b"\n")
            reply = conn.makefile("rb").readline()
        return bool(json.loads(reply or b"{}").get("adopted"))
    except (OSError, ValueError) as exc:
        log.warning("spare %d did not take %s %s (%s)", spare.pid, job, version, exc)
        return False


def keep(settings: Settings, env: dict[str, str], *, after_deploy: bool = False
         ) -> int | None:
    """Start a spare for these settings when fewer than ``warm_spares`` fit them and memory
    allows one more; return its PID, or None. One started ``after_deploy`` warms up only once
    the CPUs are half idle (or after a while): the deploy's first batches go first."""
    if not usable(settings, env):
        return None
    directory = spare_dir(settings)
    wanted = fingerprint(settings, env)
    waiting = [s for s in live_spares(directory)
               if not (directory / f"{s.pid}.claimed").exists()]
    fitting = sum(s.fingerprint == wanted for s in waiting)
    # Deployments with other settings keep their own; the host holds a few at most.
    if fitting >= settings.warm_spares or len(waiting) >= HOST_CAP * settings.warm_spares \
            or not memory_allows(settings):
        return None
    settings.state_dir.mkdir(parents=True, exist_ok=True)  # the spare lives while it does
    spawn_env = {**env, FINGERPRINT_VARIABLE: wanted}
    pid = spawn_detached([sys.executable, "-m", "orchestrator.spark.launch.spare", "--dir",
                          str(directory), *(["--after-deploy"] if after_deploy else [])],
                         spawn_env, directory / "spares.log")
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    meta = directory / f"{pid}.json"
    meta.with_suffix(".tmp").write_text(json.dumps(
        {"pid": pid, "started": started, "fingerprint": wanted,
         "state_dir": str(settings.state_dir)}))
    os.replace(meta.with_suffix(".tmp"), meta)
    return pid


def cost_bytes(settings: Settings) -> int:
    return _bytes(settings.spark_driver_memory) + OVERHEAD_BYTES


def memory_allows(settings: Settings) -> bool:
    """A spare is started only while twice its cost is available: it must never be what pushes
    a running version out of memory."""
    return bool(psutil.virtual_memory().available >= 2 * cost_bytes(settings))


def _bytes(size: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    text = size.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def withdraw(directory: Path, spare: Spare, why: str) -> None:
    from orchestrator.spark.launch.driver_process import terminate

    with contextlib.suppress(FileNotFoundError):
        os.rename(directory / f"{spare.pid}.sock", directory / f"{spare.pid}.claimed")
    log.info("withdrawing spare %d: %s", spare.pid, why)
    terminate(spare.pid, spare.started, grace_s=5.0)
    forget(directory, spare.pid)


def withdraw_all(settings: Settings, state_dir: Path | None = None) -> int:
    """Stop every spare waiting (or warming) in the spare directory, or only those that a
    deployment with ``state_dir`` started; return how many."""
    directory = spare_dir(settings)
    stopped = 0
    for spare in spares(directory):
        if state_dir is not None and started_by(directory, spare.pid) != str(state_dir):
            continue
        if (directory / f"{spare.pid}.claimed").exists() and _alive(spare):
            continue  # adopted: a version's driver now, stopped with its version
        withdraw(directory, spare, "withdrawn")
        stopped += 1
    return stopped


def wait_ready(settings: Settings, env: dict[str, str], timeout_s: float) -> bool:
    """Whether a spare fitting these settings is warm within ``timeout_s`` (benchmarks, tests)."""
    directory = spare_dir(settings)
    wanted = fingerprint(settings, env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(s.ready and s.fingerprint == wanted and _alive(s) for s in spares(directory)):
            return True
        time.sleep(0.1)
    return False


def started_by(directory: Path, pid: int) -> str | None:
    """The state directory of the deployment that started spare ``pid``."""
    try:
        return str(json.loads((directory / f"{pid}.json").read_text()).get("state_dir"))
    except (OSError, ValueError):
        return None


def _orphaned(directory: Path, spare: Spare) -> bool:
    """Whether the state directory of the deployment that started it was removed: its
    services went with it (a test's stack, a `kappa dev reset`)."""
    state_dir = started_by(directory, spare.pid)
    return bool(state_dir) and not Path(str(state_dir)).exists()


def _alive(spare: Spare) -> bool:
    from orchestrator.spark.launch.driver_process import is_alive

    return is_alive(spare.pid, spare.started)


def forget(directory: Path, pid: int) -> None:
    """Remove a spare's files (it was adopted, withdrawn or found dead)."""
    for suffix in (".json", ".sock", ".claimed", ".warming", ".log"):
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{pid}{suffix}").unlink()
