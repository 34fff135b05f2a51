"""A driver writes its local checkpoint without ``readlink`` processes: pip's pyspark has no
Hadoop native library, and through Hadoop's FileContext (Spark's default) the rename of every
file of the offset log, the commit log and a state store was checked by ``readlink`` processes,
on top of the ``chmod`` processes that give each file its mode (orchestrator/spark/checkpoint.py).

The drivers run with a PATH whose ``chmod`` and ``readlink`` note each call, then do the real
thing: the batch job and a stateful stream job replay exactly, no ``readlink`` names their
checkpoints, and what is left is a ``chmod`` for each file and directory created."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import job_file
from integration.helpers import output
from integration.stream_helpers import example
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]

_NOTING = """#!/bin/sh
echo "$(basename "$0") $*" >> {calls}
exec {real} "$@"
"""


def _noting_path(directory: Path, calls: Path) -> str:
    directory.mkdir()
    for command in ("chmod", "readlink"):
        real = shutil.which(command)
        assert real, command
        script = directory / command
        script.write_text(_NOTING.format(calls=calls, real=real))
        script.chmod(0o755)
    return f"{directory}{os.pathsep}{os.environ['PATH']}"


def test_drivers_write_their_checkpoints_without_starting_processes(
        settings, topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.service import Orchestrator

    calls = tmp_path / "calls.txt"
    calls.touch()
    monkeypatch.setenv("PATH", _noting_path(tmp_path / "bin", calls))
    service = Orchestrator(settings)
    service.produce_sample(topic, 30_000, seed=211)
    service.deploy(job_file(tmp_path, "v1", topic))
    service.deploy(example(tmp_path, "url_visitors", {"pageviews": topic}))
    try:
        service.wait("pageview_counts", "v1", timeout_s=300)
        service.wait("url_visitors", "v1", timeout_s=300)
        assert output(settings, "pageview_counts__v1") == compute(
            settings.kafka_bootstrap, topic).v1
        assert [service.version_status(job, "v1").attempt for job in
                ("pageview_counts", "url_visitors")] == [1, 1]
        root = str(settings.state_dir / "checkpoints")
        noted = calls.read_text().splitlines()
        # The wrappers are the ones found on this PATH: the test's own chmod is noted.
        subprocess.run(["chmod", "0644", str(calls)], check=True)
        assert calls.read_text().splitlines()[len(noted):] == [f"chmod 0644 {calls}"]
        ours = [call for call in noted if root in call]
        print(f"{len(ours)} processes for the checkpoints")
        assert [call for call in ours if not call.startswith("chmod ")] == []
        # Each chmod is of a file or directory as it is created, never one again.
        assert len(set(ours)) == len(ours)
    finally:
        service.stop_all()
