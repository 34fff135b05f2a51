"""Launching and stopping a version's driver; what deploying.py and restarting.py share."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.catalog import runs, versions
from orchestrator.catalog.access import CatalogAccess
from orchestrator.errors import (
    StateError,
)
from orchestrator.models import (
    VersionStatus,
)
from orchestrator.settings import Settings
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState
from orchestrator.versions import reporting
from orchestrator.versions.reporting import _job, _version


@dataclass(frozen=True)
class DeployResult:
    created: bool  # False: the same code was already deployed under this label (a no-op)
    status: VersionStatus
    # Constructs that make the output at rest depend on where batches were cut (file:line: why)
    warnings: tuple[str, ...] = ()


def keep_spares(catalog: CatalogAccess) -> int | None:
    return launcher.keep_spare(catalog.settings)


def stop(catalog: CatalogAccess, job: str, version: str) -> VersionStatus:
    s = catalog.settings
    with catalog.connection() as conn:
        deployed = versions.get(conn, s.catalog_schema, _job(job), _version(version))
        with conn.transaction():
            run = runs.get(conn, s.catalog_schema, deployed.id, for_update=True)
            if run.state in (RunState.STOPPED, RunState.RETIRED, RunState.REGISTERED):
                raise StateError(f"{job} {version} is already {run.state.value}: nothing to "
                                 "stop")
            runs.change_state(conn, s.catalog_schema, deployed, RunState.STOPPED,
                              reason="stopped by `kappa stop`", expected=run.as_seen())
        launcher.stop_driver(run)
        return reporting.status_of(catalog, conn, deployed)


def stop_all(catalog: CatalogAccess) -> list[VersionStatus]:
    """Stop every version whose driver should be running (before the services go away)."""
    return [stop(catalog, st.job, st.version) for st in reporting.status(catalog)
            if st.state.is_active]


def checkpoint_location(settings: Settings, job: str, version: str) -> str:
    from orchestrator.spark.checkpoint import is_local, local_path

    root = settings.checkpoint_root or str(settings.state_dir / "checkpoints")
    if is_local(root):
        return str((local_path(root) / job / version).resolve())
    return f"{root.rstrip('/')}/{job}/{version}"
