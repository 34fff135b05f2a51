"""CPU seconds per test, with the drivers, Airflow processes and services it starts (#19), and
the run's figures per module: wall, CPU and driver starts, written to a JSON file (#59).

The suite keeps both cores busy, so CI's wall time follows the CPU that tests use, not their own
wall time: a test that waits out an outage costs little, one that starts drivers costs much.
Where the machine allows it (cgroup v1's cpuacct, writable by root), each pytest process moves
itself into a cpuacct group of its own, which everything it starts inherits; a test's figure is
the group's usage from its setup to its teardown. Elsewhere nothing is measured or shown.

Driver starts are counted exactly, where they happen (orchestrator/spark/launch/driver_process.py
appends a line to the file that KAPPA_DRIVER_START_LOG names): each test points it at a file of
its own, which the processes it starts inherit. A spare started by a test, whose JVM starts
minutes later, still counts for that test."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.spark.launch.driver_process import START_LOG_VARIABLE

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
GROUP_PREFIX = "kappa-tests-"  # one group per pytest process, named by its run and its PID
# The run, named by its controller's PID, which xdist's workers inherit: a run's groups are
# told from those of another run on the same machine (another checkout's, a helper's).
RUN_VARIABLE = "KAPPA_TEST_RUN"


def run_groups() -> str:
    """The name that this run's groups begin with."""
    return f"{GROUP_PREFIX}{os.environ.setdefault(RUN_VARIABLE, str(os.getpid()))}-"
_STARTED = pytest.StashKey[float]()
PROPERTY = "cpu_seconds"


class CpuMeter:
    def __init__(self) -> None:
        self._usage: Path | None = None

    def join(self) -> None:
        for stale in CPUACCT.glob(f"{GROUP_PREFIX}*"):
            with contextlib.suppress(OSError):  # still holds a process: not stale
                stale.rmdir()
        group = CPUACCT / f"{run_groups()}{os.getpid()}"
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


def most_cpu_lines(per_test: Mapping[str, float], top: int) -> list[str]:
    return [f"{seconds:8.1f}  {nodeid}"
            for nodeid, seconds in sorted(per_test.items(), key=lambda kv: -kv[1])[:top]]


# The controller's directory of start logs, which xdist's workers inherit in their environment.
STARTS_DIR_VARIABLE = "KAPPA_TEST_DRIVER_STARTS_DIR"
BETWEEN_TESTS = "between tests"
# Kinds that start a JVM; "adopted" hands a version to a spare's running one.
JVM_STARTS = ("cold", "spare")


