"""Serves the exporter over HTTP until interrupted (`kappa agent`, `kappa metrics serve`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from orchestrator.metrics.exporter import JOB_LABEL, KappaCollector, Sampler, Snapshot


def serve(take: Callable[[], Snapshot], *, host: str, port: int, interval_s: float,
          ready: Callable[[int], None] | None = None, job_label: str = JOB_LABEL) -> None:
    registry = CollectorRegistry()
    sampler = Sampler(take=take, interval_s=interval_s)
    registry.register(KappaCollector(sampler, job_label))
    server, thread = start_http_server(port, addr=host, registry=registry)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sampler.start()
    if ready:
        ready(server.server_port)
    try:
        stopping.wait()
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        server.shutdown()
        thread.join(5)
