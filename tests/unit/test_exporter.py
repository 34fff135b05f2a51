from __future__ import annotations

import math
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from orchestrator.errors import ConfigError
from orchestrator.metrics.exporter import KappaCollector, Sampler, Snapshot
from orchestrator.models import PartitionLag, VersionLag
from orchestrator.states import RunState


def _lag(eta: float | None) -> VersionLag:
    part = PartitionLag("pageviews", 0, 0, 100, 40, 60, 2.5)
    return VersionLag("pageview_counts", "v2", "catching_up", RunState.REPLAYING, 60, 2.5,
                      10.0, 12.0 if eta is None else 1.0, eta, (part,))


def _scrape(sampler: Sampler, job_label: str = "kappa_job") -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(KappaCollector(sampler, job_label))
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_follow_prometheus_naming_and_bounded_labels() -> None:
    sampler = Sampler(take=lambda: Snapshot((_lag(6.7),), (), time.time()))
    sampler.refresh()
    got = _scrape(sampler)
    (partition_lag,) = [v for k, v in got.items() if k.startswith("kappa_partition_lag_records")
                        and 'partition="0"' in k and 'topic="pageviews"' in k]
    assert partition_lag == 60
    names = {key.split("{")[0] for key in got}
    for name in ("kappa_log_start_offset", "kappa_log_end_offset", "kappa_processed_offset",
                 "kappa_partition_lag_records", "kappa_partition_lag_seconds",
                 "kappa_lag_records", "kappa_lag_seconds", "kappa_eta_seconds", "kappa_state",
                 "kappa_processing_rate_records_per_second", "kappa_exporter_stale",
                 "kappa_exporter_refresh_failures_total"):
        assert name in names, name
    assert all("offset=" not in key and "run" not in key for key in got)
    assert got['kappa_lag_records{kappa_job="pageview_counts",version="v2"}'] == 60
    assert got['kappa_eta_seconds{kappa_job="pageview_counts",version="v2"}'] == 6.7
    assert got['kappa_state{kappa_job="pageview_counts",state="catching_up",version="v2"}'] == 1
    assert got['kappa_state{kappa_job="pageview_counts",state="stalled",version="v2"}'] == 0
    assert got["kappa_exporter_stale"] == 0


def test_not_converging_is_infinite_eta() -> None:
    sampler = Sampler(take=lambda: Snapshot((_lag(None),), (), time.time()))
    sampler.refresh()
    got = _scrape(sampler)
    assert math.isinf(got['kappa_eta_seconds{kappa_job="pageview_counts",version="v2"}'])


def test_an_outage_keeps_the_last_values_and_marks_them_stale() -> None:
    taken = time.time()
    answers: list[object] = [Snapshot((_lag(6.7),), (), taken), ConnectionError("db away")]

    def take() -> Snapshot:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Snapshot)
        return answer

    sampler = Sampler(take=take)
    sampler.refresh()
    sampler.refresh()
    got = _scrape(sampler)
    assert got["kappa_exporter_stale"] == 1
    assert got["kappa_exporter_refresh_failures_total"] == 1
    assert got['kappa_lag_records{kappa_job="pageview_counts",version="v2"}'] == 60
    assert got["kappa_exporter_last_success_timestamp_seconds"] == taken


def test_a_hanging_refresh_turns_stale_after_three_intervals() -> None:
    sampler = Sampler(take=lambda: Snapshot((), (), time.time()), interval_s=10.0)
    sampler.refresh()
    now = sampler.snapshot.taken_at
    assert not sampler.is_stale(now + 29)
    assert sampler.is_stale(now + 31)


def test_alias_target_split_and_switches() -> None:
    from orchestrator.models import AliasState, VersionStatus

    def status(version: str) -> VersionStatus:
        return VersionStatus("pageview_counts", version, RunState.LIVE, 1, None, "t", "d", 1, 0,
                             {}, 0, 0.5, None, 1, None, None)

    alias = AliasState("pageview_counts", "pageview_counts", "v1", "v2", 10, 3)
    sampler = Sampler(take=lambda: Snapshot((), (status("v1"), status("v2"), status("v3")),
                                            time.time(), (alias,)))
    sampler.refresh()
    got = _scrape(sampler)
    base = 'alias="pageview_counts",kappa_job="pageview_counts"'
    assert got[f'kappa_alias_split_percent{{{base},version="v1"}}'] == 90
    assert got[f'kappa_alias_split_percent{{{base},version="v2"}}'] == 10
    assert got[f'kappa_alias_target{{{base},version="v3"}}'] == 0
    assert got[f'kappa_alias_switches_total{{{base}}}'] == 3


