"""`kappa agent` / `kappa metrics serve`."""

from __future__ import annotations

import argparse
import time
from typing import Any

from orchestrator.lag import Thresholds
from orchestrator.metrics.exporter import Snapshot
from orchestrator.metrics.server import serve
from orchestrator.supervisor import Supervisor


def run_agent(service: Any, args: argparse.Namespace) -> int:
    limits = Thresholds(window_s=args.window)
    supervise = getattr(args, "restart", False)
    supervisor = Supervisor(service)

    def take() -> Snapshot:
        if supervise:
            supervisor.tick()
        lags = tuple(service.lag(limits=limits))
        return Snapshot(lags=lags, statuses=tuple(service.status(exact_rows=False)),
                        aliases=tuple(service.aliases()), taken_at=time.time())

    def ready(port: int) -> None:
        restarting = "; restarting this host's crashed drivers" if supervise else ""
        print(f"serving metrics on http://{args.host}:{port}/metrics "
              f"(sampling every {args.interval:g}s{restarting}); Ctrl-C stops", flush=True)

    serve(take, host=args.host, port=args.port, interval_s=args.interval, ready=ready)
    return 0
