"""The experiment stage of an outcome cutover: look, decide, move the split, until a promote or
a rollback.

Every look is stored (``experiment_looks``) before it acts, with its evidence; its figures are a
function of the observations before the look's instant and of the alias's routing history, so a
killed cutover run again computes the same figures from the same observations and goes on from
its last look. Share changes are ordinary `ab` switches, decisions ordinary promotes and
rollbacks, each with its reason in the alias's history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from orchestrator.catalog import events, outcomes
from orchestrator.catalog.db import connect
from orchestrator.errors import KappaError, ServiceUnavailableError, StateError
from orchestrator.experiment.attribution import spans_since
from orchestrator.experiment.by_key import NO_EVIDENCE, KeyedStrata
from orchestrator.experiment.design import ExperimentDesign
from orchestrator.experiment.look import Look, take_look
from orchestrator.experiment.metrics import OutcomeMetric, Role
from orchestrator.experiment.policy import Judgement, Verdict
from orchestrator.experiment.sequential import ArmSummary, arm_interval
from orchestrator.failpoints import fail_point
from orchestrator.metrics.promql import PrometheusOutcomes, PromQLError
from orchestrator.plan.lag_wait import switch_when_lag_allows

Say = Callable[[str], None]
_DECISIONS = {Verdict.PROMOTE.value, Verdict.ROLL_BACK.value}
_POLL_S = 1.0  # how often a wait between looks checks that the plan still runs
MAX_CLOCK_SKEW_S = 1.0  # between the catalog's clock and the outcome database's, per look


class ExperimentRunner:
    """One plan's experiment. ``host`` is the Cutover that owns the plan (its service, its
    catalog, its bookkeeping)."""

    def __init__(self, host: Any, design: ExperimentDesign):
        self.host, self.design = host, design
        self.settings = host.catalog.settings
        self.schema = self.settings.catalog_schema
        self._reader: PrometheusOutcomes | None = None
        self._served_at: dict[str, bool] = {}  # per SQL metric: does it give served_at?

    # Before anything is switched -------------------------------------------------------------
    def metrics(self) -> list[OutcomeMetric]:
        """The design's metrics, each checked against the database it reads: a query that
        fails, has other columns or writes is refused here, before any switch."""
        with self.host.catalog.connection() as conn:
            found = outcomes.resolve(conn, self.schema, self.host.job, self.design.metrics)
        if not any(m.role == Role.DECISION for m in found):
            raise StateError(f"the metrics {', '.join(self.design.metrics)} are all guardrails: "
                             "an outcome cutover needs a decision metric (--role decision)")
        with self._outcomes() as conn:
            since = outcomes.now(conn)
            for metric in found:
                if metric.sql is not None:
                    self._served_at[metric.name] = outcomes.probe(
                        conn, metric, since=since,
                        timeout_ms=self.settings.metric_statement_timeout_ms)
        promql = [m for m in found if m.promql is not None]
        if promql:
            versions = sorted({self.host._baseline(), self.host.version})
            for metric in promql:
                self._prometheus(metric).probe(metric, versions, since)
        return found

    # The stage -------------------------------------------------------------------------------
    def run(self) -> datetime | None:
        """Look until a decision; or, for a host that pauses between looks, return the
        instant of the next look, which the same call made then takes."""
        host, design = self.host, self.design
        history = self._looks()
        if history and history[-1]["verdict"] in _DECISIONS:
            self._act_on(history[-1])
            return None
        metrics = self.metrics()
        if not history:
            history = [self._start()]
        started: datetime = history[0]["at"]
        percent = int(history[-1]["next_percent"])
        self._apply_share(percent)  # a share the last look chose but a crash kept from serving
        number = int(history[-1]["look"])
        evidence_at = max((h["at"] for h in history if h["verdict"] != Verdict.NO_DATA.value),
                          default=started)
        baseline = str(history[0]["evidence"]["baseline"])
        # A look's time after the last look, not on a grid from the start: a host resumed late
        # (a deferred Airflow task on a loaded machine) took the overdue looks back to back, on
        # the same observations, the bandit moving its share by up to max_step at each.
        last_at: datetime = history[-1]["at"]
        while True:
            host._check_still_running()
            due = last_at + timedelta(seconds=design.look_seconds)
            at = self._wait_until(due)
            if at is None:
                return due
            number += 1
            look, evidence = self._look(metrics, baseline, started, at, percent, evidence_at)
            last_at = at
            if look.decision.verdict != Verdict.NO_DATA:
                evidence_at = at
            with host.catalog.connection() as conn, conn.transaction():
                outcomes.record_look(conn, self.schema, host.plan_id, number, at, percent,
                                     look.percent, look.decision.verdict.value,
                                     look.decision.reason, evidence)
            host.say(f"look {number}: {_summary(look)}")
            verdict = look.decision.verdict
            if verdict == Verdict.ROLL_BACK:
                self._decided(number, look, evidence)
                raise KappaError(f"the outcome test decided to roll back at look {number}: "
                                 f"{look.decision.reason}")
            if verdict == Verdict.PROMOTE:
                self._decided(number, look, evidence)
                self._promote(f"cutover plan {host.plan_id}, look {number}: "
                              f"{look.decision.reason}")
                fail_point("cutover.after_decision")
                return None
            if look.percent != percent:
                percent = look.percent
                self._apply_share(percent, f"cutover plan {host.plan_id}, look {number}: "
                                           f"{_posterior(look)}")

    def _act_on(self, look: dict[str, Any]) -> None:
        """A look decided, and the run that took it ended before the plan did (a crash, a
        catalog away): act on the stored decision rather than look again. A promote that
        committed is not undone, nor done twice."""
        host, number = self.host, int(look["look"])
        if look["verdict"] == Verdict.ROLL_BACK.value:
            raise KappaError(f"the outcome test decided to roll back at look {number}: "
                             f"{look['reason']}")
        info = host._serving()
        if not (info["primary"] == host.version and not info["candidate"]):
            self._promote(f"cutover plan {host.plan_id}, look {number}: {look['reason']}")

    def _promote(self, reason: str) -> None:
        host = self.host
        switch_when_lag_allows(lambda: host.service.promote(
            host.job, host.version, host.alias, reason=reason), host.say)

    def _start(self) -> dict[str, Any]:
        """The first A/B switch, and look 0 at the instant it committed."""
        host, design = self.host, self.design
        baseline = host._baseline()
        if baseline == host.version:
            raise StateError(f"alias {host.alias} already serves {host.version}")
        self._apply_share(design.start_percent, f"cutover plan {host.plan_id}: the "
                                                f"{design.strategy.value} test starts at "
                                                f"{design.start_percent} %")
        with host.catalog.connection() as conn, conn.transaction():
            at = outcomes.now(conn)
            evidence = {"baseline": baseline, "candidate": host.version}
            outcomes.record_look(conn, self.schema, host.plan_id, 0, at, design.start_percent,
                                 design.start_percent, "started", "the test starts", evidence)
            events.record(conn, self.schema, "experiment_started", job=host.job,
                          version=host.version, plan=host.plan_id, alias=host.alias,
                          baseline=baseline, design=design.to_json())
        return {"look": 0, "at": at, "next_percent": design.start_percent,
                "verdict": "started", "evidence": evidence}

    def _apply_share(self, percent: int, reason: str | None = None) -> None:
        host = self.host
        info = host._serving()
        if info["candidate"] == host.version and info["percent"] == percent:
            return
        why = reason or f"cutover plan {host.plan_id}: the share of the last look, {percent} %"
        switch_when_lag_allows(lambda: host.service.ab(
            host.job, host.version, percent, host.alias, reason=why, breaking=host.breaking),
            host.say)

    def _look(self, metrics: Sequence[OutcomeMetric], baseline: str, started: datetime,
              at: datetime, percent: int, evidence_at: datetime
              ) -> tuple[Look, dict[str, Any]]:
        host, delay, pre = self.host, self.design.attribution_delay_s, self.design.pre_period_s
        with host.catalog.connection() as conn:
            history = outcomes.routing_spans(conn, self.schema, host.alias)
        spans = spans_since(history, started)
        # Back to the attribution window's start or the keys' history's, the earlier.
        back = started - timedelta(seconds=max(delay, pre))
        routing = spans_since(history, back) if back < started else []
        strata: dict[str, KeyedStrata] = {}
        errors: dict[str, str] = {}
        left_out: dict[str, int] = {}
        for metric in metrics:
            if metric.promql is None:
                continue
            try:
                found, note = self._prometheus(metric).strata(
                    metric, spans, baseline=baseline, candidate=host.version, until=at)
                strata[metric.name] = KeyedStrata.of_observations(found)
                if note:
                    errors[metric.name] = note
            except PromQLError as exc:  # Prometheus away or the query failing now: no data
                errors[metric.name] = str(exc)
                strata[metric.name] = NO_EVIDENCE
        skew, refusal = None, None
        with self._outcomes() as conn:
            if any(m.promql is None for m in metrics):
                with host.catalog.connection() as catalog:
                    skew = outcomes.clock_skew(catalog, conn)
                if abs(skew) > MAX_CLOCK_SKEW_S:
                    refusal = (f"the outcome database's clock is {skew:+.3f} s off the "
                               f"catalog's (more than {MAX_CLOCK_SKEW_S:g} s): outcomes cannot "
                               "be placed in the routing's spans; synchronise the clocks (NTP)")
            for metric in metrics:
                if metric.promql is not None:
                    continue
                if refusal is not None:
                    strata[metric.name], errors[metric.name] = NO_EVIDENCE, refusal
                    continue
                how = outcomes.Attribution(spans, started, at,
                                           self._served_at.get(metric.name, False), delay,
                                           routing, pre)
                try:
                    strata[metric.name], left_out[metric.name] = outcomes.strata(
                        conn, metric, how, baseline=baseline, candidate=host.version,
                        since=back, timeout_ms=self.settings.metric_statement_timeout_ms)
                except psycopg.OperationalError as exc:
                    if conn.broken or conn.closed:
                        raise ServiceUnavailableError(
                            f"the outcome database went away during look: {exc}; run the "
                            "same cutover again to resume") from exc
                    errors[metric.name] = outcomes.first_line(exc)
                    strata[metric.name] = NO_EVIDENCE
                except psycopg.Error as exc:  # a query that fails now: no data, said
                    errors[metric.name] = outcomes.first_line(exc)
                    strata[metric.name] = NO_EVIDENCE
        look = take_look(self.design, metrics, strata, percent=percent,
                         elapsed_s=(at - started).total_seconds(),
                         silent_s=(at - evidence_at).total_seconds(), refusal=refusal)
        evidence = self._evidence(look, baseline, errors, left_out)
        evidence["clock_skew_s"] = skew
        return look, evidence

    def _evidence(self, look: Look, baseline: str, errors: dict[str, str],
                  left_out: dict[str, int]) -> dict[str, Any]:
        design = self.design
        metrics = []
        for j in look.decision.judgements:
            c, found = j.comparison, j.estimate
            metrics.append({
                "metric": j.metric.name, "role": j.metric.role.value,
                "kind": j.metric.kind.value, "outcome": j.outcome,
                "baseline": _arm(j, baseline, j.baseline, 0, design),
                "candidate": _arm(j, self.host.version, j.candidate, 1, design),
                "difference": c.difference if c else None,
                "interval": [c.low, c.high] if c else None,
                "statistic": c.statistic if c else None,
                "threshold": c.threshold if c else None,
                "strata": c.strata if c else 0, "margin": j.margin,
                "alpha": design.alpha_per_metric, "error": errors.get(j.metric.name),
                # The unit of analysis: keys (the alias splits keys), or observations where
                # the figures carry no key (PromQL counters).
                "unit": None if found is None else "key" if found.keys else "observation",
                "design_effect": found.design_effect if found else None,
                "history_slope": found.history_slope if found else None,
                "left_out": left_out.get(j.metric.name)})
        return {"baseline": baseline, "candidate": self.host.version, "metrics": metrics,
                "p_better": look.p_better, "share": look.percent,
                "strategy": design.strategy.value}

    def _decided(self, number: int, look: Look, evidence: dict[str, Any]) -> None:
        host = self.host
        with host.catalog.connection() as conn, conn.transaction():
            events.record(conn, self.schema, "experiment_decision", job=host.job,
                          version=host.version, plan=host.plan_id, look=number,
                          verdict=look.decision.verdict.value, reason=look.decision.reason,
                          evidence=evidence)

    def _wait_until(self, when: datetime) -> datetime | None:
        """The database's instant once ``when`` has come; None at once if it has not and the
        host pauses between looks (Airflow defers instead of holding a worker slot)."""
        while True:
            with self.host.catalog.connection() as conn:
                at = outcomes.now(conn)
            if at >= when:
                return at
            if self.host.pausing:
                return None
            time.sleep(min(_POLL_S, (when - at).total_seconds()))
            self.host._check_still_running()

    def _looks(self) -> list[dict[str, Any]]:
        with self.host.catalog.connection() as conn:
            return outcomes.looks(conn, self.schema, self.host.plan_id)

    def _prometheus(self, metric: OutcomeMetric) -> PrometheusOutcomes:
        if self._reader is None:
            self._reader = PrometheusOutcomes.of(self.settings, metric)
        return self._reader

    def _outcomes(self) -> Any:
        s = self.settings
        dsn, _ = s.require_services()
        return connect(s.outcomes_pg_dsn or dsn, autocommit=True)


def _arm(judgement: Judgement, version: str, summary: ArmSummary, side: int,
         design: ExperimentDesign) -> dict[str, Any]:
    found = judgement.estimate
    interval = None if found is None else arm_interval(
        summary.mean, found.arm_variances[side], found.observation_variance,
        alpha=design.alpha_per_metric, mixture_sd=design.mixture_sd)
    return {"version": version, "count": summary.count, "mean": summary.mean,
            "keys": found.keys[side] if found is not None and found.keys else None,
            "interval": list(interval) if interval else None}


def _posterior(look: Look) -> str:
    p = look.p_better
    return (f"bandit: P(candidate better) = {p:.3f}, share {look.percent} %" if p is not None
            else f"share {look.percent} %")


def _summary(look: Look) -> str:
    parts = [f"{look.decision.verdict.value} ({look.decision.reason})"]
    for j in look.decision.judgements:
        c = j.comparison
        parts.append(f"{j.metric.name}: {j.baseline.count}/{j.candidate.count} observations"
                     + (f", difference {c.difference:+.4g} in [{c.low:+.4g}, {c.high:+.4g}]"
                        if c else ""))
    if look.p_better is not None:
        parts.append(_posterior(look))
    return "; ".join(parts)
