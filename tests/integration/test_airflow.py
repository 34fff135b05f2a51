"""The Airflow DAGs against a real Airflow 3 and the real stack (Tansu, PostgreSQL, Spark)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import ROOT, job_file, wait_until
from integration.airflow_env import (
    SECRET,
    airflow,
    airflow_env,
    api,
    dags_test,
    migrate,
    standalone,
    token,
)
from integration.helpers import output
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.airflow]
JOB = "pageview_counts"
DAGS = {"kappa_reprocess", "kappa_rollback", "kappa_retire"}
DRIVERS = {"psycopg", "confluent_kafka", "pyspark", "pandas", "pyarrow", "orchestrator.service"}


def test_every_dag_loads_quickly_and_cleanly(settings, tmp_path: Path) -> None:
    env = airflow_env(settings, tmp_path / "airflow", tmp_path)
    migrate(env)
    # --local: parse dags/ now, rather than read what a DAG processor stored.
    errors = airflow(env, "dags", "list-import-errors", "--local", "-o", "json")
    assert errors.returncode == 0, errors.stderr[-2000:]
    assert json.loads(errors.stdout.strip().splitlines()[-1]) == []
    # Parse each file as the DAG processor does, after Airflow itself is loaded and has built
    # a DAG of its own (which loads what any DAG needs), and note what the files import.
    probe = f"""
import json, runpy, sys
import airflow.sdk
from airflow.sdk import DAG, task
with DAG("probe_baseline", schedule=None):
    @task
    def baseline():
        pass
    baseline()
loaded = set(sys.modules)
found, retries, params = {{}}, {{}}, {{}}
for path in sorted(__import__("pathlib").Path({str(ROOT / "dags")!r}).glob("*.py")):
    namespace = runpy.run_path(str(path))
    for value in namespace.values():
        if isinstance(value, DAG):
            found[value.dag_id] = sorted(value.task_ids)
            retries[value.dag_id] = {{t.task_id: t.retries for t in value.tasks}}
            params[value.dag_id] = sorted(value.params)
drivers = sorted(m for m in {sorted(DRIVERS)!r} if m in sys.modules)
heavy = sorted(m for m in set(sys.modules) - loaded
               if m.split(".")[0] not in {{*sys.stdlib_module_names, "orchestrator"}}
               and m != "airflow.sdk" and not m.startswith("airflow.sdk."))
print(json.dumps({{"dags": found, "retries": retries, "params": params, "drivers": drivers,
                  "heavy": heavy}}))