class DriverStarts:
    def __init__(self) -> None:
        self.directory: Path | None = None
        self._owned = False

    def open(self) -> None:
        """In the controller: a new directory for this run; in a worker: the controller's."""
        inherited = os.environ.get(STARTS_DIR_VARIABLE)
        if inherited:
            self.directory = Path(inherited)
            return
        self.directory = Path(tempfile.mkdtemp(prefix="kappa-driver-starts-"))
        self._owned = True
        os.environ[STARTS_DIR_VARIABLE] = str(self.directory)
        self.finished()

    def close(self) -> None:
        if self._owned and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _file(self, nodeid: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{hashlib.sha256(nodeid.encode()).hexdigest()[:24]}.starts"

    def started(self, nodeid: str) -> None:
        if self.directory is not None:
            os.environ[START_LOG_VARIABLE] = str(self._file(nodeid))

    def finished(self) -> None:
        if self.directory is not None:
            os.environ[START_LOG_VARIABLE] = str(self._file(BETWEEN_TESTS))

    def counts(self, nodeids: Iterable[str]) -> dict[str, dict[str, int]]:
        """Each test's starts by kind (those that had any), and those between tests."""
        found: dict[str, dict[str, int]] = {}
        if self.directory is None:
            return found
        for nodeid in [*nodeids, BETWEEN_TESTS]:
            try:
                kinds = self._file(nodeid).read_text().split()
            except OSError:
                continue
            found[nodeid] = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
        return found


def module_of(nodeid: str) -> str:
    return nodeid.split("::", maxsplit=1)[0]


class Span:
    """Where and when each test ran: its worker, and the run's seconds at which its setup began
    and its teardown ended."""

    def __init__(self, began_epoch: float) -> None:
        self._began = began_epoch
        self.spans: dict[str, tuple[str, float, float]] = {}

    def saw(self, nodeid: str, worker: str, start_epoch: float, stop_epoch: float) -> None:
        _, began, ended = self.spans.get(nodeid, (worker, start_epoch - self._began, 0.0))
        self.spans[nodeid] = (worker, min(began, start_epoch - self._began),
                              max(ended, stop_epoch - self._began))


def workers_of(spans: Mapping[str, tuple[str, float, float]], wall_s: float
               ) -> dict[str, dict[str, float | int]]:
    """Per worker: its tests, its busy seconds, and when its last test ended. A worker idle long
    before the run's end is a tail: a long test that started too late."""
    workers: dict[str, dict[str, float | int]] = {}
    for worker, began, ended in spans.values():
        figures = workers.setdefault(worker, {"tests": 0, "busy_s": 0.0, "last_ended_s": 0.0})
        figures["tests"] += 1
        figures["busy_s"] += ended - began
        figures["last_ended_s"] = max(figures["last_ended_s"], ended)
    return {worker: {**figures, "busy_s": round(figures["busy_s"], 1),
                     "last_ended_s": round(figures["last_ended_s"], 1),
                     "idle_at_the_end_s": round(wall_s - figures["last_ended_s"], 1)}
            for worker, figures in sorted(workers.items())}


def run_figures(*, wall_s: float, seconds: Mapping[str, float], cpu: Mapping[str, float],
                starts: Mapping[str, Mapping[str, int]], kinds: Mapping[str, float] | None,
                exit_status: int, spans: Mapping[str, tuple[str, float, float]] | None = None
                ) -> dict[str, Any]:
    """The run's figures per module (``seconds``, ``cpu`` and ``starts`` are per test). A
    module's wall is its tests' summed setup, call and teardown: on several workers they overlap,
    so the run's own wall time is given apart. ``spans``: each test's worker, and when it began
    and ended (Span)."""
    spans = spans or {}
    modules: dict[str, dict[str, Any]] = {}
    for nodeid in {*seconds, *cpu, *starts} - {BETWEEN_TESTS}:
        module = modules.setdefault(module_of(nodeid), {
            "tests": 0, "wall_s": 0.0, "cpu_s": None, "driver_starts": 0, "cold_starts": 0,
            "spare_starts": 0, "adopted": 0})
        module["tests"] += 1
        module["wall_s"] += seconds.get(nodeid, 0.0)
        if nodeid in cpu:
            module["cpu_s"] = (module["cpu_s"] or 0.0) + cpu[nodeid]
        for kind, n in starts.get(nodeid, {}).items():
            key = f"{kind}_starts" if kind in JVM_STARTS else kind
            module[key] = module.get(key, 0) + n
            module["driver_starts"] += n if kind in JVM_STARTS else 0
    between = starts.get(BETWEEN_TESTS, {})
    return {
        "wall_s": round(wall_s, 1), "exit_status": exit_status,
        "test_wall_s": round(sum(seconds.values()), 1),
        "cpu_s": round(sum(cpu.values()), 1) if cpu else None,
        "driver_starts": sum(m["driver_starts"] for m in modules.values())
        + sum(n for kind, n in between.items() if kind in JVM_STARTS),
        "driver_starts_between_tests": dict(between),
        "cpu_kinds": None if kinds is None else {
            "total_s": round(sum(kinds.values()), 1),
            "per_kind": {kind: round(s, 1) for kind, s in sorted(kinds.items(),
                                                                  key=lambda kv: -kv[1])}},
        "workers": workers_of(spans, wall_s),
        "modules": {name: {k: round(v, 1) if isinstance(v, float) else v for k, v in m.items()}
                    for name, m in sorted(modules.items())},
        # Each test's own, to find where a module's CPU goes.
        "tests": {nodeid: {
            "wall_s": round(seconds.get(nodeid, 0.0), 1),
            "cpu_s": round(cpu[nodeid], 1) if nodeid in cpu else None,
            "driver_starts": sum(n for kind, n in starts.get(nodeid, {}).items()
                                 if kind in JVM_STARTS),
            **({"worker": spans[nodeid][0], "began_s": round(spans[nodeid][1], 1),
                "ended_s": round(spans[nodeid][2], 1)} if nodeid in spans else {})}
            for nodeid in sorted({*seconds, *cpu, *starts} - {BETWEEN_TESTS})},
    }


def figures_path(root: Path) -> Path:
    explicit = os.environ.get("KAPPA_TEST_FIGURES")
    return Path(explicit) if explicit else root / ".ci-figures" / "test-figures.json"


def write_figures(path: Path, figures: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ignore = path.parent / ".gitignore"
    if path.parent.name == ".ci-figures" and not ignore.exists():
        ignore.write_text("*\n")  # a run's output, never committed
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(figures, indent=1) + "\n")
    os.replace(partial, path)  # a reader never sees half a file


def slowest_modules_lines(figures: Mapping[str, Any], top: int = 10) -> list[str]:
    """The modules with most CPU (most wall where CPU is not measured), with their wall and
    driver starts."""
    modules: Mapping[str, Mapping[str, Any]] = figures["modules"]
    measured = figures["cpu_s"] is not None
    ranked = sorted(modules.items(), key=lambda kv: -((kv[1]["cpu_s"] or 0.0) if measured
                                                       else kv[1]["wall_s"]))
    lines = [f"{'CPU-s':>8}  {'wall-s':>8}  {'drivers':>7}  module"]
    for name, m in ranked[:top]:
        cpu = "-" if m["cpu_s"] is None else f"{m['cpu_s']:.1f}"
        lines.append(f"{cpu:>8}  {m['wall_s']:8.1f}  {m['driver_starts']:7d}  {name}")
    cpu_all = "-" if figures["cpu_s"] is None else f"{figures['cpu_s']:.1f}"
    lines.append(f"{cpu_all:>8}  {figures['test_wall_s']:8.1f}  {figures['driver_starts']:7d}  "
                 f"in all ({len(modules)} modules; the run took {figures['wall_s']:.0f} s)")
    return lines
