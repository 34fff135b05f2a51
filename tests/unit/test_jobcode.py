"""Code copies of drivers that were killed are removed by the next driver, never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.spark.jobcode import CODE_PREFIX, remove_orphaned_code


def test_only_copies_of_drivers_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    dead = tmp_path / f"{CODE_PREFIX}{dead_pid}-x1"
    live = tmp_path / f"{CODE_PREFIX}{os.getpid()}-x2"
    unnamed = tmp_path / f"{CODE_PREFIX}old_style"  # from before PIDs were in the name
    unrelated = tmp_path / "kappa-other-1-x"
    for path in (dead, live, unnamed, unrelated):
        (path / "pkg").mkdir(parents=True)
    assert remove_orphaned_code(tmp_path) == 1
    assert not dead.exists()
    assert live.exists() and unnamed.exists() and unrelated.exists()
    assert remove_orphaned_code(tmp_path) == 0
