"""Where a replay's time goes: CPU seconds by process role over a window (psutil), and where the
Python processes spend theirs (py-spy, sampling the driver and every process below it).

Used by bench/replay.py --profile; measures, asserts nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

SAMPLE_S = 0.25


def role(process: psutil.Process, driver_pid: int) -> str:
    """The part of the stack a process plays, from its name, command line and ancestry."""
    try:
        name, cmdline = process.name(), " ".join(process.cmdline())
        ancestors = {p.pid for p in process.parents()}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if process.pid == driver_pid:
        return "driver (Python)"
    if name == "py-spy":
        return "profiler (py-spy)"
    if driver_pid in ancestors:
        if name == "java":
            return "driver JVM"
        return "Python workers (read, parse, write)"
    if "tansu" in cmdline:
        return "broker (Tansu)"
    if name.startswith("postgres") or "postgres" in cmdline.split(" ")[0]:
        return "PostgreSQL"
    if "kappa" in cmdline or "orchestrator" in cmdline or "bench/" in cmdline:
        return "orchestrator and bench (waiting)"
    return "other"


class CpuByRole:
    """Samples every process's CPU times; the difference between the first and the last time
    each process was seen, summed by role. A process that starts and ends between two
    samples is missed: the sampling period is short next to a Python worker's life."""

    def __init__(self, driver_pid: int) -> None:
        self.driver_pid = driver_pid
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.roles: dict[int, str] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for process in psutil.process_iter(["name"]):
            try:
                times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            used = times.user + times.system
            if process.pid not in self.first:
                # A process born during the window counts from zero.
                self.first[process.pid] = 0.0 if self._started else used
            name = process.info["name"]
            if self.names.get(process.pid) != name:
                # Again when the name changes: spark-class's shell becomes the driver's JVM.
                self.names[process.pid] = name
                self.roles[process.pid] = role(process, self.driver_pid)
            self.last[process.pid] = used

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def __enter__(self) -> CpuByRole:
        self._started = False
        self._sample()
        self._started = True
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self) -> dict[str, float]:
        by_role: Counter[str] = Counter()
        for pid, used in self.last.items():
            by_role[self.roles[pid]] += used - self.first[pid]
        return {r: round(s, 1) for r, s in by_role.most_common() if s >= 0.05}


@contextmanager
def sampled_stacks(pid: int, out: Path, rate: int = 67) -> Iterator[Path]:
    """py-spy records the process and its subprocesses into ``out`` (collapsed stacks)."""
    # The venv's own first: `.venv/bin/python bench/...` runs without the venv on PATH.
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy is not installed: run '.venv/bin/pip install py-spy'")
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--subprocesses", "--format",
                             "raw", "--rate", str(rate), "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield out
    finally:
        proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
        _, err = proc.communicate(timeout=60)
        if not out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-400:]}")


_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _function(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m["file"]
    # The last two path parts name the module well enough (pyspark/worker.py, spark/read/source.py).
    return f"{m['fn']} ({'/'.join(Path(file).parts[-2:])})"


def hot_functions(collapsed: Path, top: int = 15) -> dict[str, Any]:
    """Shares of all samples, by function, of self time and of inclusive time."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        count = int(m["count"])
        frames = [f for f in m["stack"].split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        functions = [_function(f) for f in frames]
        own[functions[-1]] += count
        for fn in set(functions):
            inclusive[fn] += count
    share = (lambda c: round(c / total, 3)) if total else (lambda c: 0.0)
    return {"samples": total,
            "self": [(fn, share(c)) for fn, c in own.most_common(top)],
            "inclusive": [(fn, share(c)) for fn, c in inclusive.most_common(top)]}


@contextmanager
def profiled(pid: int | None, directory: Path | None, version: str
             ) -> Iterator[dict[str, Any]]:
    """Yields a dict that holds, after the block, {"profile": ...} when ``directory`` is set."""
    found: dict[str, Any] = {}
    if directory is None or pid is None:
        yield found
        return
    directory.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with CpuByRole(pid) as cpu, sampled_stacks(pid, directory / f"{version}.txt") as stacks:
        yield found
    window = time.perf_counter() - began
    found["profile"] = {"window_s": round(window, 1),
                        "cpu_capacity_s": round(window * len(os.sched_getaffinity(0)), 1),
                        "cpu_s_by_role": cpu.seconds(), "python": hot_functions(stacks),
                        "stacks_file": str(stacks)}
