"""`kappa agent` / `kappa metrics serve`."""

from __future__ import annotations

import argparse
import time
from typing import Any

from orchestrator.lag import Thresholds
from orchestrator.metrics.exporter import Snapshot
from orchestrator.metrics.server import serve


def run_agent(service: Any, args: argparse.Namespace) -> int:
    limits = Thresholds(window_s=args.window)

    def take() -> Snapshot:
        lags = tuple(service.lag(limits=limits))
        return Snapshot(lags=lags, statuses=tuple(service.status()),
                        aliases=tuple(service.aliases()), taken_at=time.time())

    def ready(port: int) -> None:
        print(f"serving metrics on http://{args.host}:{port}/metrics "
              f"(sampling every {args.interval:g}s); Ctrl-C stops", flush=True)

    serve(take, host=args.host, port=args.port, interval_s=args.interval, ready=ready)
    return 0
