"""A real Prometheus server and a `kappa agent`, started by tests on loopback."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator.process import stop_process

from conftest import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def agent(settings: Any, directory: Path, *args: str, archive: bool = False) -> Iterator[str]:
    """`kappa agent` on a free port; yields its host:port. Its archiver runs only where a
    test says so: elsewhere it would only take CPU from the drivers under test."""
    env = dict(os.environ, **settings.driver_environment())
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
def prometheus(directory: Path, target: str) -> Iterator[str]:
    """A Prometheus server scraping ``target`` every second; yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        why = ("prometheus is not installed: `apt-get install prometheus` (scripts/test.sh "
               "does it when run as root)")
        if os.environ.get("CI"):
            pytest.fail(why)  # CI installs it: a missing server there is a broken set-up
        pytest.skip(why)
    port = free_port()
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        # honor_labels: the exporter's own `job` label (the kappa job) must not be renamed.
        "scrape_configs:\n  - job_name: kappa\n    honor_labels: true\n    static_configs:\n"
        f"      - targets: ['{target}']\n")
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
