"""Kappa-architecture reprocessing orchestrator.

Replays versioned PySpark jobs from the start of the log into new PostgreSQL tables, exactly
once, beside the running version. The public API is exactly ``__all__``.

Names are imported on first use, so that importing a subpackage (as Airflow does when it parses
a DAG file that names our operators) does not load the database and broker drivers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.errors import KappaError
    from orchestrator.jobspec import load_job_file
    from orchestrator.models import JobSpec, VersionStatus
    from orchestrator.service import DeployResult, Orchestrator
    from orchestrator.settings import Settings, load_settings
    from orchestrator.states import RunState

_HOMES = {
    "DeployResult": "orchestrator.service",
    "JobSpec": "orchestrator.models",
    "KappaError": "orchestrator.errors",
    "Orchestrator": "orchestrator.service",
    "RunState": "orchestrator.states",
    "Settings": "orchestrator.settings",
    "VersionStatus": "orchestrator.models",
    "load_job_file": "orchestrator.jobspec",
    "load_settings": "orchestrator.settings",
}

__all__ = [
    "DeployResult",
    "JobSpec",
    "KappaError",
    "Orchestrator",
    "RunState",
    "Settings",
    "VersionStatus",
    "load_job_file",
    "load_settings",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
