"""`kappa agent` / `kappa metrics serve`."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from orchestrator.lag import Thresholds
from orchestrator.metrics.exporter import Snapshot
from orchestrator.metrics.server import serve
from orchestrator.observe.supervisor import Supervisor


def run_agent(service: Any, args: argparse.Namespace) -> int:
    if getattr(args, "archive", False):
        threading.Thread(target=_archive_for_ever, args=(service,), name="kappa-archive",
                         daemon=True).start()
    limits = Thresholds(window_s=args.window)
    supervise = getattr(args, "restart", False)
    supervisor = Supervisor(service)

    keeper = (service.replays.keeper_name("kappa agent"), args.interval)

    def take() -> Snapshot:
        if args.command == "agent":
            service.replays.schedule(keeper)  # the replay slots that freed go to the queue
        if supervise:
            supervisor.tick()
            service.keep_spares()  # this host's warm spare drivers, replaced once adopted
        lags = tuple(service.lag(limits=limits))
        held = None  # `kappa metrics serve` does not look
        if args.command == "agent":  # live first: measured lags hold the queue, or pause
            held = service.replays.protect_live(lags, args.interval)
        archive = tuple(service.archive_status()) if getattr(args, "archive", False) else ()
        return Snapshot(lags=lags, statuses=tuple(service.status(exact_rows=False)),
                        aliases=tuple(service.aliases()), archive=archive,
                        experiments=tuple(service.outcomes.running()),
                        replays=service.replays.counts(), replay_hold=held,
                        taken_at=time.time())

    def ready(port: int) -> None:
        restarting = "; restarting this host's crashed drivers" if supervise else ""
        print(f"serving metrics on http://{args.host}:{port}/metrics "
              f"(sampling every {args.interval:g}s{restarting}); Ctrl-C stops", flush=True)

    serve(take, host=args.host, port=args.port, interval_s=args.interval, ready=ready,
          job_label=service.settings.metrics_job_label)
    return 0


_ARCHIVE_RETRY_S = 60.0


def _archive_for_ever(service: Any) -> None:
    """The archiver beside the exporter: outages are waited out inside it; anything else (an
    archive_root that cannot be written, a damaged segment) stops it for a minute, said in one
    line, while metrics go on."""
    from orchestrator.errors import KappaError

    while True:
        try:
            service.archive()
        except KappaError as exc:
            print(f"archive stopped: {exc} (trying again in {_ARCHIVE_RETRY_S:g}s)",
                  file=sys.stderr, flush=True)
        except Exception as exc:  # a thread's death would go unseen: say it, try again
            print(f"archive stopped: {type(exc).__name__}: {exc} (trying again in "
                  f"{_ARCHIVE_RETRY_S:g}s)", file=sys.stderr, flush=True)
        time.sleep(_ARCHIVE_RETRY_S)
