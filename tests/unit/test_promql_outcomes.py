"""PromQL outcome metrics' pure parts: what a definition must give, how an arm's figures in
each routing span come from cumulative counters, and which selectors of a query are asked for
their resets (Prometheus itself is in the integration tests of outcome cutovers and of
resets)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import KappaError
from orchestrator.experiment.attribution import RoutingSpan
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
from orchestrator.experiment.sequential import NOTHING, summarize
from orchestrator.metrics import promql
from orchestrator.metrics.promql import PrometheusOutcomes, PromQLError, summary_of

T0 = datetime(2026, 11, 1, tzinfo=UTC)
SUM = 'sum(clicks_total{served_by="{version}"})'
COUNT = 'sum(reads_total{served_by="{version}"})'
SQUARES = 'sum(seconds_squared_total{served_by="{version}"})'


@pytest.mark.parametrize(("kind", "kwargs", "says"), [
    (Kind.PROPORTION, {"promql": SUM}, "also needs --promql-count"),
    (Kind.PROPORTION, {"promql": SUM, "promql_count": "sum(reads_total)"},
     "its --promql-count must select the serving version"),
    (Kind.MEAN, {"promql": SUM, "promql_count": COUNT}, "needs --promql-squares"),
    (Kind.PROPORTION, {"promql": SUM, "promql_count": COUNT, "promql_squares": SQUARES},
     "drop --promql-squares"),
    (Kind.PROPORTION, {"sql": "SELECT {since}", "promql_count": COUNT}, "go with --promql"),
])
def test_an_incomplete_promql_metric_is_refused_in_one_line(
        kind: Kind, kwargs: dict[str, str], says: str) -> None:
    with pytest.raises(KappaError, match=says) as error:
        OutcomeMetric("m", kind, True, Role.DECISION, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)


@given(st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), min_size=1,
                max_size=200))
def test_an_arm_from_counters_equals_the_arm_from_its_values(values: list[float]) -> None:
    expected = summarize(values)
    found = summary_of(Kind.MEAN, float(len(values)), sum(values), sum(v * v for v in values))
    assert found.count == expected.count
    assert found.total == pytest.approx(expected.total, abs=1e-6)
    assert found.squares == pytest.approx(expected.squares, rel=1e-6, abs=1e-3)


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=500))
def test_a_proportion_needs_no_squares(values: list[float]) -> None:
    expected = summarize(values)
    found = summary_of(Kind.PROPORTION, float(len(values)), sum(values), None)
    assert (found.count, found.total) == (expected.count, expected.total)
    assert found.squares == pytest.approx(expected.squares, abs=1e-9)


_OLDEST = re.compile(r"min\(timestamp\((?P<selector>.+)\)\)")
_RESETS = re.compile(r"sum\(resets\((?P<selector>.+)\[(?P<reach_ms>\d+)ms\]\)\)")


class _Counters(PrometheusOutcomes):
    """Cumulative counters by (query, instant), one series each, as Prometheus would answer
    them, and their growth between two of those instants; also the timestamp of the oldest
    sample a selector's instant value uses, and the resets Prometheus counts for a selector in
    the range that ends at an instant (none unless told)."""

    def __init__(self, known: dict[tuple[str, datetime], float],
                 oldest: dict[tuple[str, datetime], datetime] | None = None,
                 resets: dict[tuple[str, datetime], int] | None = None):
        super().__init__("http://unused", timeout_s=1)
        self.known = known
        self.oldest = oldest or {}
        self.resets = resets or {}
        self.asked: list[tuple[str, datetime]] = []

    def value(self, query: str, at: datetime) -> float | None:
        self.asked.append((query, at))
        if found := _OLDEST.fullmatch(query):
            sample = self.oldest.get((found["selector"], at))
            return None if sample is None else sample.timestamp()
        if found := _RESETS.fullmatch(query):
            return self.resets.get((found["selector"], at), 0)
        instants = sorted({instant for _, instant in self.known})
        for counter in {counter for counter, _ in self.known}:
            for start in instants:
                if query == promql.span_growth(counter, start, at):
                    last = self.known.get((counter, at))
                    return None if last is None else last - self.known.get((counter, start), 0)
        return self.known.get((query, at))


def _at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_span_gets_the_counters_difference_of_each_arm_it_served() -> None:
    metric = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, promql=SUM,
                           promql_count=COUNT)
    spans = [RoutingSpan(_at(0), "v1", "v2", 10), RoutingSpan(_at(10), "v1", "v2", 30)]
    v1s, v1c = SUM.replace("{version}", "v1"), COUNT.replace("{version}", "v1")
    v2s, v2c = SUM.replace("{version}", "v2"), COUNT.replace("{version}", "v2")
    known = {(v1c, _at(0)): 100, (v1s, _at(0)): 30, (v1c, _at(10)): 190, (v1s, _at(10)): 57,
             (v1c, _at(20)): 260, (v1s, _at(20)): 78,
             # v2 serves its first reader in the first span: no series at its start
             (v2c, _at(10)): 10, (v2s, _at(10)): 4, (v2c, _at(20)): 40, (v2s, _at(20)): 13}
    reader = _Counters(known)
    found, note = reader.strata(metric, spans, baseline="v1", candidate="v2", until=_at(20))
    assert note is None
    assert [(a.count, a.total, b.count, b.total) for a, b in found] == [
        (90, 27.0, 10, 4.0), (70, 21.0, 30, 9.0)]
    # Span starts are kept for the next look; its own end, the look's instant, is not.
    reader.asked.clear()
    reader.strata(metric, spans, baseline="v1", candidate="v2", until=_at(20))
    assert {at for _, at in reader.asked} == {_at(20)}


def test_a_counter_that_went_down_leaves_its_span_out_and_says_so() -> None:
    metric = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, promql=SUM,
                           promql_count=COUNT)
    spans = [RoutingSpan(_at(0), "v1", "v2", 50), RoutingSpan(_at(10), "v1", "v2", 50),
             RoutingSpan(_at(20), "v3", None, 0)]
    known = {}
    for version, counts in (("v1", (10, 50, 60, 70)), ("v2", (10, 5, 20, 30))):
        for seconds, value in zip((0, 10, 20, 30), counts, strict=True):
            known[(COUNT.replace("{version}", version), _at(seconds))] = value
            known[(SUM.replace("{version}", version), _at(seconds))] = value / 10
    found, note = _Counters(known).strata(metric, spans, baseline="v1", candidate="v2",
                                          until=_at(30))
    assert found[0] == (summary_of(Kind.PROPORTION, 40, 4.0, None), NOTHING)
    assert found[1][1].count == 15
    assert found[2] == (NOTHING, NOTHING)  # a third version served every key
    assert note is not None and "routing span 1 " in note


@pytest.mark.parametrize(("expression", "selectors"), [
    ('sum(clicks_total{served_by="v1"})', ['clicks_total{served_by="v1"}']),
    ('sum by (url) (reads_total{served_by="v1", url=~"/a.*"})',
     ['reads_total{served_by="v1", url=~"/a.*"}']),
    ('sum(a_total{served_by="v1"}) + sum without (pod, job) (b_total{served_by="v1"})',
     ['a_total{served_by="v1"}', 'b_total{served_by="v1"}']),
    ('sum({__name__="reads_total", served_by="v1"})',
     ['{__name__="reads_total", served_by="v1"}']),
    ('sum(reads_total{path="/a{b}]", served_by="v1"}) / sum(reads_total{path="/a{b}]", '
     'served_by="v1"})', ['reads_total{path="/a{b}]", served_by="v1"}']),
    ('label_replace(sum by (src) (x_total{served_by=\'v1\'}), "dst", "{x}(", "src", `(.*)`)',
     ["x_total{served_by='v1'}"]),
    ('SUM BY (url) (a_total) * ON (url) GROUP_LEFT (team) sum by (url, team) (b:rate_total) '
     '> bool 0.5e3 or count_values("v{", c_total offset 5m) and sum(d_total @ 1700000000)',
     ["a_total", "b:rate_total", "c_total", "d_total"]),
])
def test_the_selectors_of_an_expression_are_its_metrics_not_its_words(
        expression: str, selectors: list[str]) -> None:
    assert promql.vector_selectors(expression) == selectors


@pytest.mark.parametrize(("expression", "says"), [
    ('sum(rate(clicks_total{served_by="v1"}[5m]))',
     r'takes a range: give sum\(clicks_total\{served_by="v1"\}\)'),
    ('sum(clicks_total{served_by="v1"} [1h] offset 1d)', "takes a range"),
    ('max_over_time(sum(clicks_total{served_by="v1"})[1h:1m])', "takes a range"),
    ("vector(1) + time()", "selects no series: give a counter"),
])
def test_a_query_that_is_not_a_counter_is_refused_in_one_line(expression: str, says: str
                                                                ) -> None:
    with pytest.raises(PromQLError, match=says) as error:
        promql.vector_selectors(expression)
    assert "\n" not in str(error.value)


def test_a_counter_reset_and_regrown_past_its_start_leaves_its_span_out() -> None:
    """The application restarted in the first span: v1's reads went from 100,000 to 0 and
    regrew to 120,000, so the sums' difference (20,000 reads, 2,000 conversions) is no figure of
    the span. Prometheus counts that reset; the second span is whole."""
    metric = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, promql=SUM,
                           promql_count=COUNT)
    spans = [RoutingSpan(_at(0), "v1", "v2", 50), RoutingSpan(_at(10), "v1", "v2", 50)]
    known: dict[tuple[str, datetime], float] = {}
    for version, counts in (("v1", (100_000, 120_000, 120_400)), ("v2", (0, 10, 410))):
        for seconds, value in zip((0, 10, 20), counts, strict=True):
            if value:
                known[(COUNT.replace("{version}", version), _at(seconds))] = value
                known[(SUM.replace("{version}", version), _at(seconds))] = value / 10
    v1_reads = 'reads_total{served_by="v1"}'
    # The start's value of v1 came from a sample 1.5 s older than the span's start.
    oldest = {(v1_reads, _at(0)): _at(0) - timedelta(milliseconds=1500)}
    reader = _Counters(known, oldest, resets={(v1_reads, _at(10)): 1})
    found, note = reader.strata(metric, spans, baseline="v1", candidate="v2", until=_at(20))
    assert found[0][0] == NOTHING, found
    assert found[0][1] == summary_of(Kind.PROPORTION, 10, 1.0, None)
    assert found[1] == (summary_of(Kind.PROPORTION, 400, 40.0, None),
                        summary_of(Kind.PROPORTION, 400, 40.0, None))
    assert note is not None and "routing span 1 (" in note and "reset" in note, note
    # Back to that oldest sample, and 1 ms more; v2 had no series at the start: the span.
    assert (f"sum(resets({v1_reads}[11501ms]))", _at(10)) in reader.asked
    assert ('sum(resets(reads_total{served_by="v2"}[10000ms]))', _at(10)) in reader.asked
