"""Reprocess a job from the log: deploy a new version, wait for it to catch up (deferred, no
worker slot held), validate it against the served version, ramp the alias with soaks and
checks, promote, and optionally retire the previous version.

Trigger with a conf, e.g.
    {"job_file": "jobs/pageview_counts/v2.py", "ramp": [10, 50, 100], "soak_seconds": 60,
     "max_lag": 0, "retire_previous": false}
("priority": N places it in the replay queue when every replay slot is taken, as `kappa deploy
--priority`; the catch-up wait covers the time it is queued), or, to judge the new version by
its readers' outcomes (`kappa cutover --strategy`'s options,
named as its flags are: start_percent, min_percent, max_percent, max_step, look_seconds,
max_duration, no_data_timeout, alpha, mixture_sd, min_per_arm, attribution_delay,
pre_period, allow_non_inferior):
    {"job_file": "jobs/pageview_counts/v2.py", "strategy": "bandit", "metrics": ["converts"],
     "look_seconds": 60, "max_duration": 86400}
The outcome test defers between its looks, holding no worker slot.
Any failed check rolls the alias back and fails the run with what failed. Connections:
``kappa_postgres`` (the catalog) and ``kappa_kafka`` (the broker).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from orchestrator.airflow.operators import (
    KappaCutoverOperator,
    KappaDeployOperator,
    KappaRetireOperator,
    KappaRollbackOperator,
    KappaValidateOperator,
)
from orchestrator.airflow.sensors import KappaCaughtUpSensor
from orchestrator.airflow.tasks import check_conf

# Relative job files resolve against the project holding this dags/ folder.
PROJECT_DIR = os.environ.get("KAPPA_PROJECT_DIR") or str(Path(__file__).resolve().parents[1])

with DAG(
    dag_id="kappa_reprocess",
    description="Replay a new job version from the log, validate, ramp and promote it",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30),
                  "project_dir": PROJECT_DIR},
    params={
        "job_file": Param(type="string", description="job file, relative to the project"),
        "ramp": Param([10, 50, 100], type="array", items={"type": "integer"},
                      description="percent of keys served by the new version, step by step"),
        "soak_seconds": Param(60, type="number", minimum=0),
        "max_lag": Param(0, type="integer", minimum=0,
                         description="records behind the log end that count as caught up"),
        "retire_previous": Param(False, type="boolean"),
        "alias": Param(None, type=["null", "string"], description="default: the job name"),
        "catch_up_timeout_minutes": Param(720, type="number", minimum=0),
        "strategy": Param(None, type=["null", "string"], enum=[None, "ab", "bandit"],
                          description="test by the readers' outcomes instead of the ramp"),
        "metrics": Param([], type="array", items={"type": "string"},
                         description="outcome metrics (kappa metric define), with strategy"),
        "breaking": Param(False, type="boolean",
                          description="allow a split whose version removes or retypes columns"),
        "allow_incompatible": Param(
            False, type="boolean", description="deploy an Avro reader schema that cannot read "
            "some of the log's writer schemas: their records go to the dead-letter table"),
        "priority": Param(0, type="integer", minimum=-1000, maximum=1000,
                          description="its place in the replay queue when every replay slot "
                                      "is taken: higher replays first"),
    },
) as dag:
    request = check_conf("reprocess", PROJECT_DIR)
    deploy = KappaDeployOperator(task_id="deploy", job_file=request["job_file"],
                                 expect_version=request["version"],
                                 expect_fingerprint=request["fingerprint"],
                                 priority=request["priority"],
                                 allow_incompatible=request["allow_incompatible"])
    wait = KappaCaughtUpSensor(
        task_id="wait_caught_up", job=request["job"], version=request["version"],
        max_lag=request["max_lag"], max_wait_minutes=request["catch_up_timeout_minutes"])
    # The DAG's retries: a failed check fails at once (AirflowFailException); a start that
    # timed out, or a service away, is tried again.
    validate = KappaValidateOperator(task_id="validate", job=request["job"],
                                     version=request["version"], alias=request["alias"])
    cutover = KappaCutoverOperator(
        task_id="ramp_and_promote", job=request["job"], version=request["version"],
        ramp=request["ramp"], soak_seconds=request["soak_seconds"], alias=request["alias"],
        experiment=request["experiment"], breaking=request["breaking"], retries=1)
    retire = KappaRetireOperator(
        task_id="retire_previous", job=request["job"], enabled=request["retire_previous"],
        version="{{ ti.xcom_pull(task_ids='ramp_and_promote')['previous'] }}")
    # A safety net for a ramp task that was killed, timed out or stopped with the run before it
    # could roll back by itself: a teardown, so it runs whatever happened upstream (and does
    # nothing when no cutover is left unfinished). Jinja, not XComArgs: a failed check_conf
    # leaves no XCom.
    roll_back = KappaRollbackOperator(
        task_id="roll_back_unfinished", reason="reprocess run did not finish", retries=3,
        job="{{ ti.xcom_pull(task_ids='check_conf', key='job') or '' }}",
        version="{{ ti.xcom_pull(task_ids='check_conf', key='version') or '' }}",
        alias="{{ ti.xcom_pull(task_ids='check_conf', key='alias') or '' }}",
    ).as_teardown(setups=request.operator, on_failure_fail_dagrun=True)

    deploy >> wait >> validate >> cutover >> retire
    cutover >> roll_back
