"""Outcome metrics read from Prometheus (an adapter: its HTTP API, no client library).

A PromQL metric's queries are cumulative figures per serving version: the sum of the observed
values, their number and, for a mean, the sum of their squares (counters the application
labels with the version that served each reader, e.g. the alias's ``served_by`` column). An arm's
figures in a routing span are the differences of those queries between the span's start and
its end, evaluated at those instants, so the version label does the attribution and the spans
only stratify the test as its SQL metrics are stratified. A query evaluated at a past instant
gives the same answer later, so a resumed cutover recomputes the same statistics.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from orchestrator.errors import KappaError, StateError
from orchestrator.experiment.attribution import RoutingSpan
from orchestrator.experiment.metrics import Kind, OutcomeMetric
from orchestrator.experiment.sequential import NOTHING, ArmSummary, Stratum
from orchestrator.settings import Settings


class PromQLError(KappaError):
    """A PromQL query that Prometheus refused or that does not give one number."""


class PrometheusOutcomes:
    """One Prometheus server, with the figures it gave at past instants kept (a cutover asks
    for the same span starts at every look)."""

    def __init__(self, url: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._kept: dict[tuple[str, float], float | None] = {}

    @classmethod
    def of(cls, settings: Settings, metric: OutcomeMetric) -> PrometheusOutcomes:
        """The Prometheus that ``settings`` name, or one line saying how to name it."""
        if not settings.prometheus_url:
            raise StateError(f"metric {metric.name} reads Prometheus: set KAPPA_PROMETHEUS_URL "
                             "(or prometheus_url in kappa.toml) to its base URL, e.g. "
                             "http://127.0.0.1:9090")
        return cls(settings.prometheus_url, settings.metric_statement_timeout_ms / 1000)

    def value(self, query: str, at: datetime) -> float | None:
        """The query's one number at ``at``; None when it selects no series."""
        params = urllib.parse.urlencode({"query": query, "time": f"{at.timestamp():.3f}"})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}",
                                        timeout=self.timeout_s) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400 and 422 carry Prometheus's own reason
            body = _json_or_none(exc.read()) or {"error": f"HTTP {exc.code} {exc.reason}"}
        except (OSError, ValueError) as exc:
            raise PromQLError(f"Prometheus at {self.url} did not answer ({exc}): check that it "
                              "runs and that KAPPA_PROMETHEUS_URL names it") from exc
        if body.get("status") != "success":
            raise PromQLError(f"Prometheus refused {query!r}: {body.get('error', body)}")
        data = body["data"]
        kind, result = data["resultType"], data["result"]
        if kind == "scalar":
            return float(result[1])
        if kind != "vector":
            raise PromQLError(f"{query!r} gives a {kind}, not one number: use an instant "
                              "vector such as sum(clicks_total{served_by=\"{version}\"})")
        if len(result) > 1:
            raise PromQLError(f"{query!r} gives {len(result)} series, not one number: wrap "
                              "it in sum(...)")
        return float(result[0]["value"][1]) if result else None

    def probe(self, metric: OutcomeMetric, versions: Sequence[str], at: datetime) -> None:
        """Evaluate every query of the metric for each version once, to refuse before anything
        is switched a query that Prometheus rejects or that gives more than one number."""
        for flag, text in metric.promql_queries().items():
            for version in versions:
                try:
                    self.value(_for(text, version), at)
                except PromQLError as exc:
                    raise StateError(f"metric {metric.name}: its {flag} fails: {exc}; fix it "
                                     "and run `kappa metric define` again") from exc

    def strata(self, metric: OutcomeMetric, spans: Sequence[RoutingSpan], *, baseline: str,
               candidate: str, until: datetime) -> tuple[list[Stratum], str | None]:
        """Per span, the (baseline, candidate) figures of the span, and a note of the spans
        left out because a counter went down in them (the application restarted)."""
        stops = [s.start for s in spans[1:]] + [until]
        found: list[Stratum] = []
        reset: list[int] = []
        for n, (span, stop) in enumerate(zip(spans, stops, strict=True), start=1):
            arms = []
            for version in (baseline, candidate):
                if version not in (span.primary, span.candidate):
                    arms.append(NOTHING)
                    continue
                summary = self._arm(metric, version, span.start, stop, keep_stop=stop < until)
                if summary is None:
                    reset.append(n)
                    summary = NOTHING
                arms.append(summary)
            found.append((arms[0], arms[1]))
        note = (f"a counter went down in routing span {', '.join(map(str, sorted(set(reset))))} "
                "(the application restarted?): left out" if reset else None)
        return found, note

    def _arm(self, metric: OutcomeMetric, version: str, start: datetime, stop: datetime, *,
             keep_stop: bool) -> ArmSummary | None:
        """One version's figures between two instants; None if a counter went down."""
        assert metric.promql is not None and metric.promql_count is not None
        figures: list[float | None] = []
        for text in (metric.promql_count, metric.promql, metric.promql_squares):
            if text is None:
                figures.append(None)
                continue
            query = _for(text, version)
            before = self._kept_value(query, start, keep=True)
            after = self._kept_value(query, stop, keep=keep_stop)
            # A series born during the span counted from 0; one gone by its end saw nothing.
            delta = 0.0 if after is None else after - (before or 0.0)
            if delta < 0:
                return None
            figures.append(delta)
        count, total, squares = figures
        return summary_of(metric.kind, count or 0.0, total or 0.0, squares)

    def _kept_value(self, query: str, at: datetime, *, keep: bool) -> float | None:
        key = (query, at.timestamp())
        if key in self._kept:
            return self._kept[key]
        found = self.value(query, at)
        if keep:
            self._kept[key] = found
        return found


def summary_of(kind: Kind, count: float, total: float, squares: float | None) -> ArmSummary:
    """An arm's summary from its counters: Welford's M2 is the sum of squares less the
    square of the sum over the count; 0/1 values are their own squares."""
    n = round(count)
    if n <= 0:
        return NOTHING
    raw = total if kind == Kind.PROPORTION or squares is None else squares
    return ArmSummary(n, total, max(0.0, raw - total * total / n))


def _for(text: str, version: str) -> str:
    return text.replace("{version}", version)


def _json_or_none(raw: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
