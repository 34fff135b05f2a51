"""`kappa queue`: the replay budget at a glance, and who hands the slots out; `kappa queue
keep`: hand them out."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence
from typing import Any

from orchestrator.cli.output import print_json, table
from orchestrator.errors import ConfigError
from orchestrator.models import QueueKeeper


def run_queue(service: Any, args: argparse.Namespace) -> int:
    if args.action == "keep":
        return _keep(service, args.interval)
    entries, hold = service.replays.queue(), service.replays.hold()
    keepers: list[QueueKeeper] = service.replays.keepers()
    held = None if hold is None else {"reason": hold.reason, "since": hold.since.isoformat()}
    if args.json:
        print_json({"replay_slots": service.settings.replay_budget, "hold": held,
                    "kept": any(k.keeping for k in keepers),
                    "keepers": [{"keeper": k.keeper, "every_s": k.every_s,
                                 "looked_s_ago": round(k.looked_s_ago, 1),
                                 "keeping": k.keeping} for k in keepers],
                    "versions": entries})
        return 0
    budget = service.settings.replay_budget
    print(f"replay slots: {len(entries) - sum(e['place'] is not None for e in entries)} of "
          f"{'no budget' if budget is None else budget} taken")
    print(unkept_warning(keepers) or _kept_by(keepers))
    if held is not None:
        print(f"held by live first since {held['since']}: {held['reason']}; no catch-up starts")
    if entries:
        print(table(["job", "version", "state", "place", "priority", "lag", "wait", "eta"],
                    [[e["job"], e["version"], e["state"], e["place"], e["priority"],
                      e["lag_records"], _seconds(e["wait_s"]), _seconds(e["eta_s"])]
                     for e in entries]))
    return 0


def unkept_warning(keepers: Sequence[QueueKeeper]) -> str | None:
    """What to say when no process hands out the slots at a steady interval; None if one does."""
    if any(k.keeping for k in keepers):
        return None
    last = (f"the last look was by {keepers[0].keeper}, {keepers[0].looked_s_ago:,.0f}s ago"
            if keepers else "none has looked at this catalog's queue")
    return (f"nobody hands out replay slots ({last}): a queued version starts only while "
            "`kappa agent` or `kappa queue keep` runs (`kappa dev up` runs a keeper on the "
            "embedded stack), or while `kappa wait` waits for it")


def _kept_by(keepers: Sequence[QueueKeeper]) -> str:
    return "slots handed out by " + "; ".join(
        f"{k.keeper} (every {k.every_s:g}s, last look {k.looked_s_ago:.1f}s ago)"
        for k in keepers if k.keeping)


def _keep(service: Any, every_s: float) -> int:
    if not every_s > 0:
        raise ConfigError(f"--interval {every_s:g} is not a positive number of seconds: give "
                          "one such as 2")
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    s = service.settings
    print(f"keeping the replay queue of catalog {s.catalog_schema} (replay_slots="
          f"{'none' if s.replay_budget is None else s.replay_budget}): a look every "
          f"{every_s:g}s; Ctrl-C stops", flush=True)
    service.replays.keep(every_s, lambda: stopping, lambda line: print(line, flush=True))
    return 0


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:,.0f}s"
