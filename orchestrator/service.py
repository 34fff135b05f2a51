"""The facade that the CLI, the Airflow DAGs and Python callers use: one entry point that
delegates each capability to its module."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Unpack

import psycopg

from orchestrator.archive import archiving
from orchestrator.archive_model.deletion import Deletion
from orchestrator.catalog.access import CatalogAccess
from orchestrator.desks.outcomes import OutcomeDesk
from orchestrator.desks.switches import SwitchDesk
from orchestrator.experiment.design import ExperimentDesign
from orchestrator.lag import Thresholds
from orchestrator.models import AliasState, VersionLag, VersionStatus
from orchestrator.plan.cutover import Cutover
from orchestrator.replay_queue.desk import ReplayDesk
from orchestrator.samples import sample_data
from orchestrator.samples.sample_data import SampleOptions
from orchestrator.serving.diff import DiffReport
from orchestrator.serving.switching import Switchboard
from orchestrator.settings import Settings, load_settings
from orchestrator.versions import deploying, lifecycle, reporting, restarting
from orchestrator.versions.lifecycle import DeployResult, checkpoint_location
from orchestrator.versions.reporting import CRASHED, Progress

Acknowledged = Mapping[str, Mapping[int, int]] | None  # a lost broker's acknowledged ends

__all__ = ["CRASHED", "DeployResult", "Orchestrator", "Progress", "checkpoint_location"]


class Orchestrator:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or load_settings()
        self.catalog = CatalogAccess(self.settings)
        self.switches, self.outcomes, self.replays = (
            SwitchDesk(self.catalog), OutcomeDesk(self.catalog), ReplayDesk(self.catalog))

    def _catalog(self) -> AbstractContextManager[psycopg.Connection]:  # for tools and tests
        return self.catalog.connection()

    def _switching(self) -> AbstractContextManager[Switchboard]:  # on the switches' connection
        return self.switches.switching()

    def close(self) -> None:
        """Close the connection kept for switches (the service stays usable: it reopens it)."""
        self.catalog.close()

    # Deploying and controlling ---------------------------------------------------------------
    def deploy(self, job_file: str | Path, *, allow_gap: bool = False, priority: int | str = 0,
               allow_incompatible: bool = False) -> DeployResult:
        return deploying.deploy(self.catalog, self.switches, job_file, allow_gap, priority,
                                allow_incompatible)

    def stop(self, job: str, version: str) -> VersionStatus:
        return lifecycle.stop(self.catalog, job, version)

    def stop_all(self) -> list[VersionStatus]:
        return lifecycle.stop_all(self.catalog)

    def keep_spares(self) -> int | None:
        """Start a warm spare driver if this host keeps fewer than warm_spares; its PID."""
        return lifecycle.keep_spares(self.catalog)

    def restart(self, job: str, version: str, *, allow_gap: bool = False,
                quarantine: bool = False) -> VersionStatus:
        return restarting.restart(self.catalog, job, version, allow_gap, quarantine)

    # Reporting -----------------------------------------------------------------------------
    def status(self, job: str | None = None, *, exact_rows: bool = True) -> list[VersionStatus]:
        return reporting.status(self.catalog, job, exact_rows=exact_rows)

    def version_status(self, job: str, version: str) -> VersionStatus:
        return reporting.version_status(self.catalog, job, version)

    def wait(self, job: str, version: str, *, timeout_s: float | None = None,
             max_lag: int = 0, progress: Progress | None = None, poll_s: float = 1.0,
             limits: Thresholds | None = None) -> VersionStatus:
        return reporting.wait(self.catalog, job, version, timeout_s=timeout_s, max_lag=max_lag,
                              progress=progress, poll_s=poll_s, limits=limits)

    def catch_up_progress(self, job: str, version: str, *, max_lag: int = 0,
                          check_stall: bool = True, limits: Thresholds | None = None
                          ) -> VersionStatus:
        return reporting.catch_up_progress(self.catalog, job, version, max_lag=max_lag,
                                           check_stall=check_stall, limits=limits)

    def lag(self, job: str | None = None, version: str | None = None,
            limits: Thresholds | None = None) -> list[VersionLag]:
        return reporting.lag(self.catalog, job, version, limits)

    def crashed_drivers(self) -> list[tuple[str, str, int, str]]:
        return reporting.crashed_drivers(self.catalog)

    def record_event(self, kind: str, job: str, version: str, **detail: Any) -> None:
        reporting.record_event(self.catalog, kind, job, version, **detail)

    def events(self, job: str | None = None, version: str | None = None, *, limit: int = 1000
               ) -> list[dict[str, object]]:
        return reporting.list_events(self.catalog, job, version, limit)

    # Aliases -------------------------------------------------------------------------------
    def promote(self, job: str, version: str, alias: str | None = None, *, force: bool = False,
                reason: str | None = None) -> dict[str, Any]:
        return self.switches.promote(job, version, alias, force=force, reason=reason)

    def ab(self, job: str, version: str, percent: int, alias: str | None = None, *,
           reason: str | None = None, breaking: bool = False) -> dict[str, Any]:
        return self.switches.ab(job, version, percent, alias, reason=reason, breaking=breaking)

    def rollback(self, job: str, alias: str | None = None, *, reason: str | None = None,
                 force: bool = False) -> dict[str, Any]:
        return self.switches.rollback(job, alias, reason=reason, force=force)

    def aliases(self) -> list[AliasState]:
        return self.switches.aliases()

    def serving(self, job: str, alias: str | None = None) -> AliasState | None:
        return self.switches.serving(job, alias)

    def history(self, job: str, alias: str | None = None) -> list[dict[str, Any]]:
        return self.switches.history(job, alias)

    def diff(self, job: str, version_a: str, version_b: str) -> DiffReport:
        return self.switches.diff(job, version_a, version_b)

    def retire(self, job: str, version: str, *, drop: bool = False) -> dict[str, Any]:
        return self.switches.retire(job, version, drop=drop)

    def cutover(self, job: str, version: str, *, ramp: list[int], soak_seconds: float,
                alias: str | None = None, say: Callable[[str], None] | None = None,
                experiment: ExperimentDesign | None = None, pausing: bool = False,
                breaking: bool = False) -> dict[str, Any]:
        """Ramp with soaks, or test an ``experiment`` by outcomes (``pausing``: may wait)."""
        plan = Cutover(self, job, version, alias, say or (lambda _: None), pausing=pausing,
                       breaking=breaking)
        return plan.run_experiment(experiment) if experiment else plan.run(ramp, soak_seconds)

    def abort_cutover(self, job: str, version: str, *, reason: str, alias: str | None = None
                      ) -> int | None:
        return Cutover(self, job, version, alias, lambda _: None).abort(reason)

    def cutover_in_progress(self, job: str, alias: str | None = None) -> dict[str, Any] | None:
        return self.switches.cutover_in_progress(job, alias)

    # The archive of the log ----------------------------------------------------------------
    def archive(self, topics: Sequence[str] = (), *, once: bool = False,
                interval_s: float = 5.0, on_segment: Callable[[Any], None] = lambda _: None,
                stop: Callable[[], bool] = lambda: False, all_topics: bool = False) -> int:
        return archiving.archive(self.catalog, topics, once=once, interval_s=interval_s,
                                 on_segment=on_segment, stop=stop, all_topics=all_topics)

    def archive_verify(self, topics: Sequence[str] = (), redecode: int | None = None) -> Any:
        return archiving.verify(self.catalog, topics, redecode)

    def archive_status(self, topics: Sequence[str] = ()) -> list[Any]:
        return archiving.status(self.catalog, topics)

    def archive_decodings(self, *, prune: bool = False, dry_run: bool = False) -> list[Any]:
        return archiving.decodings(self.catalog, prune=prune, dry_run=dry_run)

    def archive_restore(self, topics: Sequence[str] = (), acknowledged: Acknowledged = None,
                        deleted: Mapping[str, Deletion] | None = None) -> Any:
        return archiving.restore(self.catalog, topics, acknowledged, self.restart, deleted)

    # Sample data ---------------------------------------------------------------------------
    def produce_sample(self, topic: str, count: int, seed: int, rate: float | None = None,
                       partitions: int = 4, **options: Unpack[SampleOptions]) -> int:
        return sample_data.produce_sample(self.settings, topic, count, seed, rate, partitions,
                                          **options)
