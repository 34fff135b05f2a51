"""`kappa cutover`: a resumable, audited plan; any failed check rolls back and says why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import ROOT, job_file, kappa_cli, wait_until

sys.path.insert(0, str(ROOT))
from bench.switch import prepare

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _plan(settings) -> tuple | None:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(
            "SELECT next_step, status, reason FROM {}.cutover_plans ORDER BY id DESC LIMIT 1")
            .format(sql.Identifier(settings.catalog_schema))).fetchone()


def _v1_serving_v2_ready(settings, topic: str, tmp_path: Path, count: int, seed: int):
    """Its own serving schema; v1 and v2 deployed and caught up; v1 served. Returns
    (settings, service)."""
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, count, seed=seed)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp_path, version, topic))
    prepare(service, JOB)
    return settings, service


def test_cutover_resumes_after_a_crash_and_promotes(service, settings, topic, tmp_path: Path
                                                    ) -> None:
    settings, service = _v1_serving_v2_ready(settings, topic, tmp_path, 10_000, seed=141)
    env = dict(os.environ, **settings.driver_environment())
    args = [str(Path(sys.executable).with_name("kappa")), "cutover", JOB, "v2",
            "--ramp", "10,50,100", "--soak", "4"]
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        # Killed while soaking after the 10 % step.
        wait_until(lambda: (_plan(settings) or (0,))[0] >= 2, 120, "the 10 % step")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert _plan(settings)[1] == "running"
    other = kappa_cli(settings, "cutover", JOB, "v2", "--ramp", "10,100", "--soak", "4")
    assert other.returncode == 1 and "same arguments" in other.stderr
    resumed = kappa_cli(settings, *args[1:], "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "succeeded"
    steps = [(h["action"], h["to"], h["percent"]) for h in service.history(JOB)]
    assert steps == [("promote", "v1", 100), ("ab", "v2", 10), ("ab", "v2", 50),
                     ("promote", "v2", 100)]  # the 10 % step was not repeated
    assert _plan(settings)[:2] == (6, "succeeded")


def test_a_failed_guardrail_or_a_manual_rollback_mid_ramp_ends_the_cutover(
        service, settings, topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ways a ramp ends early, on one pair of drivers: a guardrail failing after a soak,
    then a manual rollback during a soak (v2's guardrail does not get in its way: it is
    checked before the ramp, when v2 serves nothing, and after a soak, which never ends)."""
    import threading

    from orchestrator.errors import KappaError, ServiceUnavailableError
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 5_000, seed=151)
    service.deploy(job_file(tmp_path, "v1", topic))
    # v2 with a guardrail that passes until v2 starts serving, then fails.
    check = (f"SELECT NOT EXISTS (SELECT 1 FROM {settings.catalog_schema}.aliases "
             "WHERE candidate_version = 'v2')")
    source = job_file(tmp_path, "v2", topic).read_text().replace(
        "GUARDRAILS = {", f'GUARDRAILS = {{\n    "v2 not serving yet": "{check}",', 1)
    path = tmp_path / "v2_guarded.py"
    path.write_text(source)
    service.deploy(path)
    prepare(service, JOB)

    # The catalog goes away just as the rollback starts: the plan keeps the failure...
    def unreachable(*_: object, **__: object) -> None:
        raise ServiceUnavailableError("PostgreSQL is unreachable")

    with monkeypatch.context() as patched:
        patched.setattr(service, "rollback", unreachable)
        with pytest.raises(ServiceUnavailableError):
            service.cutover(JOB, "v2", ramp=[10, 100], soak_seconds=1)
    assert service.serving(JOB).candidate == "v2"
    assert _plan(settings)[1] == "running"
    # ...and running it again finishes the rollback instead of resuming the ramp.
    with pytest.raises(KappaError) as info:
        service.cutover(JOB, "v2", ramp=[10, 100], soak_seconds=1)
    message = str(info.value)
    assert "rolled back" in message and "v2 not serving yet" in message
    assert "step 3" in message  # the soak after the 10 % step
    steps = [(h["action"], h["to"]) for h in service.history(JOB)]
    assert steps == [("promote", "v1"), ("ab", "v2"), ("rollback", "v1")]
    assert _plan(settings)[1] == "rolled_back"

    # A manual rollback during a soak ends a new cutover of v2: no later step undoes it.
    failure: list[BaseException] = []

    def cut_over() -> None:
        try:
            Orchestrator(settings).cutover(JOB, "v2", ramp=[10, 50, 100], soak_seconds=60)
        except KappaError as exc:
            failure.append(exc)

    runner = threading.Thread(target=cut_over)
    runner.start()
    wait_until(lambda: (_plan(settings) or (0, "rolled_back"))[:2] == (2, "running"), 120,
               "the 10 % step of the new plan")
    service.rollback(JOB, reason="operator saw a bad dashboard")
    runner.join(60)
    assert not runner.is_alive()
    assert failure and "rolled_back while it ran" in str(failure[0])
    steps = [(h["action"], h["to"]) for h in service.history(JOB)]
    assert steps[3:] == [("ab", "v2"), ("rollback", "v1")]  # no 50 % step after
    assert _plan(settings)[1:] == ("rolled_back", "operator saw a bad dashboard")
