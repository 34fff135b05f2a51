"""CPU seconds per test, with the drivers, Airflow processes and services it starts (#19).

The suite keeps both cores busy, so CI's wall time follows the CPU that tests use, not their own
wall time: a test that waits out an outage costs little, one that starts drivers costs much.
Where the machine allows it (cgroup v1's cpuacct, writable by root), each pytest process moves
itself into a cpuacct group of its own, which everything it starts inherits; a test's figure is
the group's usage from its setup to its teardown. Elsewhere nothing is measured or shown."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
GROUP_PREFIX = "kappa-tests-"  # one group per pytest process, named by its PID
_STARTED = pytest.StashKey[float]()
PROPERTY = "cpu_seconds"


class CpuMeter:
    def __init__(self) -> None:
        self._usage: Path | None = None

    def join(self) -> None:
        for stale in CPUACCT.glob(f"{GROUP_PREFIX}*"):
            with contextlib.suppress(OSError):  # still holds a process: not stale
                stale.rmdir()
        group = CPUACCT / f"{GROUP_PREFIX}{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return  # not root, or no cgroup v1 cpuacct here: measured nowhere
        self._usage = group / "cpuacct.usage"

    def leave(self) -> None:
        if self._usage is not None:
            with contextlib.suppress(OSError):
                (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
                self._usage.parent.rmdir()

    def seconds(self) -> float | None:
        if self._usage is None:
            return None
        try:
            return int(self._usage.read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def started(self, item: pytest.Item) -> None:
        now = self.seconds()
        if now is not None:
            item.stash[_STARTED] = now

    def finished(self, item: pytest.Item, report: pytest.TestReport) -> None:
        now, began = self.seconds(), item.stash.get(_STARTED, None)
        if now is not None and began is not None:
            # Carried by the teardown report, so that xdist's controller sees it too.
            report.user_properties.append((PROPERTY, now - began))


def summary_lines(per_test: dict[str, float], top: int) -> list[str]:
    per_module: dict[str, float] = {}
    for nodeid, seconds in per_test.items():
        module = nodeid.split("::")[0]
        per_module[module] = per_module.get(module, 0.0) + seconds
    lines = [f"{seconds:8.1f}  {module}"
             for module, seconds in sorted(per_module.items(), key=lambda kv: -kv[1])[:top]]
    lines.append(f"{sum(per_module.values()):8.1f}  in all")
    lines.append("the tests with most:")
    lines += [f"{seconds:8.1f}  {nodeid}"
              for nodeid, seconds in sorted(per_test.items(), key=lambda kv: -kv[1])[:top]]
    return lines
