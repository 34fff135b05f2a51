"""Prometheus exporter: every version's lag, state and output, sampled in the background.

Scrapes never touch PostgreSQL or Kafka: a sampler thread refreshes a snapshot every interval and
the collector serves the last one. When a refresh fails (a service is away) the last values stay
up, ``kappa_exporter_stale`` turns 1, and the sampler keeps retrying by itself.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.archive_model.segments import PartitionArchive
from orchestrator.errors import ConfigError
from orchestrator.lag import LagState
from orchestrator.metrics.exporter_cutover import cutover_metrics
from orchestrator.models import AliasState, VersionLag, VersionStatus
from orchestrator.states import RunState

log = logging.getLogger("kappa.exporter")
PREFIX = "kappa"
# The label naming a kappa job. Not `job`: Prometheus sets `job` to the scrape job's name and
# renames a target's own to `exported_job`. LEGACY_JOB_LABEL keeps the old name for one release
# (setting metrics_job_label).
JOB_LABEL, LEGACY_JOB_LABEL = "kappa_job", "job"


def job_label_checked(name: str) -> str:
    if name not in (JOB_LABEL, LEGACY_JOB_LABEL):
        raise ConfigError(f"metrics_job_label={name!r} is not a label the exporter offers: use "
                          f"{JOB_LABEL!r} (the default) or {LEGACY_JOB_LABEL!r} (the name "
                          "before this release, scraped with honor_labels: true)")
    return name


def _version_labels(job_label: str) -> tuple[str, ...]:
    return (job_label, "version")


def _partition_labels(job_label: str) -> tuple[str, ...]:
    return (job_label, "version", "topic", "partition")


@dataclass(frozen=True)
class Snapshot:
    lags: tuple[VersionLag, ...] = ()
    statuses: tuple[VersionStatus, ...] = ()
    taken_at: float = 0.0  # seconds since the epoch; 0 before the first success
    aliases: tuple[AliasState, ...] = ()
    archive: tuple[PartitionArchive, ...] = ()
    # The outcome cutovers that run now, each with its last look (OutcomeDesk.running()).
    experiments: tuple[Mapping[str, Any], ...] = ()
    # (catch-ups holding a replay slot, versions queued, slots or None for no budget).
    replays: tuple[int, int, int | None] | None = None
    replay_hold: bool | None = None  # live first holds the queue; None: not looked at


@dataclass
class Sampler:
    """Refreshes the snapshot; a failed refresh keeps the last one and marks it stale."""

    take: Callable[[], Snapshot]
    interval_s: float = 5.0
    snapshot: Snapshot = field(default_factory=Snapshot)
    stale: bool = True
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def refresh(self) -> None:
        try:
            self.snapshot = self.take()
            self.stale = False
        except Exception as exc:  # any outage: keep serving the last values
            self.failures += 1
            self.stale = True
            log.warning("sampling failed (%s); serving the last values as stale",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def is_stale(self, now: float | None = None) -> bool:
        """Stale when the last refresh failed, or when one has been hanging for a while (a
        service that stopped answering makes client calls wait for their timeouts)."""
        now = time.time() if now is None else now
        too_old = self.snapshot.taken_at and now - self.snapshot.taken_at > max(
            3 * self.interval_s, 15.0)
        return self.stale or bool(too_old)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.refresh()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, name="kappa-sampler", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


class KappaCollector(Collector):
    def __init__(self, sampler: Sampler, job_label: str = JOB_LABEL) -> None:
        self.sampler = sampler
        self.job_label = job_label_checked(job_label)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self.sampler.snapshot
        yield from lag_metrics(snap.lags, self.job_label)
        yield from status_metrics(snap.statuses, self.job_label)
        yield from alias_metrics(snap.aliases, snap.statuses, self.job_label)
        yield from archive_metrics(snap.archive)
        yield from cutover_metrics(snap.experiments, self.job_label)
        yield from replay_metrics(snap.replays, snap.replay_hold)
        stale = GaugeMetricFamily(f"{PREFIX}_exporter_stale",
                                  "1 when the last refresh failed and the values are old")
        stale.add_metric([], 1.0 if self.sampler.is_stale() else 0.0)
        yield stale
        last = GaugeMetricFamily(f"{PREFIX}_exporter_last_success_timestamp_seconds",
                                 "When the served values were taken")
        last.add_metric([], snap.taken_at)
        yield last
        failures = CounterMetricFamily(f"{PREFIX}_exporter_refresh_failures",
                                       "Refreshes that failed since the exporter started")
        failures.add_metric([], float(self.sampler.failures))
        yield failures


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def replay_metrics(replays: tuple[int, int, int | None] | None, held: bool | None = None
                   ) -> Iterator[GaugeMetricFamily]:
    """The replay budget; no series before the first sample (unknown is never 0)."""
    running = _gauge("replays_running", "Catch-ups holding a replay slot (live versions hold "
                     "none)", ())
    queued = _gauge("replays_queued", "Versions waiting in the replay queue for a slot", ())
    slots = _gauge("replay_slots", "Catch-ups that may run at once (replay_slots); no series "
                   "when there is no budget", ())
    if replays is not None:
        running.add_metric([], float(replays[0]))
        queued.add_metric([], float(replays[1]))
        if replays[2] is not None:
            slots.add_metric([], float(replays[2]))
    hold = _gauge("replay_hold", "1 while live first holds the replay queue: a live version "
                  "is more than live_lag_protect_s behind, no catch-up starts, and catch-ups "
                  "are paused", ())
    if held is not None:
        hold.add_metric([], 1.0 if held else 0.0)
    yield running
    yield queued
    yield slots
    yield hold


def lag_metrics(lags: Sequence[VersionLag], job_label: str = JOB_LABEL
                ) -> Iterator[GaugeMetricFamily]:
    per_partition = {
        "log_start_offset": ("First retained offset of the partition", "log_start"),
        "log_end_offset": ("Offset the next record will get (true log end)", "log_end"),
        "processed_offset": ("Next offset the version will read", "processed"),
        "partition_lag_records": ("Records behind the log end", "lag_records"),
        "partition_lag_seconds": ("Age of the oldest unprocessed record", "lag_seconds"),
    }
    for name, (doc, attr) in per_partition.items():
        family = _gauge(name, doc, _partition_labels(job_label))
        for lag in lags:
            for p in lag.partitions:
                figure = getattr(p, attr)
                if figure is not None:  # unknown is no series, never 0
                    family.add_metric([lag.job, lag.version, p.topic, str(p.partition)],
                                      float(figure))
        yield family
    per_version: dict[str, tuple[str, Callable[[VersionLag], float | None]]] = {
        "lag_records": ("Records behind the log end, all partitions", lambda v: v.lag_records),
        "lag_seconds": ("Age of the oldest unprocessed record, 0 when caught up",
                        lambda v: v.lag_seconds),
        "processing_rate_records_per_second": ("Records processed per second over the window",
                                               lambda v: v.processing_rate),
        "produce_rate_records_per_second": ("Records produced per second over the window",
                                            lambda v: v.produce_rate),
        "eta_seconds": ("Seconds until caught up; +Inf when not converging",
                        lambda v: math.inf if v.eta_seconds is None else v.eta_seconds),
    }
    for name, (doc, value) in per_version.items():
        family = _gauge(name, doc, _version_labels(job_label))
        for lag in lags:
            figure = value(lag)
            # A version whose log is gone has no figures against the log there now: only its
            # state (log_gone) is exported.
            if lag.lag_records is not None and figure is not None:
                family.add_metric([lag.job, lag.version], float(figure))
        yield family
    state = _gauge("state", "1 for the version's current lag state, 0 for the others",
                   (*_version_labels(job_label), "state"))
    for lag in lags:
        for candidate in LagState:
            state.add_metric([lag.job, lag.version, candidate.value],
                             1.0 if candidate.value == lag.state else 0.0)
    yield state


def status_metrics(statuses: Sequence[VersionStatus], job_label: str = JOB_LABEL
                   ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    by_version = _version_labels(job_label)
    rows = _gauge("output_rows", "Rows in the version's output table, from PostgreSQL's "
                  "statistics (no scan)", by_version)
    dead = CounterMetricFamily(f"{PREFIX}_dead_letters", "Invalid events routed to the "
                               "version's dead-letter table", labels=list(by_version))
    heartbeat = _gauge("driver_heartbeat_age_seconds", "Seconds since the driver's last "
                       "heartbeat", by_version)
    run_state = _gauge("run_state", "1 for the version's current run state (deployed, "
                       "replaying, live, failed, ...), 0 for the others",
                       (*by_version, "state"))
    for st in statuses:
        labels = [st.job, st.version]
        for candidate in RunState:
            run_state.add_metric([*labels, candidate.value],
                                 1.0 if candidate == st.state else 0.0)
        if st.rows is not None:
            rows.add_metric(labels, float(st.rows))
        if st.dead_letters is not None:
            dead.add_metric(labels, float(st.dead_letters))
        if st.heartbeat_age_s is not None:
            heartbeat.add_metric(labels, float(st.heartbeat_age_s))
    yield rows
    yield dead
    yield heartbeat
    yield run_state


def alias_metrics(aliases: Sequence[AliasState], statuses: Sequence[VersionStatus],
                  job_label: str = JOB_LABEL
                  ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    labels = [job_label, "alias", "version"]
    target = GaugeMetricFamily(f"{PREFIX}_alias_target", "1 when the alias serves any keys "
                               "from the version, else 0", labels=labels)
    split = GaugeMetricFamily(f"{PREFIX}_alias_split_percent", "Percent of the alias's keys "
                              "served by the version", labels=labels)
    switches = CounterMetricFamily(f"{PREFIX}_alias_switches", "Switches of the alias "
                                   "(promote, A/B step, rollback)", labels=[job_label, "alias"])
    for alias in aliases:
        for version in sorted({st.version for st in statuses if st.job == alias.job}):
            share = alias.share(version)
            target.add_metric([alias.job, alias.alias, version], 1.0 if share else 0.0)
            split.add_metric([alias.job, alias.alias, version], float(share))
        switches.add_metric([alias.job, alias.alias], float(alias.switches))
    yield target
    yield split
    yield switches


def archive_metrics(rows: Sequence[PartitionArchive]) -> Iterator[GaugeMetricFamily]:
    """The archive of the lineage each topic has now; earlier lineages stay in `kappa archive
    status`, not in series that would never change again."""
    labels = ("topic", "partition")
    figures: dict[str, tuple[str, Callable[[PartitionArchive], float | None]]] = {
        "archive_lag_records": ("Records of the log not archived yet", lambda r: r.behind),
        "archive_lag_seconds": ("Age of the oldest record not archived yet, 0 when none",
                                lambda r: r.lag_seconds),
        "archive_end_offset": ("Offset the next archived segment starts at",
                               lambda r: r.archived_end),
        "archive_segments": ("Segments archived", lambda r: r.segments),
        "archive_bytes": ("Bytes of the archived segments", lambda r: r.bytes),
        "archive_retention_headroom_records": (
            "Records retention may take from the log start before it takes one not archived; "
            "negative once it has", lambda r: r.retention_headroom),
        "archive_retention_headroom_ratio": (
            "The retention headroom as a share of the records the broker holds",
            lambda r: r.retention_headroom_share),
    }
    for name, (doc, value) in figures.items():
        family = _gauge(name, doc, labels)
        for row in rows:
            figure = value(row)
            if row.current and figure is not None:  # unknown is no series, never 0
                family.add_metric([row.topic, str(row.partition)], float(figure))
        yield family
