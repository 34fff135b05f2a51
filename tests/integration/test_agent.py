"""`kappa agent` serves the exporter over HTTP, on loopback, until it is told to stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_until

pytestmark = [pytest.mark.integration]


def test_agent_serves_fresh_metrics_and_stops_on_sigterm(settings, tmp_path: Path) -> None:
    env = dict(os.environ, **settings.driver_environment())
    out = tmp_path / "agent.out"
    with open(out, "wb") as sink:
        agent = subprocess.Popen(
            [str(Path(sys.executable).with_name("kappa")), "agent", "--port", "0",
             "--interval", "0.5"], env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        found = wait_until(lambda: re.search(r"http://127\.0\.0\.1:(\d+)/metrics",
                                             out.read_text()), 30, "the agent to listen")
        url = found.group(0)  # type: ignore[union-attr]

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()

        text = wait_until(lambda: "kappa_exporter_stale 0.0" in (t := scrape()) and t, 30,
                          "a successful refresh")
        assert "kappa_exporter_last_success_timestamp_seconds" in text  # type: ignore[operator]
        assert settings.pg_dsn not in text  # type: ignore[operator]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
