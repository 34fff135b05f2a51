"""Retire a version that no alias serves: stop its driver and mark it retired; with "drop",
also drop its output and dead-letter tables and its checkpoint.

Trigger with a conf, e.g. {"job": "pageview_counts", "version": "v1", "drop": false}.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from orchestrator.airflow.operators import KappaRetireOperator
from orchestrator.airflow.tasks import check_conf

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
    request = check_conf("retire", PROJECT_DIR)
    KappaRetireOperator(task_id="retire", job=request["job"], version=request["version"],
                        drop=request["drop"])