"""
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, check=True, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["dags"]) == DAGS
    assert result["dags"]["kappa_reprocess"] == [
        "check_conf", "deploy", "ramp_and_promote", "retire_previous", "roll_back_unfinished",
        "validate", "wait_caught_up"]
    # The first task keeps the DAG's retries: under load a task's start can fail before its
    # code runs (its calls to the API server time out), and with none it failed every later
    # task (upstream_failed). A mistake in the conf still fails at once (AirflowFailException).
    checks = {t: result["retries"]["kappa_reprocess"][t] for t in ("check_conf", "validate")}
    assert checks == {"check_conf": 2, "validate": 2}, result["retries"]
    assert result["drivers"] == []  # database, broker and Spark load when a task runs
    # The trigger form offers every key of the conf but the outcome test's options (priority
    # among them, the place in the replay queue).
    from orchestrator.airflow.run_conf import REPROCESS_DEFAULTS

    assert result["params"]["kappa_reprocess"] == sorted({"job_file", *REPROCESS_DEFAULTS})
    # Parsing stays far under Airflow's dagbag_import_timeout (30 s), however loaded the
    # machine, because the files import nothing heavy: beyond what Airflow had loaded for a
    # DAG of its own, only the standard library, Airflow's task SDK and the project's own
    # modules (whose third-party imports would show here too).
    assert result["heavy"] == [], result["heavy"]


def _prepared(settings, topic: str, tmp_path: Path, count: int, seed: int, versions: tuple
              ) -> tuple:
    """A serving schema of its own, an Airflow home, a log and job files in a project.
    Returns (settings, service, project, airflow environment)."""
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    project = tmp_path / "project"
    env = airflow_env(settings, tmp_path / "airflow", project)
    migrate(env)
    service.produce_sample(topic, count, seed=seed)
    for version in versions:
        job_file(project, version, topic)
    return settings, service, project, env


def _alias(settings) -> dict:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT url, views, total_duration_ms FROM {}.{}").format(
            sql.Identifier(settings.serving_schema), sql.Identifier(JOB))).fetchall()
    return {url: (views, total) for url, views, total in rows}


def _guard_v2(project: Path, catalog_schema: str) -> None:
    """v2 with a guardrail that passes until v2 serves again after a rollback, then fails."""
    check = (f"SELECT NOT EXISTS (SELECT 1 FROM {catalog_schema}.aliases "
             "WHERE candidate_version = 'v2') OR NOT EXISTS (SELECT 1 FROM "
             f"{catalog_schema}.alias_history WHERE action = 'rollback')")
    path = project / "jobs" / "pageview_counts_v2.py"
    source = path.read_text().replace(
        "GUARDRAILS = {", f'GUARDRAILS = {{\n    "v2 not back after a rollback": "{check}",', 1)
    assert "v2 not back after a rollback" in source
    path.write_text(source)


@pytest.mark.spark
def test_reprocess_promotes_and_a_failing_guardrail_rolls_back(settings, topic, tmp_path: Path
                                                              ) -> None:
    settings, service, project, env = _prepared(settings, topic, tmp_path, 10_000, 171,
                                                ("v1", "v2"))
    # The failing run re-triggers v2 after the rollback: a new version would cost a driver,
    # and what a guardrail failing at step 3 does in the plan is test_cutover's.
    _guard_v2(project, settings.catalog_schema)
    outputs: list[str] = []
    try:
        # The first version of a job: nothing to validate against, promoted as is.
        first, _ = dags_test(env, "kappa_reprocess", {
            "job_file": "jobs/pageview_counts_v1.py", "ramp": [100], "soak_seconds": 0})
        outputs.append(first.stdout + first.stderr)
        assert first.returncode == 0, first.stdout[-4000:]

        conf = {"job_file": "jobs/pageview_counts_v2.py", "ramp": [10, 50, 100],
                "soak_seconds": 2, "max_lag": 0, "retire_previous": False}
        second, run_id = dags_test(env, "kappa_reprocess", conf)
        outputs.append(second.stdout + second.stderr)
        assert second.returncode == 0, second.stdout[-4000:]
        assert "new_state=deferred" in second.stdout + second.stderr  # the catch-up wait
        reference = compute(settings.kafka_bootstrap, topic)
        assert _alias(settings) == reference.v2 == output(settings, f"{JOB}__v2")
        history = service.history(JOB)
        assert [(h["action"], h["to"], h["percent"]) for h in history] == [
            ("promote", "v1", 100), ("ab", "v2", 10), ("ab", "v2", 50), ("promote", "v2", 100)]
        assert all(f"airflow {run_id}" in h["who"] for h in history[1:])
        assert {e["kind"] for e in service.events(JOB, "v2") if run_id in e["actor"]} >= {
            "deploy", "validation", "alias_ab", "alias_promote"}

        # Run again, as a retry or a re-trigger would: nothing is deployed or switched twice.
        again, _ = dags_test(env, "kappa_reprocess", conf)
        outputs.append(again.stdout + again.stderr)
        assert again.returncode == 0, again.stdout[-4000:]
        assert [e["kind"] for e in service.events(JOB, "v2")].count("deploy") == 1
        assert service.version_status(JOB, "v2").attempt == 1
        assert len(service.history(JOB)) == 4

        back, _ = dags_test(env, "kappa_rollback", {"job": JOB})
        outputs.append(back.stdout + back.stderr)
        assert back.returncode == 0, back.stdout[-4000:]
        assert _alias(settings) == reference.v1

        # A re-trigger of v2 after the rollback: deployed already, so nothing is deployed;
        # its guardrail fails after the 10 % step's soak, the ramp task rolls back and fails
        # the run with why.
        failed, failed_run = dags_test(env, "kappa_reprocess", {
            "job_file": "jobs/pageview_counts_v2.py", "ramp": [10, 100], "soak_seconds": 1})
        text = failed.stdout + failed.stderr
        outputs.append(text)
        assert failed.returncode != 0
        assert "DagRun failed" in text or "state=failed" in text
        assert re.search(r"rolled back; step 3 \(soak 1s\) failed: .*v2 not back after a "
                         "rollback", text)
        serving = service.serving(JOB)
        assert (serving.primary, serving.candidate) == ("v1", None)
        history = service.history(JOB)
        assert [(h["action"], h["to"]) for h in history[4:]] == [
            ("rollback", "v1"), ("ab", "v2"), ("rollback", "v1")]
        assert f"airflow {failed_run}" in history[-1]["who"]
        assert _alias(settings) == reference.v1
        assert [e["kind"] for e in service.events(JOB, "v2")].count("deploy") == 1
        # No driver's command line holds the password (checked while v1 and v2 both run).
        running = {st.version: st.pid for st in service.status(JOB) if st.pid}
        assert set(running) == {"v1", "v2"}, service.status(JOB)
        for pid in running.values():
            assert SECRET not in Path(f"/proc/{pid}/cmdline").read_text()

        retired, _ = dags_test(env, "kappa_retire", {"job": JOB, "version": "v2",
                                                     "drop": True})
        outputs.append(retired.stdout + retired.stderr)
        assert retired.returncode == 0, retired.stdout[-4000:]
        assert service.version_status(JOB, "v2").state.value == "retired"

        # The connection's password is nowhere: not in task output, Airflow's database (XCom,
        # trigger arguments), our catalog, or a driver's command line.
        assert not [o for o in outputs if SECRET in o]
        leaked = [str(p) for p in Path(env["AIRFLOW_HOME"]).rglob("*")
                  if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert leaked == []
        assert SECRET not in json.dumps(service.events(JOB), default=str)
    finally:
        service.stop_all()


@pytest.mark.spark
def test_standalone_airflow_defers_the_catch_up_and_rolls_back_a_stopped_run(
        settings, topic, tmp_path: Path) -> None:
    settings, service, _, env = _prepared(settings, topic, tmp_path, 50_000, 181,
                                          ("v1", "v2"))
    try:
        with standalone(env) as url:
            tok = token(url, Path(env["AIRFLOW_HOME"]))
            wait_until(lambda: _dag_known(url, tok), 120, "the DAG processor to load the DAG")
            run = api(url, tok, "/dags/kappa_reprocess/dagRuns", {
                "logical_date": None,
                "conf": {"job_file": "jobs/pageview_counts_v1.py", "ramp": [100],
                         "soak_seconds": 0}})
            path = f"/dags/kappa_reprocess/dagRuns/{run['dag_run_id']}"
            seen: list[str] = []
            stalls = [0]  # status reads that found the API server too busy to answer

            def finished() -> str | None:
                try:
                    state = api(url, tok, f"{path}/taskInstances/wait_caught_up").get("state")
                    done = api(url, tok, path)["state"]
                except (TimeoutError, urllib.error.URLError) as exc:
                    if not isinstance(getattr(exc, "reason", exc), TimeoutError):
                        raise
                    # One API worker on SQLite, on two cores that the suite keeps busy: a read
                    # once waited over 30 s. The run's own deadline still bounds the wait.
                    stalls[0] += 1
                    return None
                if state and (not seen or seen[-1] != state):
                    seen.append(state)
                return done if done in ("success", "failed") else None

            try:
                final = wait_until(finished, 480, "the run to finish", poll_s=0.5)
            except AssertionError as exc:
                raise AssertionError(f"{exc} ({stalls[0]} status reads timed out)") from exc
            logs = (Path(env["AIRFLOW_HOME"]) / "standalone.out").read_text()
            assert final == "success", (seen, stalls[0], logs[-4000:])
            assert "deferred" in seen, seen  # no worker slot held during the replay
            assert seen[-1] == "success"
            assert service.serving(JOB).primary == "v1"
            assert service.version_status(JOB, "v1").caught_up()

            # Stopping a run half-way through its ramp (marking it failed) rolls back.
            second = api(url, tok, "/dags/kappa_reprocess/dagRuns", {
                "logical_date": None,
                "conf": {"job_file": "jobs/pageview_counts_v2.py", "ramp": [10, 100],
                         "soak_seconds": 600}})
            wait_until(lambda: service.serving(JOB).candidate == "v2", 480,
                       "the 10 % step of v2")
            api(url, tok, f"/dags/kappa_reprocess/dagRuns/{second['dag_run_id']}",
                {"state": "failed"}, method="PATCH")
            # The rollback's switch commits first, then the plan is marked rolled back.
            wait_until(lambda: service.serving(JOB).candidate is None
                       and service.cutover_in_progress(JOB) is None, 120,
                       "the ramp to be rolled back and its plan closed")
            assert service.serving(JOB).primary == "v1"
            last = service.history(JOB)[-1]
            assert (last["action"], last["to"]) == ("rollback", "v1")
    finally:
        service.stop_all()


def _dag_known(url: str, tok: str) -> bool:
    try:
        return api(url, tok, "/dags/kappa_reprocess")["dag_id"] == "kappa_reprocess"
    except OSError:
        return False
