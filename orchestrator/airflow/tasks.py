"""The first task of every kappa DAG: check the run's conf before anything is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import XComArg, task


def check_conf(kind: str, project_dir: str) -> XComArg:
    """A ``check_conf`` task for a ``reprocess``, ``rollback`` or ``retire`` DAG; later tasks
    read its fields (``request["job"]``). It fails with one line per mistake and no retry
    (AirflowFailException). It keeps the DAG's retries all the same: every later task waits on
    it, and a start that never reached its code (the task's calls to a busy API server timing
    out, its process killed) would otherwise fail the whole run at once."""

    @task(task_id="check_conf", multiple_outputs=True)
    def check(**context: Any) -> dict[str, Any]:
        from orchestrator.airflow.operators import failing_clearly
        from orchestrator.airflow.run_conf import checked

        with failing_clearly():
            return checked(kind, context["dag_run"].conf or {}, Path(project_dir))

    result: XComArg = check()
    return result
