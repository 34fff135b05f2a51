"""`kappa dev up | down | status | env | reset`."""

from __future__ import annotations

import sys
from typing import Any

from orchestrator.cli.output import print_json, table
from orchestrator.errors import ConfigError
from orchestrator.settings import Settings


def run_dev(settings: Settings, action: str, as_json: bool, *, memory: bool = False,
            yes: bool = False) -> int:
    from orchestrator.dev import stack

    if memory and action != "up":
        raise ConfigError("--memory goes with `kappa dev up`: the storage is chosen at start")
    if action == "env":
        for line in stack.env_lines(settings.state_dir):
            print(line)
        return 0
    if action == "reset":
        return _reset(settings, as_json, yes)
    if action == "down":
        _stop_drivers(settings)
    if action == "up":
        status = stack.up(settings.state_dir, memory=True if memory else None)
    else:
        status = {"down": stack.down, "status": stack.status}[action](settings.state_dir)
    if as_json:
        print_json(_as_json(status))
        return 0
    print(table(["service", "running", "pid", "address"],
                [[s.name, "yes" if s.running else "no", s.pid, s.address]
                 for s in status.services]))
    if action == "down" and status.storage == stack.MEMORY:
        print("\nlog: it was in the broker's memory, and is gone; the versions that read it "
              "will show failed")
    else:
        print(f"\nlog: {status.storage_text}")
    if action == "up":
        print(f"state in {status.state_dir}; `kappa dev env` prints the settings as export "
              "lines")
    return 0


def _as_json(status: Any) -> dict[str, Any]:
    return {
        "state_dir": str(status.state_dir), "running": status.running,
        "kafka_bootstrap": status.kafka_bootstrap, "storage": status.storage,
        "cluster_id": status.cluster_id,
        "services": [{"name": s.name, "pid": s.pid, "running": s.running,
                      "address": s.address} for s in status.services],
    }


def _stop_drivers(settings: Settings) -> None:
    from orchestrator.dev import stack

    # Not `running`: with the log store down, the drivers must stop all the same.
    now = stack.status(settings.state_dir)
    if not (now.postgres.running and now.broker.running):
        return
    from orchestrator.service import Orchestrator

    # Drivers writing to this PostgreSQL would only fail once it is gone.
    for st in Orchestrator(settings).stop_all():
        print(f"stopped {st.job} {st.version}")


def _reset(settings: Settings, as_json: bool, yes: bool) -> int:
    from orchestrator.dev import stack
    from orchestrator.spark.checkpoint import is_local, local_path

    where = settings.state_dir.resolve()
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"`kappa dev reset` deletes the log, the catalog, the outputs and "
                              f"the checkpoints in {where}: add --yes to confirm")
        answer = input(f"Delete the log, the catalog, the outputs and the checkpoints in "
                       f"{where}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    _stop_drivers(settings)
    stack.down(settings.state_dir)
    removed = stack.reset(settings.state_dir)
    if as_json:
        print_json({"state_dir": str(where), "removed": [str(p) for p in removed]})
    else:
        for path in removed:
            print(f"removed {path}")
        elsewhere = settings.checkpoint_root
        if elsewhere and not (is_local(elsewhere)
                              and local_path(elsewhere).resolve().is_relative_to(where)):
            print(f"checkpoints under {elsewhere} (KAPPA_CHECKPOINT_ROOT) were left alone")
        print("the embedded stack is down and empty; `kappa dev up` starts it afresh")
    return 0
