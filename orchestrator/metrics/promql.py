"""Outcome metrics read from Prometheus (an adapter: its HTTP API, no client library).

A PromQL metric's queries are cumulative figures per serving version: the sum of the observed
values, their number and, for a mean, the sum of their squares (counters the application
labels with the version that served each reader, e.g. the alias's ``served_by`` column). An arm's
figures in a routing span are what those counters grew in the span, evaluated at its end, so the
version label does the attribution and the spans only stratify the test as its SQL metrics are
stratified. A query about past instants gives the same answer later, so a resumed cutover
recomputes the same statistics.

Growth is taken series by series, not as a difference of sums: each counter of the query is
replaced by its last sample in the span less its value at the span's start, or by its last
sample alone when it had no value then. A pod that goes away inside a span (a rolling deploy, a
scale-down) counts up to its last sample and its successor from 0, where a difference of sums
would take the old pod's whole total out of the span.

A restarted application's counters start again from 0 in the same series: Prometheus's resets()
of each selector of the query over the span tells, and such a span is left out, as is one whose
growth is negative.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from orchestrator.errors import KappaError, StateError
from orchestrator.experiment.attribution import RoutingSpan
from orchestrator.experiment.metrics import Kind, OutcomeMetric
from orchestrator.experiment.sequential import NOTHING, ArmSummary, Stratum
from orchestrator.settings import Settings

# A span as probe: the growth form of a query is evaluated once at define, to refuse what
# Prometheus rejects in it (an offset or @ on a counter) before anything is switched.
PROBE_SPAN = timedelta(minutes=1)


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
                    self.value(span_growth(_for(text, version), at - PROBE_SPAN, at), at)
                except PromQLError as exc:
                    raise StateError(f"metric {metric.name}: its {flag} fails: {exc}; fix it "
                                     "and run `kappa metric define` again") from exc

    def strata(self, metric: OutcomeMetric, spans: Sequence[RoutingSpan], *, baseline: str,
               candidate: str, until: datetime) -> tuple[list[Stratum], str | None]:
        """Per span, the (baseline, candidate) figures of the span, and a note of the spans
        left out because a counter went down or was reset in them (the application
        restarted)."""
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
        spans_reset = ", ".join(map(str, sorted(set(reset))))
        note = (f"a counter went down or was reset in routing span {spans_reset} (the "
                "application restarted?): left out" if reset else None)
        return found, note

    def _arm(self, metric: OutcomeMetric, version: str, start: datetime, stop: datetime, *,
             keep_stop: bool) -> ArmSummary | None:
        """One version's figures between two instants; None if a counter went down or was
        reset."""
        assert metric.promql is not None and metric.promql_count is not None
        figures: list[float | None] = []
        for text in (metric.promql_count, metric.promql, metric.promql_squares):
            if text is None:
                figures.append(None)
                continue
            query = _for(text, version)
            grown = self._kept_value(span_growth(query, start, stop), stop, keep=keep_stop)
            # A restart sets the series back to 0; once it regrew past the start, only
            # Prometheus, which keeps each series apart, can tell.
            if grown is not None and (
                    grown < 0 or self._reset(query, start, stop, keep_stop=keep_stop)):
                return None
            figures.append(grown or 0.0)  # None: no series had a sample in the span
        count, total, squares = figures
        return summary_of(metric.kind, count or 0.0, total or 0.0, squares)

    def _reset(self, query: str, start: datetime, stop: datetime, *, keep_stop: bool) -> bool:
        """Whether Prometheus saw a counter of the query go back between the samples that its
        values at ``start`` and at ``stop`` used."""
        for selector in vector_selectors(query):
            oldest = self._kept_value(f"min(timestamp({selector}))", start, keep=True)
            # Back to the oldest sample the start's value used, and 1 ms more: that sample is
            # inside Prometheus 2's left-closed range and Prometheus 3's left-open one alike,
            # and the sample before it, a scrape interval older, is not.
            reach_ms = (_milliseconds(stop.timestamp()) - _milliseconds(oldest) + 1
                        if oldest is not None else
                        _milliseconds(stop.timestamp()) - _milliseconds(start.timestamp()))
            resets = self._kept_value(f"sum(resets({selector}[{max(reach_ms, 1)}ms]))", stop,
                                      keep=keep_stop)
            if resets is not None and resets > 0:
                return True
        return False

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


_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Numbers and durations (5m, 1h30m, 0x1f, 1e-3) in one token, so that a unit is no metric name.
_NUMBER = re.compile(r"(?:0[xX][0-9A-Fa-f]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[A-Za-z0-9_]*")
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = _LABEL_LISTS | frozenset({
    "bool", "offset", "and", "or", "unless", "atan2", "inf", "nan", "sum", "min", "max", "avg",
    "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "limitk", "limit_ratio"})
_QUOTES = "\"'`"


def vector_selectors(expression: str) -> list[str]:
    """The vector selectors of a PromQL expression (``name``, ``name{...}`` or ``{...}``), each
    once, in their order."""
    found: list[str] = []
    for begin, end in _selector_positions(expression):
        if expression[begin:end] not in found:
            found.append(expression[begin:end])
    return found


def span_growth(expression: str, start: datetime, stop: datetime) -> str:
    """The expression, evaluated at ``stop``, with each counter replaced by what each of its
    series grew from ``start``: its last sample in the span less its value at ``start``, or
    that last sample alone for a series born in the span. Arithmetic on the two drops the
    metric name, and series match on their other labels, as ``or`` does."""
    reach_ms = max(_milliseconds(stop.timestamp()) - _milliseconds(start.timestamp()), 1)
    pieces: list[str] = []
    done = 0
    for begin, end in _selector_positions(expression):
        selector = expression[begin:end]
        latest = f"last_over_time({selector}[{reach_ms}ms])"
        pieces += [expression[done:begin],
                   f"(({latest} - {selector} @ {start.timestamp():.3f}) or {latest})"]
        done = end
    return "".join(pieces) + expression[done:]


def _selector_positions(expression: str) -> list[tuple[int, int]]:
    """Where each vector selector of the expression begins and ends, in order.

    resets() takes a range of one selector, not of an expression, so a span's restarts are
    asked for selector by selector. A tokenizer rather than a regular expression: braces and
    brackets also occur in strings, and identifiers are also functions, keywords and the
    labels of by (...) lists. A selector that has a range already is refused, as is an
    expression without one: neither is a cumulative counter."""
    found: list[tuple[int, int]] = []
    position = 0
    while position < len(expression):
        char = expression[position]
        number = _NUMBER.match(expression, position) if char.isdigit() or char == "." else None
        name = _NAME.match(expression, position)
        if char in _QUOTES:
            position = _position_after(expression, position + 1, char)
            continue
        if char == "#":  # a comment may hold anything, to the end of its line
            line_end = expression.find("\n", position)
            position = len(expression) if line_end < 0 else line_end + 1
            continue
        if number is not None:
            position = number.end()
            continue
        if char == "[":  # a subquery's: a selector's is refused with the selector below
            raise PromQLError(f"{expression!r} takes a range: give the counters themselves, "
                              "e.g. sum(clicks_total{...}), and each span's increase is "
                              "taken from them")
        if name is not None:
            word, following = name.group(), _skip_spaces(expression, name.end())
            if word.lower() in _LABEL_LISTS and expression.startswith("(", following):
                position = _position_after(expression, following + 1, ")")
                continue
            if word.lower() in _KEYWORDS or expression.startswith("(", following):
                position = name.end()
                continue
            end = (_position_after(expression, following + 1, "}")
                   if expression.startswith("{", following) else name.end())
        elif char == "{":
            end = _position_after(expression, position + 1, "}")
        else:
            position += 1
            continue
        selector = expression[position:end]
        if expression.startswith("[", _skip_spaces(expression, end)):
            raise PromQLError(f"{expression!r} takes a range: give sum({selector}), the "
                              "counter itself, and each span's increase is taken from it")
        found.append((position, end))
        position = end
    if not found:
        raise PromQLError(f"{expression!r} selects no series: give a counter, e.g. "
                          "sum(clicks_total{served_by=\"{version}\"})")
    return found


def _position_after(expression: str, position: int, closing: str) -> int:
    """The position after ``closing``, strings on the way skipped (a backslash escapes in
    "..." and '...', not in `...`)."""
    while position < len(expression):
        char = expression[position]
        if char == closing:
            return position + 1
        if char == "\\" and closing in "\"'":
            position += 1
        elif char in _QUOTES and closing not in _QUOTES:
            position = _position_after(expression, position + 1, char) - 1
        position += 1
    raise PromQLError(f"{expression!r} misses a closing {closing!r}: close it")


def _skip_spaces(expression: str, position: int) -> int:
    while position < len(expression) and expression[position].isspace():
        position += 1
    return position


def _milliseconds(seconds: float) -> int:
    return round(seconds * 1000)


def _for(text: str, version: str) -> str:
    return text.replace("{version}", version)


def _json_or_none(raw: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
