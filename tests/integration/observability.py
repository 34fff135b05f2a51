"""A real Prometheus server and a `kappa agent`, started by tests on loopback."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.process import stop_process

from conftest import debian_tool, wait_until

ALERT_RULES = Path(__file__).resolve().parents[2] / "dashboards" / "kappa-alerts.yml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def agent(settings: Any, directory: Path, *args: str, archive: bool = False) -> Iterator[str]:
    """`kappa agent` on a free port; yields its host:port. Its archiver runs only where a
    test says so, and it keeps no warm spare drivers (test_spares.py tests those): elsewhere
    they would only take CPU from the drivers under test."""
    env = {**os.environ, **settings.driver_environment(), "KAPPA_WARM_SPARES": "0"}
    out = directory / "agent.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("kappa")), "agent",
                                 "--port", "0", *args, *(() if archive else ("--no-archive",))],
                                env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    try:
        found = wait_until(lambda: re.search(r"http://(127\.0\.0\.1:\d+)/metrics",
                                             out.read_text()), 30, "the agent to listen")
        yield found.group(1)  # type: ignore[union-attr]
    finally:
        stop_process(proc)


def scrape(target: str) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
        return str(response.read().decode())


@contextmanager
def prometheus(directory: Path, *targets: str) -> Iterator[str]:
    """A Prometheus server scraping ``targets`` every second; yields its base URL."""
    binary = debian_tool("prometheus", "prometheus")
    port = free_port()
    config = directory / "prometheus.yml"
    # A plain scrape config, as an operator writes it (no honor_labels): the kappa job is the
    # exporter's `kappa_job`, and `job` is the scrape job's. The shipped alert rules are loaded.
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {ALERT_RULES}\n"
        "scrape_configs:\n  - job_name: kappa\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(target) for target in targets)}]\n")
    with open(directory / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 60, "Prometheus to be ready")
        yield url
    finally:
        stop_process(proc)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """Instant query through the HTTP API; the result vector."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(address, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def alert_rules(url: str) -> list[dict[str, Any]]:
    """The alerting rules the server loaded, each with its health after evaluation."""
    with urllib.request.urlopen(f"{url}/api/v1/rules?type=alert", timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return [rule for group in body["data"]["groups"] for rule in group["rules"]]
