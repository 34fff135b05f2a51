"""The dashboard's row for outcome cutovers (`kappa cutover --strategy ab|bandit`): per arm the
mean of each outcome metric with its always-valid interval, the difference with its interval,
the statistic against its threshold, and the candidate's share of keys with the bandit's
posterior probability. Series exist only while a test runs; its end is an alias switch (the
dashboard's annotations) and a line of `kappa history`."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

from orchestrator.metrics.dashboard_panels import query as _query
from orchestrator.metrics.dashboard_panels import timeseries as _timeseries

ROW_TITLE = "Cutover by outcome"
TITLES = ("Outcome per arm", "Candidate minus baseline", "Evidence against no difference",
          "Candidate's share of keys")
SEL = 'kappa_job=~"$job", version=~"$version"'
BY_ARM = "by (kappa_job, alias, metric, arm, version)"
BY_METRIC = "by (kappa_job, alias, metric, version)"
BY_ALIAS = "by (kappa_job, alias, version)"


def _with_interval(panel_id: int, title: str, description: str, metric: str, by: str,
                   legend: str) -> cogbuilder.Builder[dm.Panel]:
    """A figure and the low and high ends of its always-valid interval."""
    return _timeseries(
        panel_id, title, description, "short", 12,
        *(_query(ref, f"max {by} ({metric}{suffix}{{{SEL}}})", legend + label)
          for ref, suffix, label in (("A", "", ""), ("B", "_low", " low"),
                                     ("C", "_high", " high"))))


def cutover_panels(first_id: int) -> list[cogbuilder.Builder[dm.Panel]]:
    means = _with_interval(
        first_id, TITLES[0], "Each arm's mean of each outcome metric (a rate for a "
        "proportion), with the low and high ends of its always-valid interval, from the test's "
        "last look. Observations count for the version that served their key when observed.",
        "kappa_cutover_mean", BY_ARM, "{{metric}} {{arm}} {{version}}")
    difference = _with_interval(
        first_id + 1, TITLES[1], "The difference of the candidate's mean and the baseline's, "
        "with its always-valid interval: an interval above 0 (for a metric where higher is "
        "better) promotes, one below rolls back.", "kappa_cutover_difference", BY_METRIC,
        "{{metric}} {{version}}")
    evidence = _timeseries(
        first_id + 2, TITLES[2], "The mSPRT's statistic (log of the mixture likelihood ratio "
        "against no difference) and the threshold at which it decides, log(1 / alpha per "
        "metric).", "short", 12,
        _query("A", f"max {BY_METRIC} (kappa_cutover_statistic{{{SEL}}})",
               "{{metric}} {{version}} statistic"),
        _query("B", f"max {BY_METRIC} (kappa_cutover_threshold{{{SEL}}})",
               "{{metric}} {{version}} threshold"))
    share = _timeseries(
        first_id + 3, TITLES[3], "Percent of the alias's keys the candidate serves, and for "
        "the bandit 100 x the posterior probability that the candidate is better (where its "
        "share heads, by at most --max-step points per look).", "percent", 12,
        _query("A", f"max {BY_ALIAS} (kappa_cutover_candidate_share_percent{{{SEL}}})",
               "{{alias}} {{version}} share"),
        _query("B", f"100 * max {BY_ALIAS} (kappa_cutover_p_better{{{SEL}}})",
               "{{alias}} {{version}} P(better)"))
    return [means, difference, evidence, share]


def cutover_row(row_id: int) -> dashboard_b.Row:
    return dashboard_b.Row(ROW_TITLE).id(row_id)
