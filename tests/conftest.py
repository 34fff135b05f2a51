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
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from orchestrator.dev import stack as dev_stack

    state_dir = tmp_path_factory.mktemp("stack")
    status = dev_stack.up(state_dir)
    try:
        yield status
    finally:
        dev_stack.down(state_dir)


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
