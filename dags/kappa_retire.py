"""Retire a version that no alias serves: stop its driver and mark it retired; with "drop",
also drop its output and dead-letter tables and its checkpoint.

Trigger with a conf, e.g. {"job": "pageview_counts", "version": "v1", "drop": false}.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, task

from orchestrator.airflow.operators import KappaRetireOperator

PROJECT_DIR = os.environ.get("KAPPA_PROJECT_DIR") or str(Path(__file__).resolve().parents[1])

with DAG(
    dag_id="kappa_retire",
    description="Stop and retire a job version that nothing serves",
    schedule=None,
    catchup=False,
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"project_dir": PROJECT_DIR},
    params={
        "job": Param(type="string"),
        "version": Param(type="string"),
        "drop": Param(False, type="boolean", description="also drop its tables"),
    },
) as dag:

    @task(multiple_outputs=True)
    def check_conf(**context: Any) -> dict[str, object]:
        from dataclasses import asdict

        from orchestrator.airflow.operators import failing_clearly
        from orchestrator.airflow.run_conf import parse_retire

        with failing_clearly():
            return asdict(parse_retire(context["dag_run"].conf or {}))

    request = check_conf()
    KappaRetireOperator(task_id="retire", job=request["job"], version=request["version"],
                        drop=request["drop"])
