"""`kappa demo` and `kappa dev` as a user runs them, in a fresh directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _kappa(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    exe = Path(sys.executable).with_name("kappa")
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False,
                          timeout=900)


def test_demo_tells_the_story_on_the_embedded_default() -> None:
    # mkdtemp, not tmp_path: the embedded server runs as another user (see conftest.stack).
    cwd = Path(tempfile.mkdtemp(prefix="kappa-demo-"))
    try:
        demo = _kappa(cwd, "demo", "--count", "20000")
        assert demo.returncode == 0, demo.stdout + demo.stderr
        out = demo.stdout
        for needle in ("Producing 20,000 sample page views", "pageview_counts v1",
                       "pageview_counts v2", "Top URLs in v1:", "Top URLs in v2:", "live",
                       "Their lag has gone to zero", "caught_up", "A/B: 10 %", "roll back to v1",
                       "promote v2 again", "retire v1", "rollback"):
            assert needle in out, out
        env_lines = _kappa(cwd, "dev", "env").stdout.splitlines()
        assert [line.split("=")[0] for line in env_lines] == [
            "export KAPPA_PG_DSN", "export KAPPA_KAFKA_BOOTSTRAP"]
        again = _kappa(cwd, "demo", "--count", "20000", "--json")  # idempotent second run
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)  # --json prints only JSON
        states = {v["version"]: v["state"] for v in report["versions"]}
        assert states["v1"] == "retired" and states["v2"] == "live"
        assert report["top_urls"]["v1"] and report["top_urls"]["v2"]
        down = _kappa(cwd, "dev", "down")
        assert down.returncode == 0, down.stderr
        assert "stopped pageview_counts v2" in down.stdout  # v1 was retired by the story
        assert _kappa(cwd, "dev", "status", "--json").stdout.count('"running": false') == 3
    finally:
        _kappa(cwd, "dev", "down")
        shutil.rmtree(cwd, ignore_errors=True)
