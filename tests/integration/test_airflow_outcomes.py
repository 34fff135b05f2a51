"""`kappa_reprocess` with an outcome conf: the DAG's cutover task runs the bandit test, deferring
between its looks (no worker slot held while it waits), and promotes a candidate 20 % better."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, kappa_cli
from integration.airflow_env import airflow_env, dags_test, migrate
from integration.outcome_readers import Application, create_outcomes_table, shared_keys

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.spark]
JOB = "pageview_counts"


def test_reprocess_with_a_bandit_conf_defers_between_looks_and_promotes(
        settings, topic, tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator

    tag = uuid.uuid4().hex[:8]
    settings = replace(settings, serving_schema=f"serving_{tag}",
                       alias_version_column="served_by")
    service = Orchestrator(settings)
    project = tmp_path / "project"
    env = airflow_env(settings, tmp_path / "airflow", project)
    migrate(env)
    service.produce_sample(topic, 4_000, seed=231)
    for version in ("v1", "v2"):
        job_file(project, version, topic)
    schema = f"app_{tag}"
    create_outcomes_table(settings.pg_dsn, schema)
    try:
        first, _ = dags_test(env, "kappa_reprocess", {
            "job_file": "jobs/pageview_counts_v1.py", "ramp": [100], "soak_seconds": 0})
        assert first.returncode == 0, first.stdout[-4000:]
        defined = kappa_cli(settings, "metric", "define", JOB, "converts", "--sql",
                            f"SELECT key, converted AS value, observed_at FROM {schema}.outcomes"
                            " WHERE observed_at >= {since}", "--kind", "proportion", "--better",
                            "higher", "--role", "decision")
        assert defined.returncode == 0, defined.stderr
        # v2 is deployed and caught up before the run (the DAG's deploy finds it so), so that
        # the readers draw only keys that both versions serve.
        service.deploy(project / "jobs" / "pageview_counts_v2.py")
        service.wait(JOB, "v2", timeout_s=600)
        keys = shared_keys(settings, "v1", "v2")
        assert len(keys) >= 50, keys

        conf = {"job_file": "jobs/pageview_counts_v2.py", "strategy": "bandit",
                "metrics": ["converts"], "start_percent": 20, "min_percent": 10,
                "max_percent": 60, "max_step": 20, "look_seconds": 2, "min_per_arm": 200,
                "mixture_sd": 0.2, "max_duration": 600}
        app = Application(settings, schema, keys, {"v1": 0.30, "v2": 0.36},
                          {"v1": 0.05, "v2": 0.05}, seed=23)
        app.start()
        try:
            run, run_id = dags_test(env, "kappa_reprocess", conf)
        finally:
            app.stop()
        text = run.stdout + run.stderr
        assert run.returncode == 0, text[-6000:]
        assert "new_state=deferred" in text or "TaskDeferred" in text, text[-6000:]

        assert service.serving(JOB).primary == "v2"
        found = service.outcomes.experiment(JOB)
        # The cutover task gave its slot back between looks, and came back for each: one look
        # per resume, however late the loaded machine resumed it (and so however few looks the
        # test needed to decide).
        deferrals = text.count("the next look is due at")
        taken = [(look["look"], look["at"]) for look in found["looks"]]
        assert deferrals >= len(taken) - 1 >= 1, (deferrals, taken)
        assert found["status"] == "succeeded" and found["verdict"] == "promote", found
        # Promoted on its evidence, before the deadline: a promote at --max-duration (the
        # policy's default, "at the deadline: every metric non-inferior ...") would pass the
        # verdict too.
        assert found["looks"][-1]["reason"] == "converts better than the baseline", taken
        assert (found["looks"][-1]["at"] - found["looks"][0]["at"]).total_seconds() < 600
        assert found["design"]["strategy"] == "bandit" and found["design"]["look_seconds"] == 2
        history = service.history(JOB)
        v2_steps = [(h["action"], h["percent"]) for h in history if h["to"] == "v2"]
        assert v2_steps[0] == ("ab", 20) and v2_steps[-1] == ("promote", 100), v2_steps
        assert all(f"airflow {run_id}" in h["who"] for h in history if h["to"] == "v2")
        # The bandit's steps between the start and the promote, each with the posterior behind
        # it. How many there are is the machine's timing: a slow one may gather enough for a
        # decision before any look has moved the share (a chance failure of `assert moved`).
        steps = [h for h in history if h["to"] == "v2"][1:-1]
        assert all(h["reason"] and "P(candidate better)" in h["reason"] for h in steps), history
        status = json.loads(kappa_cli(settings, "experiment", JOB, "--json").stdout)
        assert status["plan"] == found["plan"] and status["verdict"] == "promote"
    finally:
        service.stop_all()
