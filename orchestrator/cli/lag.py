"""`kappa lag`: a table (or JSON) of every version's lag, once or redrawn with --watch."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from orchestrator.cli.output import console, table
from orchestrator.lag import Thresholds
from orchestrator.models import VersionLag


def _eta(value: float | None, lag: int) -> str:
    if value is None:
        return "not converging"
    return "-" if lag == 0 else f"{value:.0f}s"


def render(lags: list[VersionLag], partitions: bool) -> str:
    text = table(
        ["job", "version", "state", "lag records", "lag seconds", "processing/s", "produce/s",
         "eta", "progress"],
        [_row(lg) for lg in lags])
    if partitions:
        rows = [[lg.job, lg.version, p.topic, p.partition, p.log_start, p.log_end, p.processed,
                 p.lag_records, _seconds(p.lag_seconds)] for lg in lags for p in lg.partitions]
        text += "\n\n" + table(["job", "version", "topic", "partition", "log start", "log end",
                                "processed", "lag records", "lag seconds"], rows)
    return text


def _row(lg: VersionLag) -> list[object]:
    if lg.lag_records is None:
        # The log it read is gone: no figure against the log there now would mean anything.
        return [lg.job, lg.version, lg.state, "-", "-", "-", "-", "-",
                "log gone (`kappa status`)"]
    return [lg.job, lg.version, lg.state, f"{lg.lag_records:,}", _seconds(lg.lag_seconds),
            f"{lg.processing_rate:,.0f}", f"{lg.produce_rate:,.0f}",
            _eta(lg.eta_seconds, lg.lag_records), _bar(lg)]


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f}"


def _bar(lg: VersionLag, width: int = 20) -> str:
    total = sum(p.log_end - p.log_start for p in lg.partitions)
    done = sum(p.processed - p.log_start for p in lg.partitions)
    fraction = done / total if total else 1.0
    filled = int(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction:5.1%}"


def run_lag(service: Any, args: argparse.Namespace) -> int:
    limits = Thresholds(window_s=args.window)

    def shown() -> str:
        lags = service.lag(args.job, args.version, limits)
        if args.json:
            return json.dumps([lg.to_json() for lg in lags], indent=2, default=str)
        return render(lags, args.partitions) if lags else "no job versions deployed yet"

    if args.watch and not args.json and sys.stdout.isatty():
        from rich.live import Live
        from rich.text import Text

        # One table redrawn in place; Ctrl-C ends it.
        with Live(Text.from_ansi(shown()), console=console(), auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(Text.from_ansi(shown()), refresh=True)
    while True:
        print(shown())
        if not args.watch:
            return 0
        sys.stdout.flush()
        time.sleep(args.interval)
