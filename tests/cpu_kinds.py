"""CPU seconds by kind of process over a whole run: Spark's JVMs, the drivers' Python workers,
Airflow, the broker, PostgreSQL, the tests' own code (#24).

tests/cpu_accounting.py says which tests cost most; this says what in them does, so that CI's
time can be cut where it goes. The run's processes are those of the cpuacct groups that each
pytest process of the run joins (everything a test starts inherits its group; another run's
groups are left out). A thread of the controller
looks at them every ``interval_s`` and keeps the last CPU time it saw of each process; what
processes that lived between two looks used is the groups' total less what was seen, shown as
such. Where the machine has no such groups, nothing is sampled or shown."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from cpu_accounting import CPUACCT, GROUP_PREFIX

_TICKS = os.sysconf("SC_CLK_TCK")
SHELLS = "shells (before they exec)"
UNSEEN = "lived between two looks (short processes: CLI calls, launchers, probes)"

# (kind, words any of which in the command line makes a process that kind), first match wins.
_JAVA_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Spark launcher (JVM)", ("org.apache.spark.launcher.Main",)),
    ("class archive build (JVM)", ("-XX:ArchiveClassesAtExit",)),
    ("Spark standalone master and workers (JVM)", ("org.apache.spark.deploy.master.Master",
                                                    "org.apache.spark.deploy.worker.Worker")),
    ("Spark executors (JVM)", ("CoarseGrainedExecutorBackend",)),
)
_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # By the program, not by a path: drivers' logs and Prometheus' files lie under pytest's tmp.
    ("pytest (the tests' own code)", ("[pytest-xdist ", "exec(eval(sys.stdin.readline()))",
                                      "bin/pytest ", "-m pytest")),
    ("drivers' Python workers (the zygote and its forks)", ("orchestrator.spark.launch.zygote",)),
    ("drivers' Python workers (started)", ("pyspark.daemon", "orchestrator.spark.daemon",
                                           "pyspark.worker", "python_streaming_source_runner")),
    ("spares (Python)", ("orchestrator.spark.launch.spare",)),
    ("drivers (Python)", ("orchestrator.spark.driver",)),
    ("class archive build (Python)", ("orchestrator.spark.launch.cds_build",)),
    ("stack helpers (archiver, ack proxy)", ("orchestrator.dev.ack_proxy", "archive run")),
    ("kappa CLI", ("bin/kappa ", "orchestrator.cli.main")),
    ("broker (Tansu)", ("tansu",)),
    ("PostgreSQL", ("postgres",)),
    ("Airflow", ("airflow",)),
    ("Prometheus", ("prometheus", "promtool")),
    ("S3 server and npm (node)", ("s3rver", "node ")),
)


def kind_of(command_line: str) -> str:
    """The kind of a process, from its command line (arguments joined by spaces)."""
    if not command_line.strip():
        return "exited before its command line was read"
    program = os.path.basename(command_line.split(" ", 1)[0])
    if program == "java":
        for kind, words in _JAVA_KINDS:
            if any(word in command_line for word in words):
                return kind
        return "Spark drivers and spares (JVM)"
    if program in ("bash", "sh", "env", "dash"):
        # spark-submit's scripts, which exec java: looked at again. Before the words: their
        # arguments name the drivers' Python modules (spark.python.daemon.module).
        return SHELLS
    for kind, words in _KINDS:
        if any(word in command_line for word in words):
            return kind
    return f"other: {program}"


class KindSampler(threading.Thread):
    def __init__(self, interval_s: float = 2.0, cpuacct: Path = CPUACCT,
                 groups: str = GROUP_PREFIX) -> None:
        """``groups``: what the names of the groups to look at begin with (run_groups(): this
        run's only, not another run's on the same machine)."""
        super().__init__(name="cpu-kinds", daemon=True)
        self.interval_s, self.cpuacct, self.groups = interval_s, cpuacct, groups
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._groups: dict[str, float] = {}  # group name -> its usage when last seen
        # (pid, start time) -> (its CPU seconds when last seen, its kind)
        self._processes: dict[tuple[int, str], tuple[float, str]] = {}

    def available(self) -> bool:
        return any(self.cpuacct.glob(f"{self.groups}*"))

    def run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.look()

    def stop(self) -> None:
        self._stopping.set()
        self.look()

    def look(self) -> None:
        for group in self.cpuacct.glob(f"{self.groups}*"):
            with contextlib.suppress(OSError, ValueError):  # a worker's group, just removed
                usage = int((group / "cpuacct.usage").read_text()) / 1e9
                pids = (group / "cgroup.procs").read_text().split()
                with self._lock:
                    self._groups[group.name] = usage
                for pid in pids:
                    self._look_at(int(pid))

    def _look_at(self, pid: int) -> None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        fields = stat[stat.rfind(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
        key = (pid, fields[19])  # the start time tells a reused PID apart
        with self._lock:
            seen = self._processes.get(key)
        # A shell is looked at again: spark-submit's scripts exec java.
        kind = kind_of(_command_line(pid)) if seen is None or seen[1] == SHELLS else seen[1]
        with self._lock:
            self._processes[key] = (cpu, kind)

    def totals(self) -> dict[str, float]:
        with self._lock:
            per_kind: dict[str, float] = {}
            for cpu, kind in self._processes.values():
                per_kind[kind] = per_kind.get(kind, 0.0) + cpu
            unseen = sum(self._groups.values()) - sum(per_kind.values())
        if unseen > 0:
            per_kind[UNSEEN] = unseen
        return per_kind

    def summary_lines(self) -> list[str]:
        per_kind = self.totals()
        total = sum(per_kind.values())
        lines = [f"{seconds:8.1f}  {100 * seconds / total:4.1f} %  {kind}"
                 for kind, seconds in sorted(per_kind.items(), key=lambda kv: -kv[1])]
        lines.append(f"{total:8.1f}  in all")
        return lines


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()
