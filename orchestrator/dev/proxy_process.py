"""The ack proxy (ack_proxy.py) as a process of the embedded stack, and its ledgers.

The ledger of the running broker is ``<state_dir>/dev/broker-acks``. When the broker is gone
and a new one starts, that ledger becomes the lost broker's, ``broker-acks.lost``: the restore
compares it with the archive to name what the crash took, and removes it once it has.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.ack_ledger import Deletions, Ends, merged, read_deletions, read_ledger
from orchestrator.dev.held_clients import held_path
from orchestrator.dev.logs import tail
from orchestrator.dev.processes import HOST, exited, listens, live_process, poll, stop
from orchestrator.errors import ServiceUnavailableError
from orchestrator.process import spawn_detached

KEYS = ("proxy_pid", "proxy_cmdline")
_START_TIMEOUT_S = 10.0


def ledger_path(dev: Path) -> Path:
    return dev / "broker-acks"


def lost_ledger_path(dev: Path) -> Path:
    return dev / "broker-acks.lost"


def start_proxy(dev: Path, listen_port: int, broker_port: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "orchestrator.dev.ack_proxy", str(listen_port),
            str(broker_port), str(ledger_path(dev)), str(held_path(dev))]
    log = dev / "ack-proxy.log"
    pid = spawn_detached(argv, os.environ, log)
    proc = psutil.Process(pid)
    if not poll(lambda: exited(proc) or listens(listen_port), _START_TIMEOUT_S) \
            or exited(proc):
        stop(proc, (signal.SIGKILL,))
        raise ServiceUnavailableError(
            f"the broker's ack proxy did not come up on {HOST}:{listen_port}: {tail(log)}; see "
            f"{log}, fix it and run `kappa dev up` again")
    return {"proxy_pid": pid, "proxy_cmdline": proc.cmdline()}


def retire_ledger(dev: Path, record: dict[str, Any]) -> None:
    """The broker is gone: stop its proxy and keep its ledger as the lost broker's (merged
    with one a failed restore left, so that nothing it names is forgotten)."""
    proxy = live_process(record, "proxy")
    if proxy is not None:
        stop(proxy, (signal.SIGTERM, signal.SIGKILL))
    record.update(dict.fromkeys(KEYS))
    current, lost = ledger_path(dev), lost_ledger_path(dev)
    if not current.exists():
        return
    if lost.exists():
        tmp = lost.with_suffix(".tmp")
        tmp.write_text(merged(lost, current))
        tmp.replace(lost)
        current.unlink()
    else:
        current.replace(lost)


def lost_broker_acks(dev: Path) -> Ends:
    return read_ledger(lost_ledger_path(dev))


def lost_broker_deletions(dev: Path) -> Deletions:
    return read_deletions(lost_ledger_path(dev))
