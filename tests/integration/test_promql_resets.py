"""Counters that restart or are replaced inside a routing span, seen through a real Prometheus.

An application restart sets its counters back to 0, and they regrow past their values before it
within one span: the difference of the sums over that span looks like data and is not;
Prometheus's resets() says so, and the span is left out while the next one keeps the counters'
true increases. A pod replaced by another (a rolling deploy) is no restart: the old pod's series
ends and the new pod's begins, and each counts for what it grew inside the span."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_until

pytestmark = [pytest.mark.integration]

READS = 'sum(widget_reads_total{served_by="{version}"})'
CONVERSIONS = 'sum(widget_conversions_total{served_by="{version}"})'


class _Application:
    """Reads and conversions counted per serving version on one port; a restart serves new
    counters from 0 on the same port, as a restarted process would."""

    def __init__(self, port: int):
        self.port = port
        self.counted: dict[tuple[str, str], float] = {}  # (query, version) -> counter now
        self._serve()

    def _serve(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, start_http_server

        registry = CollectorRegistry()
        self.reads = Counter("widget_reads", "reads", ["served_by"], registry=registry)
        self.conversions = Counter("widget_conversions", "conversions", ["served_by"],
                                   registry=registry)
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def count(self, version: str, reads: int, conversions: int) -> None:
        self.reads.labels(version).inc(reads)
        self.conversions.labels(version).inc(conversions)
        for query, more in ((READS, reads), (CONVERSIONS, conversions)):
            self.counted[(query, version)] = self.counted.get((query, version), 0) + more

    def count_each(self, **reads_and_conversions: tuple[int, int]) -> None:
        for version, (reads, conversions) in reads_and_conversions.items():
            self.count(version, reads, conversions)

    def restart(self) -> None:
        self.stop()
        self.counted.clear()
        self._serve()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scraped(reader: Any, pods: list[_Application], what: str) -> None:
    """Wait until Prometheus's sums are the running pods' counts: a stopped pod's series are
    stale (its failed scrape marks them so)."""
    def seen() -> bool:
        now = datetime.now(UTC)
        expected: dict[tuple[str, str], float] = {}
        for pod in pods:
            for key, value in pod.counted.items():
                expected[key] = expected.get(key, 0) + value
        return all(reader.value(query.replace("{version}", version), now) == value
                   for (query, version), value in expected.items())
    wait_until(seen, 20, f"Prometheus to scrape {what}", poll_s=0.2)


def boundary(reader: Any) -> datetime:
    """Now, once every running pod's series has a sample scraped later: a target's scrapes
    run one at a time, so none begun before this instant can carry the next phase."""
    at = datetime.now(UTC)
    wait_until(lambda: (reader.value("min(timestamp(widget_reads_total))",
                                     datetime.now(UTC)) or 0) > at.timestamp(),
               20, "a scrape of every pod after the span boundary", poll_s=0.2)
    return at


def test_a_span_with_a_restart_is_left_out_and_the_next_keeps_its_increases(
        tmp_path: Path) -> None:
    from orchestrator.experiment.attribution import RoutingSpan
    from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
    from orchestrator.experiment.sequential import NOTHING
    from orchestrator.metrics.promql import PrometheusOutcomes, summary_of

    from integration.observability import free_port, prometheus

    metric = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, promql=CONVERSIONS,
                           promql_count=READS)
    app = _Application(free_port())
    try:
        with prometheus(tmp_path, f"127.0.0.1:{app.port}") as url:
            reader = PrometheusOutcomes(url, timeout_s=10)

            app.count("v1", 100, 10)
            app.count("v2", 50, 5)
            scraped(reader, [app], "the counts before the first span")
            first = boundary(reader)
            app.count("v1", 20, 2)
            scraped(reader, [app], "the first span's counts before the restart")
            app.restart()
            app.count("v1", 30, 3)
            app.count("v2", 10, 1)
            scraped(reader, [app], "the counters after the restart, below their values before it")
            app.count("v1", 170, 27)
            app.count("v2", 80, 11)
            scraped(reader, [app], "the counters regrown past their values before the restart")
            second = boundary(reader)
            app.count("v1", 40, 4)
            app.count("v2", 20, 3)
            scraped(reader, [app], "the second span's counts")
            until = boundary(reader)

            # The premise: over the first span every sum grew, so only its resets tell.
            for query in (READS, CONVERSIONS):
                for version in ("v1", "v2"):
                    text = query.replace("{version}", version)
                    grown = (reader.value(text, second) or 0) - (reader.value(text, first) or 0)
                    assert grown > 0, (text, grown)
            spans = [RoutingSpan(first, "v1", "v2", 50), RoutingSpan(second, "v1", "v2", 50)]
            found, note = reader.strata(metric, spans, baseline="v1", candidate="v2",
                                        until=until)
    finally:
        app.stop()
    assert found[0] == (NOTHING, NOTHING), found
    assert note is not None and "routing span 1 (" in note, note
    assert found[1] == (summary_of(Kind.PROPORTION, 40, 4.0, None),
                        summary_of(Kind.PROPORTION, 20, 3.0, None)), found


def test_a_pod_replaced_in_a_span_counts_to_its_last_sample_and_its_successor_from_zero(
        tmp_path: Path) -> None:
    """Two pods count readers; in the first span one of them stops and a third, a new target,
    takes its place. The sums' difference over that span takes the stopped pod's whole total out
    and adds the new pod's: v1's new pod grew past the old one's total, which biased the figure
    (620 - 400 reads, not 560), and v2's did not, which dropped the span as a restart. Series
    by series, every pod counts what it grew inside the span."""
    from orchestrator.experiment.attribution import RoutingSpan
    from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
    from orchestrator.metrics.promql import PrometheusOutcomes, summary_of

    from integration.observability import free_port, prometheus

    metric = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, promql=CONVERSIONS,
                           promql_count=READS)
    kept_port, stopped_port, successor_port = free_port(), free_port(), free_port()
    kept, stopped = _Application(kept_port), _Application(stopped_port)
    pods = [kept, stopped]
    try:
        with prometheus(tmp_path, *(f"127.0.0.1:{port}" for port in
                                    (kept_port, stopped_port, successor_port))) as url:
            reader = PrometheusOutcomes(url, timeout_s=10)

            kept.count_each(v1=(100, 10), v2=(50, 5))
            stopped.count_each(v1=(300, 30), v2=(200, 20))
            scraped(reader, pods, "both pods' counts before the first span")
            first = boundary(reader)
            kept.count_each(v1=(20, 2), v2=(10, 1))
            stopped.count_each(v1=(40, 4), v2=(30, 3))
            scraped(reader, pods, "the first span's counts before the pod stops")
            stopped.stop()
            pods.remove(stopped)
            scraped(reader, pods, "the stopped pod's series gone stale")
            successor = _Application(successor_port)
            pods.append(successor)
            successor.count_each(v1=(500, 50), v2=(60, 6))
            scraped(reader, pods, "the new pod's counts")
            second = boundary(reader)
            kept.count_each(v1=(5, 1))
            successor.count_each(v1=(7, 1), v2=(9, 2))
            scraped(reader, pods, "the second span's counts")
            until = boundary(reader)
            spans = [RoutingSpan(first, "v1", "v2", 50), RoutingSpan(second, "v1", "v2", 50)]
            found, note = reader.strata(metric, spans, baseline="v1", candidate="v2",
                                        until=until)
    finally:
        for pod in pods:
            pod.stop()
    assert found == [
        (summary_of(Kind.PROPORTION, 20 + 40 + 500, 2 + 4 + 50.0, None),
         summary_of(Kind.PROPORTION, 10 + 30 + 60, 1 + 3 + 6.0, None)),
        (summary_of(Kind.PROPORTION, 5 + 7, 2.0, None),
         summary_of(Kind.PROPORTION, 9, 2.0, None))], (found, note)
    assert note is None, note
