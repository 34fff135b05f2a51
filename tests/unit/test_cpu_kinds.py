"""The suite's CPU by kind of process (tests/cpu_kinds.py): how command lines are told apart, and
what the sampler adds up from a cpuacct hierarchy laid out as the kernel's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cpu_kinds import SHELLS, UNSEEN, KindSampler, kind_of

VENV = "/ci/main/.venv/bin/python"


@pytest.mark.parametrize(("command_line", "kind"), [
    ("/usr/lib/jvm/java-17/bin/java -cp /x/jars/* -Xmx768m org.apache.spark.deploy.SparkSubmit "
     "pyspark-shell", "Spark drivers and spares (JVM)"),
    ("java -Xmx128m -cp /x/jars/* org.apache.spark.launcher.Main "
     "org.apache.spark.deploy.SparkSubmit pyspark-shell", "Spark launcher (JVM)"),
    ("/usr/bin/java -cp a org.apache.spark.executor.CoarseGrainedExecutorBackend --driver-url x",
     "Spark executors (JVM)"),
    # A driver's log lies under pytest's tmp: still a driver.
    (f"{VENV} -m orchestrator.spark.driver --job j --version v1 --attempt 1 --log "
     "/tmp/pytest-of-root/pytest-2/test_x0/state/log", "drivers (Python)"),
    (f"{VENV} -m orchestrator.spark.launch.zygote /tmp/kappa-zygote-1/zygote.sock",
     "drivers' Python workers (the zygote and its forks)"),
    (f"{VENV} -m pyspark.daemon pyspark.sql.worker.lookup_data_sources",
     "drivers' Python workers (started)"),
    (f"{VENV} -c import sys;exec(eval(sys.stdin.readline()))", "pytest (the tests' own code)"),
    (f"{VENV} /ci/main/.venv/bin/kappa status --json", "kappa CLI"),
    (f"{VENV} -m orchestrator.cli.main archive run --all-topics",
     "stack helpers (archiver, ack proxy)"),
    (f"{VENV} /ci/main/.venv/bin/airflow dags test kappa_reprocess", "Airflow"),
    ("postgres: embedded_postgres test 127.0.0.1(5050) idle", "PostgreSQL"),
    ("/usr/bin/prometheus --config.file=/tmp/pytest-of-root/pytest-2/t0/prometheus.yml",
     "Prometheus"),
    # xdist's workers retitle themselves.
    ("[pytest-xdist running] tests/unit/test_cpu_kinds.py::test_x", "pytest (the tests' own code)"),
    # A driver's JVM before spark-class execs it, its arguments naming the daemon: a shell.
    ("bash /ci/main/.venv/lib/python3.11/site-packages/pyspark/bin/spark-class "
     "org.apache.spark.deploy.SparkSubmit --conf spark.python.daemon.module="
     "orchestrator.spark.daemon pyspark-shell", SHELLS),
    ("", "exited before its command line was read"),
    ("/usr/bin/socat TCP-LISTEN:1", "other: socat"),
])
def test_a_command_line_tells_the_kind(command_line: str, kind: str) -> None:
    assert kind_of(command_line) == kind


def test_the_sampler_adds_what_it_saw_and_what_lived_between_looks(tmp_path: Path) -> None:
    # This process stands for the group's one member: its CPU is read from /proc as any other's.
    group = tmp_path / "kappa-tests-1"
    group.mkdir()
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (group / "cpuacct.usage").write_text(str(10**12))  # 1,000 s: far more than it used
    (tmp_path / "unrelated").mkdir()
    sampler = KindSampler(cpuacct=tmp_path)
    assert sampler.available()
    sampler.look()
    totals = sampler.totals()
    (mine,) = [kind for kind in totals if kind != UNSEEN]
    assert mine == "pytest (the tests' own code)"  # an xdist worker, or pytest itself
    assert 0 < totals[mine] < 1000
    assert totals[mine] + totals[UNSEEN] == pytest.approx(1000)
    # The group gone (its worker ended): what was seen of it stays.
    (group / "cgroup.procs").unlink()
    (group / "cpuacct.usage").unlink()
    group.rmdir()
    sampler.stop()
    assert sampler.totals() == totals
    assert sampler.summary_lines()[-1].split() == ["1000.0", "in", "all"]


def test_no_groups_no_sampling(tmp_path: Path) -> None:
    assert not KindSampler(cpuacct=tmp_path).available()
    # Another run's group (a run of another checkout on the machine): not this run's CPU.
    (tmp_path / "kappa-tests-999-1000").mkdir()
    assert not KindSampler(cpuacct=tmp_path, groups="kappa-tests-998-").available()
    assert KindSampler(cpuacct=tmp_path, groups="kappa-tests-999-").available()
