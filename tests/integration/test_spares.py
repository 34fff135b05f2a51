"""Warm spare drivers: a deploy adopts one whose fingerprint matches, replays exactly on it, and
starts a replacement; one that does not match is never adopted; one nobody adopts exits."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from orchestrator.service import Orchestrator
from orchestrator.spark.launch import launcher, spares

from conftest import job_file, wait_until
from integration.helpers import dead_letters, output
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


@pytest.fixture
def spare_settings(settings) -> Iterator[object]:
    # Under /tmp, not tmp_path: a Unix socket's path must stay under 108 bytes.
    directory = Path(tempfile.mkdtemp(prefix="kappa-sp-"))
    own = replace(settings, spare_dir=directory)
    try:
        yield own
    finally:
        spares.withdraw_all(own)
        shutil.rmtree(directory, ignore_errors=True)


def _spare(settings, *, may_idle_out: bool = False) -> spares.Spare:
    env = launcher.driver_environment(settings)
    pid = spares.keep(settings, env)
    assert pid is not None, "no spare was started: is memory short?"
    # Its record now, while it is there: a spare that idles out may be gone by the time
    # wait_ready sees it ready (CI, on a loaded machine, #47).
    (spare,) = [s for s in spares.spares(spares.spare_dir(settings)) if s.pid == pid]
    assert spares.wait_ready(settings, env, timeout_s=240) or (
        may_idle_out and not launcher.is_alive(spare.pid, spare.started)), \
        "the spare never became ready"
    return spare


def _is_zygote(process: psutil.Process) -> bool:
    """Whether it is a zygote itself, not one of its children (they share its command line).
    A process that has exited meanwhile (a zombie not yet reaped included) is neither."""
    try:
        parent = process.parent()
        return "orchestrator.spark.launch.zygote" in " ".join(process.cmdline()) and (
            parent is None or "orchestrator.spark.launch.zygote" not in " ".join(parent.cmdline()))
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _forked_by_zygote(driver_pid: int) -> int:
    """How many processes the driver's zygote runs for its JVM."""
    zygote = [p for p in psutil.Process(driver_pid).children(recursive=True) if _is_zygote(p)]
    return len(zygote[0].children()) if zygote else 0


# `service` (unused here) stops every driver of the test's catalog at its end.
def test_a_deploy_adopts_a_warm_spare_replays_exactly_and_keeps_another(
        spare_settings, service, topic, tmp_path: Path) -> None:
    settings = spare_settings
    ours = Orchestrator(settings)
    spare = _spare(settings)
    ours.produce_sample(topic, 20_000, seed=41)

    status = ours.deploy(job_file(tmp_path, "v1", topic)).status
    assert (status.pid, status.attempt) == (spare.pid, 1)
    ours.wait(JOB, "v1", timeout_s=300)
    ref = compute(settings.kafka_bootstrap, topic)
    assert output(settings, f"{JOB}__v1") == ref.v1
    assert dead_letters(settings, f"{JOB}__v1__dead_letters") == ref.invalid_offsets
    log_text = Path(ours.status(JOB)[0].log_path or "").read_text()
    assert f"adopted by {JOB} v1 attempt 1" in log_text
    assert "first batch of the run, ms by phase" in log_text

    # The adopted spare left the pool; the deploy started its replacement.
    directory = spares.spare_dir(settings)
    others = [s for s in spares.spares(directory) if s.pid != spare.pid]
    assert len(others) == 1 and launcher.is_alive(others[0].pid, others[0].started)
    assert not (directory / f"{spare.pid}.json").exists()

    # Its JVM's Python processes (the source runner, the daemons) were forked by its zygote.
    assert _forked_by_zygote(spare.pid) >= 2

    # Stopped, the version's driver (the former spare, JVM and all) is gone.
    ours.stop(JOB, "v1")
    wait_until(lambda: not launcher.is_alive(spare.pid, spare.started), 30, "the driver to end")


def test_a_spare_whose_settings_differ_is_withdrawn_not_adopted(spare_settings, service, topic,
                                                                tmp_path: Path) -> None:
    spare = _spare(spare_settings)
    other = replace(spare_settings, spark_driver_memory="700m")
    env = launcher.driver_environment(other)
    assert spares.fingerprint(other, env) != spare.fingerprint
    ours = Orchestrator(other)
    ours.produce_sample(topic, 2_000, seed=42)

    status = ours.deploy(job_file(tmp_path, "v1", topic)).status
    assert status.pid != spare.pid
    assert not launcher.is_alive(spare.pid, spare.started)
    ours.wait(JOB, "v1", timeout_s=300)
    assert output(other, f"{JOB}__v1") == compute(other.kafka_bootstrap, topic).v1


def test_a_spare_exits_when_idle_or_unwanted_and_leaves_no_files(spare_settings,
                                                                   tmp_path: Path) -> None:
    idle = replace(spare_settings, spare_idle_s=1.0)
    unwanted = replace(spare_settings, state_dir=tmp_path / "gone")
    first, second = _spare(idle, may_idle_out=True), _spare(unwanted)
    directory = spares.spare_dir(idle)
    shutil.rmtree(unwanted.state_dir)  # its deployment is gone: it is not wanted any more
    for spare in (first, second):
        wait_until(lambda s=spare: not launcher.is_alive(s.pid, s.started), 60,
                   f"spare {spare.pid} to exit")
        assert sorted(p.name for p in directory.iterdir()
                      if p.name.startswith(f"{spare.pid}.")) == []