def test_an_unknown_time_lag_is_no_series_never_zero() -> None:
    part = PartitionLag("pageviews", 0, 0, 100, 40, 60, None)
    lag = VersionLag("pageview_counts", "v2", "stalled", RunState.LIVE, 60, None, 0.0, 0.0,
                     None, (part,), reason="retrying after unreachable service: ...")
    sampler = Sampler(take=lambda: Snapshot((lag,), (), time.time()))
    sampler.refresh()
    got = _scrape(sampler)
    assert not [k for k in got if k.startswith(("kappa_lag_seconds", "kappa_partition_lag_sec"))]
    assert got['kappa_lag_records{kappa_job="pageview_counts",version="v2"}'] == 60
    assert lag.to_json()["lag_seconds"] is None
    assert lag.to_json()["partitions"][0]["lag_seconds"] is None  # type: ignore[index]


def test_a_partition_behind_without_a_timestamp_has_an_unknown_age() -> None:
    from orchestrator.observe.monitor import _age, _oldest

    assert _age(1000.0, None, behind=False) == 0.0
    assert _age(1000.0, None, behind=True) is None
    assert _age(1000.0, 990_000, behind=True) == 10.0
    assert _oldest([0.0, 3.5]) == 3.5
    assert _oldest([0.0, None, 3.5]) is None
    assert _oldest([]) == 0.0


def test_the_archive_of_the_current_lineage_is_exported_and_unknown_is_no_series() -> None:
    from orchestrator.archive_model.segments import PartitionArchive

    rows = (PartitionArchive("pageviews", 0, "c-t2", True, 0, 900, 2, 880, 20, 4096, 0, 1000,
                             3.5),
            PartitionArchive("pageviews", 1, "c-t2", True, None, None, 0, 0, 0, 0, None, None),
            PartitionArchive("pageviews", 0, "c-t1", False, 0, 50, 1, 50, 0, 100, None, None))
    sampler = Sampler(take=lambda: Snapshot(taken_at=time.time(), archive=rows))
    sampler.refresh()
    got = _scrape(sampler)
    labels = '{partition="0",topic="pageviews"}'
    assert got[f"kappa_archive_lag_records{labels}"] == 100
    assert got[f"kappa_archive_lag_seconds{labels}"] == 3.5
    assert got[f"kappa_archive_end_offset{labels}"] == 900
    assert got[f"kappa_archive_segments{labels}"] == 2  # the old lineage's segment is not added
    assert got[f"kappa_archive_bytes{labels}"] == 4096
    assert got[f"kappa_archive_retention_headroom_records{labels}"] == 900
    assert got[f"kappa_archive_retention_headroom_ratio{labels}"] == 0.9
    assert not [k for k in got if k.startswith(("kappa_archive_lag_", "kappa_archive_retention"))
                and 'partition="1"' in k]  # its log bounds are unknown
    assert got['kappa_archive_segments{partition="1",topic="pageviews"}'] == 0


def _failed(version: str, state: RunState) -> Snapshot:
    from orchestrator.models import VersionStatus

    status = VersionStatus("pageview_counts", version, state, None, None, "t", "d", 1, 0, {}, 0,
                           None, "the driver exited with 1", 2, None, None)
    return Snapshot((_lag(1.0),), (status,), time.time())


def test_the_job_is_the_kappa_job_label_not_the_one_prometheus_sets() -> None:
    sampler = Sampler(take=lambda: _failed("v2", RunState.FAILED))
    sampler.refresh()
    got = _scrape(sampler)
    assert not [k for k in got if "{job=" in k or ",job=" in k], got
    assert got['kappa_run_state{kappa_job="pageview_counts",state="failed",version="v2"}'] == 1
    assert got['kappa_run_state{kappa_job="pageview_counts",state="live",version="v2"}'] == 0
    assert sum(v for k, v in got.items() if k.startswith("kappa_run_state{")) == 1


