"""Roll a job's alias back to the version it served before: one button, recorded in the alias
history with this run's id.

Trigger with a conf, e.g. {"job": "pageview_counts"} (optionally "alias", "reason", and
"force": true to go back to a version that is stopped or failed, recorded as forced).
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from orchestrator.airflow.operators import KappaRollbackOperator
from orchestrator.airflow.tasks import check_conf

PROJECT_DIR = os.environ.get("KAPPA_PROJECT_DIR") or str(Path(__file__).resolve().parents[1])

with DAG(
    dag_id="kappa_rollback",
    description="Serve a job's previous version again",
    schedule=None,
    catchup=False,
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"project_dir": PROJECT_DIR},
    params={
        "job": Param(type="string"),
        "alias": Param(None, type=["null", "string"], description="default: the job name"),
        "reason": Param(None, type=["null", "string"]),
        "force": Param(False, type="boolean",
                       description="roll back even to a version that is stopped or failed"),
    },
) as dag:
    request = check_conf("rollback", PROJECT_DIR)
    KappaRollbackOperator(task_id="rollback", job=request["job"], alias=request["alias"],
                          reason=request["reason"], force=request["force"])
