"""An application restart seen through a real Prometheus: its counters go back to 0 and regrow
past their values before it, within one routing span. The difference of the sums over that span
looks like data and is not; Prometheus's resets() says so, and the span is left out while the
next one keeps the counters' true increases."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

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

    def restart(self) -> None:
        self.stop()
        self.counted.clear()
        self._serve()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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

            def scraped(what: str) -> None:
                def seen() -> bool:
                    now = datetime.now(UTC)
                    return all(reader.value(query.replace("{version}", version), now) == value
                               for (query, version), value in app.counted.items())
                wait_until(seen, 20, f"Prometheus to scrape {what}", poll_s=0.2)

            def boundary() -> datetime:
                """Now, once a scrape begun later has been stored: a target's scrapes run one
                at a time, so none begun before this instant can carry the next phase."""
                at = datetime.now(UTC)
                wait_until(lambda: (reader.value("max(timestamp(widget_reads_total))",
                                                 datetime.now(UTC)) or 0) > at.timestamp(),
                           20, "a scrape after the span boundary", poll_s=0.2)
                return at

            app.count("v1", 100, 10)
            app.count("v2", 50, 5)
            scraped("the counts before the first span")
            first = boundary()
            app.count("v1", 20, 2)
            scraped("the first span's counts before the restart")
            app.restart()
            app.count("v1", 30, 3)
            app.count("v2", 10, 1)
            scraped("the counters after the restart, below their values before it")
            app.count("v1", 170, 27)
            app.count("v2", 80, 11)
            scraped("the counters regrown past their values before the restart")
            second = boundary()
            app.count("v1", 40, 4)
            app.count("v2", 20, 3)
            scraped("the second span's counts")
            until = boundary()

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
