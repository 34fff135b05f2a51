"""A real Prometheus scrapes the agent during a replay; every dashboard query returns series."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import job_file, wait_until
from integration.helpers import stop_drivers
from integration.observability import ALERT_RULES, agent, alert_rules, prometheus, query

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def test_dashboard_queries_return_series_and_lag_falls_to_zero(
        settings, topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.failpoints import release
    from orchestrator.metrics.dashboard import panel_queries
    from orchestrator.metrics.dashboard_cutover import TITLES as CUTOVER_TITLES
    from orchestrator.service import Orchestrator

    # A budget of 2 (the one version never queues), since the 'Replay slots' panel has a
    # series only when there is a budget. Small batches, so that the replay's lag falls in
    # steps that Prometheus samples.
    settings = replace(settings, max_batch_records=20_000, chunk_records=10_000,
                       replay_slots=2)
    service = Orchestrator(settings)
    service.produce_sample(topic, 300_000, seed=71)
    # The replay's first batch waits, unread, until Prometheus has seen it behind: a fast or
    # a loaded machine could otherwise finish it before the first scrape (with the archive's
    # decoded segments in place early, in one batch). At the sink, not at a read task: a
    # batch of decoded segments is read by Spark's Parquet reader, with no read task. Where
    # the agent's archiver has decoded the log before the driver looks, the catch-up is a
    # batch phase, whose first tile waits instead.
    released = tmp_path / "released"
    released.mkdir()
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.start=pause;tile.planned=pause")
    monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(released))
    service.deploy(job_file(tmp_path, "v1", topic))
    monkeypatch.delenv("KAPPA_FAIL_POINTS")
    try:
        with agent(settings, tmp_path, "--interval", "1", "--window", "5",
                   archive=True) as target, \
                prometheus(tmp_path, target) as url:
            # kappa_job survives a plain scrape; `job` is the scrape job's (the collision
            # that once needed honor_labels).
            selector = f'kappa_job="{JOB}",version="v1",job="kappa"'
            wait_until(lambda: query(url, f"kappa_lag_records{{{selector}}} > 0"), 120,
                       "Prometheus to see the version catching up")
            for point in ("batch.start", "tile.planned"):
                release(released, point)
            for title, expr in panel_queries(JOB, "v1"):
                if title in CUTOVER_TITLES:  # series only while an outcome test runs: they
                    continue  # are checked in test_outcome_cutover.py
                wait_until(lambda expr=expr: query(url, expr), 60,
                           f"series for panel {title!r}: {expr}")
            wait_until(lambda: query(url, f"kappa_lag_records{{{selector}}} == 0"), 300,
                       "the lag to fall to 0")
            wait_until(lambda: query(url, f'kappa_state{{{selector},state="caught_up"}} == 1'),
                       60, "the caught_up state to become 1")
            assert query(url, "kappa_exporter_stale == 0")
            # The shipped alert rules run on this server, over these series, without errors.
            rules = wait_until(lambda: [r for r in alert_rules(url)
                                        if r.get("lastEvaluation", "").startswith("2")]
                               or None, 30, "the alert rules to be evaluated")
            shipped = {r["alert"] for g in yaml.safe_load(ALERT_RULES.read_text())["groups"]
                       for r in g["rules"]}
            assert {r["name"] for r in rules} == shipped, rules
            assert all(r["health"] == "ok" for r in rules), rules
            assert not [r for r in rules if r["state"] == "firing"], rules
    finally:
        for point in ("batch.start", "tile.planned"):  # where the wait for the scrape failed
            release(released, point)
        stop_drivers(service)
