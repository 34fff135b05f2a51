"""Which archive root a version's read tasks read: a local path only where Spark runs locally."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.archive.readable import executor_archive_root
from orchestrator.settings import Settings


@pytest.mark.parametrize(("master", "root", "read"), [
    ("local[2]", None, "state/archive"),  # the default root, executors on this host
    ("local[*]", "/data/archive", "/data/archive"),
    # Executors on other hosts would not find a local path's files, and the batch would fail
    # as if the segments were gone: Kafka serves it instead.
    ("spark://spark-master:7077", "/data/archive", None),
    # A master on loopback: no worker of another host can join it.
    ("spark://127.0.0.1:7077", "/data/archive", "/data/archive"),
    ("spark://localhost:7077", None, "state/archive"),
    ("spark://10.0.0.5:7077", "/data/archive", None),
    ("spark://spark-master:7077", None, None),
    ("yarn", "/data/archive", None),
    ("spark://spark-master:7077", "s3://bucket/archive", "s3://bucket/archive"),
    ("spark://spark-master:7077", "file:///mnt/shared/archive", "file:///mnt/shared/archive"),
])
def test_read_tasks_read_a_local_root_only_where_executors_run_on_this_host(
        master: str, root: str | None, read: str | None) -> None:
    settings = Settings(state_dir=Path("state"), spark_master=master, archive_root=root)
    assert executor_archive_root(settings) == read
