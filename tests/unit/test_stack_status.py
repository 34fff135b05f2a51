"""What `kappa dev status` says of the embedded stack's log: durable only while the archiver
that makes it so runs (#47, path 3: it said "durable, archived every second" with the archiver
dead)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from orchestrator.dev.stack import ARCHIVED, STACK_FILE, ServiceStatus, StackStatus, down, status


def _status(archiver_running: bool) -> StackStatus:
    up = ServiceStatus("postgres", 1, True, "")
    return StackStatus(
        state_dir=Path("/s"), postgres=up, broker=ServiceStatus("broker", 2, True, "b:1"),
        pg_dsn="d", kafka_bootstrap="b:1", storage=ARCHIVED,
        archiver=ServiceStatus("archiver", 3 if archiver_running else None, archiver_running,
                               "every 1 s"),
        ack_proxy=ServiceStatus("ack proxy", 4, True, "p"))


@pytest.mark.parametrize("running", [True, False])
def test_the_log_is_durable_only_while_the_archiver_runs(running: bool) -> None:
    text = _status(running).storage_text
    assert text.startswith("durable") is running, text
    if not running:
        assert "archiver is not running" in text and "kappa dev up" in text, text


_SLEEPER = ("import signal, sys\n"
            "signal.signal(signal.{sig}, lambda *_: sys.exit(0))\n"
            "print('ready', flush=True)\n"
            "signal.pause()\n")


def _stand_in(sig: str) -> subprocess.Popen[bytes]:
    """A process that exits at once on ``sig``, as the archiver does after its last pass (and
    the broker on SIGINT)."""
    proc = subprocess.Popen([sys.executable, "-c", _SLEEPER.format(sig=sig)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


@pytest.mark.parametrize("archiver_ran", [True, False])
def test_after_dev_down_the_status_says_where_the_log_is(tmp_path: Path,
                                                         archiver_ran: bool) -> None:
    """#61 path 11: after a clean `kappa dev down`, `kappa dev status` said "NOT durable now:
    ... in the broker's memory only", with the broker down and the log archived to its end by
    the archiver's last pass. Without an archiver at the down, the tail since its last pass is
    lost with the broker's memory, and the status says that instead."""
    broker = _stand_in("SIGINT")
    archiver = _stand_in("SIGTERM") if archiver_ran else None
    record = {"storage": ARCHIVED, "broker_pid": broker.pid,
              "broker_cmdline": psutil.Process(broker.pid).cmdline()}
    if archiver is not None:
        record |= {"archiver_pid": archiver.pid,
                   "archiver_cmdline": psutil.Process(archiver.pid).cmdline()}
    (tmp_path / "dev").mkdir()
    (tmp_path / STACK_FILE).write_text(json.dumps(record))
    try:
        down(tmp_path)
        text = status(tmp_path).storage_text
    finally:
        for proc in (broker, archiver):
            if proc is not None:
                proc.kill()
                proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()
    assert "NOT durable now" not in text and "broker's memory only" not in text, text
    assert text.startswith("stopped") and "kappa dev up" in text, text
    assert ("made its last pass" in text) is archiver_ran, text
    assert ("were lost" in text) is not archiver_ran, text
