"""Roll a job's alias back to the version it served before: one button, recorded in the alias
history with this run's id.

Trigger with a conf, e.g. {"job": "pageview_counts"} (optionally "alias" and "reason").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, task

from orchestrator.airflow.operators import KappaRollbackOperator

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
    },
) as dag:

    @task(multiple_outputs=True)
    def check_conf(**context: Any) -> dict[str, object]:
        from dataclasses import asdict

        from orchestrator.airflow.operators import failing_clearly
        from orchestrator.airflow.run_conf import parse_rollback

        with failing_clearly():
            return asdict(parse_rollback(context["dag_run"].conf or {}))

    request = check_conf()
    KappaRollbackOperator(task_id="rollback", job=request["job"], alias=request["alias"],
                          reason=request["reason"])
