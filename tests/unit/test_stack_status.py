"""What `kappa dev status` says of the embedded stack's log: durable only while the archiver
that makes it so runs (#47, path 3: it said "durable, archived every second" with the archiver
dead)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.dev.stack import ARCHIVED, ServiceStatus, StackStatus


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