def test_the_old_job_label_stays_for_one_release_behind_a_setting() -> None:
    sampler = Sampler(take=lambda: _failed("v2", RunState.LIVE))
    sampler.refresh()
    got = _scrape(sampler, "job")
    assert got['kappa_lag_records{job="pageview_counts",version="v2"}'] == 60
    assert got['kappa_run_state{job="pageview_counts",state="live",version="v2"}'] == 1
    assert not [k for k in got if "kappa_job=" in k]
    with pytest.raises(ConfigError, match=r"metrics_job_label='service'.*kappa_job"):
        KappaCollector(sampler, "service")


def test_a_running_outcome_cutover_is_exported_and_unknown_figures_are_no_series() -> None:
    arm = {"count": 900, "mean": 0.3, "interval": [0.25, 0.35], "version": "v1"}
    early = {"count": 40, "mean": 0.2, "interval": None, "version": "v2"}
    experiment = {
        "job": "pageview_counts", "alias": "pv", "version": "v2", "look": 7, "share": 30,
        "verdict": "no_data", "evidence": {"p_better": 0.2, "metrics": [{
            "metric": "converts", "baseline": arm, "candidate": early, "difference": None,
            "interval": None, "statistic": None, "threshold": None}]}}
    sampler = Sampler(take=lambda: Snapshot(taken_at=time.time(), experiments=(experiment,)))
    sampler.refresh()
    got = _scrape(sampler)
    base = 'alias="pv",arm="baseline",kappa_job="pageview_counts",metric="converts",version="v1"'
    assert got[f"kappa_cutover_observations{{{base}}}"] == 900
    assert got[f"kappa_cutover_mean_low{{{base}}}"] == 0.25
    cand = base.replace('"baseline"', '"candidate"').replace('"v1"', '"v2"')
    assert got[f"kappa_cutover_mean{{{cand}}}"] == 0.2
    assert f"kappa_cutover_mean_low{{{cand}}}" not in got  # no interval yet: no series
    assert not [k for k in got if k.startswith(("kappa_cutover_difference",
                                                "kappa_cutover_statistic"))]
    alias = 'alias="pv",kappa_job="pageview_counts",version="v2"'
    assert got[f"kappa_cutover_candidate_share_percent{{{alias}}}"] == 30
    assert got[f"kappa_cutover_p_better{{{alias}}}"] == 0.2
    verdict = 'kappa_cutover_verdict{{alias="pv",kappa_job="pageview_counts",verdict="{}",' \
              'version="v2"}}'
    assert got[verdict.format("no_data")] == 1 and got[verdict.format("continue")] == 0


def test_the_replay_budget_is_exported_and_unknown_before_the_first_sample() -> None:
    def samples(snapshot: Snapshot) -> dict[str, float]:
        sampler = Sampler(take=lambda: snapshot)
        sampler.refresh()
        registry = CollectorRegistry()
        registry.register(KappaCollector(sampler))
        return {line.split(" ")[0]: float(line.split(" ")[1])
                for line in generate_latest(registry).decode().splitlines()
                if line.startswith("kappa_replay")}

    assert samples(Snapshot(taken_at=time.time(), replays=(2, 3, 2))) == {
        "kappa_replays_running": 2.0, "kappa_replays_queued": 3.0, "kappa_replay_slots": 2.0}
    # Live first's hold, where the agent looked (`kappa metrics serve` does not).
    assert samples(Snapshot(taken_at=time.time(), replays=(0, 1, 2), replay_hold=True)) == {
        "kappa_replays_running": 0.0, "kappa_replays_queued": 1.0, "kappa_replay_slots": 2.0,
        "kappa_replay_hold": 1.0}
    assert samples(Snapshot(taken_at=time.time(), replays=(0, 0, 2),
                            replay_hold=False))["kappa_replay_hold"] == 0.0
    # No budget: no slots series; never sampled: no series at all (unknown is never 0).
    assert samples(Snapshot(taken_at=time.time(), replays=(4, 0, None))) == {
        "kappa_replays_running": 4.0, "kappa_replays_queued": 0.0}
    assert samples(Snapshot(taken_at=time.time())) == {}
