"""Prometheus series of the outcome cutovers that run now, from each one's last look: per arm
the observations, the mean and its always-valid interval; per metric the difference, its
interval, the statistic and its threshold; per alias the candidate's share, the bandit's
posterior probability and the verdict. A finished test has no series: its end is in the
alias's history and the event log."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily

PREFIX = "kappa_cutover"
VERDICTS = ("started", "continue", "no_data")


def cutover_metrics(experiments: Sequence[Mapping[str, Any]], job_label: str
                    ) -> Iterator[GaugeMetricFamily]:
    by_arm = [job_label, "alias", "metric", "arm", "version"]
    by_metric = [job_label, "alias", "metric", "version"]  # the candidate's version
    by_alias = [job_label, "alias", "version"]
    arm_figures = {
        "observations": ("Observations credited to the arm since the test began", "count"),
        "mean": ("The arm's mean of the metric (a rate for a proportion)", "mean"),
    }
    arms = {name: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=by_arm)
            for name, (doc, _) in arm_figures.items()}
    low = GaugeMetricFamily(f"{PREFIX}_mean_low", "Low end of the arm mean's always-valid "
                            "interval", labels=by_arm)
    high = GaugeMetricFamily(f"{PREFIX}_mean_high", "High end of the arm mean's always-valid "
                             "interval", labels=by_arm)
    metric_figures = {
        "difference": "Candidate minus baseline",
        "difference_low": "Low end of the difference's always-valid interval",
        "difference_high": "High end of the difference's always-valid interval",
        "statistic": "log of the mSPRT's mixture likelihood ratio against no difference",
        "threshold": "log(1 / alpha): the statistic that decides",
    }
    per_metric = {name: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=by_metric)
                  for name, doc in metric_figures.items()}
    share = GaugeMetricFamily(f"{PREFIX}_candidate_share_percent", "Percent of the alias's "
                              "keys the candidate serves from the last look on",
                              labels=by_alias)
    p_better = GaugeMetricFamily(f"{PREFIX}_p_better", "The bandit's posterior probability "
                                 "that the candidate is the better arm", labels=by_alias)
    looks = GaugeMetricFamily(f"{PREFIX}_looks", "Looks the test has taken", labels=by_alias)
    verdict = GaugeMetricFamily(f"{PREFIX}_verdict", "1 for the last look's verdict, 0 for the "
                                "others", labels=[*by_alias, "verdict"])
    for ex in experiments:
        alias_labels = [ex["job"], ex["alias"], ex["version"]]
        evidence = ex["evidence"]
        share.add_metric(alias_labels, float(ex["share"]))
        looks.add_metric(alias_labels, float(ex["look"]))
        for name in VERDICTS:
            verdict.add_metric([*alias_labels, name], 1.0 if ex["verdict"] == name else 0.0)
        if evidence.get("p_better") is not None:
            p_better.add_metric(alias_labels, float(evidence["p_better"]))
        for m in evidence.get("metrics", ()):
            metric_labels = [ex["job"], ex["alias"], m["metric"]]
            _metric_figures(per_metric, [*metric_labels, ex["version"]], m)
            for side in ("baseline", "candidate"):
                arm = m[side]
                labels = [*metric_labels, side, arm["version"]]
                for name, (_, key) in arm_figures.items():
                    if arm.get(key) is not None:  # unknown is no series, never 0
                        arms[name].add_metric(labels, float(arm[key]))
                if arm.get("interval"):
                    low.add_metric(labels, float(arm["interval"][0]))
                    high.add_metric(labels, float(arm["interval"][1]))
    yield from arms.values()
    yield low
    yield high
    yield from per_metric.values()
    yield from (share, p_better, looks, verdict)


def _metric_figures(families: Mapping[str, GaugeMetricFamily], labels: list[str],
                    m: Mapping[str, Any]) -> None:
    interval = m.get("interval") or (None, None)
    figures = {"difference": m.get("difference"), "difference_low": interval[0],
               "difference_high": interval[1], "statistic": m.get("statistic"),
               "threshold": m.get("threshold")}
    for name, value in figures.items():
        if value is not None:
            families[name].add_metric(labels, float(value))
