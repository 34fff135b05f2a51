"""`kappa queue`: the replay budget at a glance."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.output import print_json, table


def run_queue(service: Any, args: argparse.Namespace) -> int:
    entries, hold = service.replays.queue(), service.replays.hold()
    held = None if hold is None else {"reason": hold.reason, "since": hold.since.isoformat()}
    if args.json:
        print_json({"replay_slots": service.settings.replay_budget, "hold": held,
                    "versions": entries})
        return 0
    budget = service.settings.replay_budget
    print(f"replay slots: {len(entries) - sum(e['place'] is not None for e in entries)} of "
          f"{'no budget' if budget is None else budget} taken")
    if held is not None:
        print(f"held by live first since {held['since']}: {held['reason']}; no catch-up starts")
    if entries:
        print(table(["job", "version", "state", "place", "priority", "lag", "wait", "eta"],
                    [[e["job"], e["version"], e["state"], e["place"], e["priority"],
                      e["lag_records"], _seconds(e["wait_s"]), _seconds(e["eta_s"])]
                     for e in entries]))
    return 0


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:,.0f}s"
