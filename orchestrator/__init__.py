"""Kappa-architecture reprocessing orchestrator.

Replays versioned PySpark jobs from the start of the log into new PostgreSQL tables, exactly
once, beside the running version. The public API is exactly ``__all__``.
"""

from orchestrator.errors import KappaError
from orchestrator.jobspec import load_job_file
from orchestrator.models import JobSpec, VersionStatus
from orchestrator.service import DeployResult, Orchestrator
from orchestrator.settings import Settings, load_settings
from orchestrator.states import RunState

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
