"""The outcome test's error rates, power and regret on traffic whose keys differ: the figures of
the README's statistics section, from the look that `kappa cutover` takes.

    .venv/bin/python bench/outcomes.py [--runs 1000] [--only NAME ...] [--json]

Every test draws keys with their own rates (Beta with a + b = 20 around the base rate, so
Beta(2, 18) at 10 %), a Zipf number of visits per key (the k-th most visited gets 1/k of them),
and assigns them by their A/B bucket (experiment/simulation.py). Scenarios:
- ``a_a``: A/A tests, ab and bandit, 40 and 400 keys, 100 looks of 400 observations: by key,
  by key with each key's history (20 looks' worth of traffic before the test, the baseline
  serving it), and with the observation as the unit (the command before);
- ``metrics``: A/A with three metrics (a decision proportion, a guardrail proportion and a
  guardrail mean), and with one mean as the decision metric;
- ``power``: a 10 % relative uplift on a 5 % base rate, 400 and 40 keys, looks of 2,000 (ab at
  50 %, --mixture-sd 0.05): keys that differ as above, without and with their history (50
  looks' worth), and keys 100 times more alike;
- ``regret``: a candidate 20 % worse (30 % against 24 %), 400 keys with their history, looks of
  200, ab and bandit from 50 %: the readers exposed to it before the rollback;
- ``late``: the same worse candidate, outcomes observed up to two looks after their key was
  served, a bandit with --allow-non-inferior (margin 10 %) and the keys' history: exposure and
  false promotions, credited by observed_at with and without --attribution-delay (two looks),
  and by served_at;
- ``few_keys``: A/A with 2, 3, 5, 8, 12 and 20 keys per arm, ab and bandit.
It asserts nothing; runs use both cores.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.experiment.design import ExperimentDesign, Strategy
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
from orchestrator.experiment.policy import Verdict
from orchestrator.experiment.simulation import SimulatedCutover, Traffic, simulate

CONVERTS = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, sql="SELECT {since}")
LENIENT = replace(CONVERTS, margin=0.1)
ERRORS = OutcomeMetric("errors", Kind.PROPORTION, False, Role.GUARDRAIL, margin=0.2,
                       sql="SELECT {since}")
SECONDS = OutcomeMetric("seconds", Kind.MEAN, True, Role.GUARDRAIL, margin=0.1,
                        sql="SELECT {since}")
SECONDS_DECIDE = replace(SECONDS, role=Role.DECISION, margin=0.0)
Job = tuple[ExperimentDesign, tuple[OutcomeMetric, ...], Traffic, int, int, bool]


def _design(strategy: Strategy, metrics: Sequence[OutcomeMetric], **changes: Any
            ) -> ExperimentDesign:
    values: dict[str, Any] = {"look_seconds": 1.0, "max_duration_s": 1e9, "min_per_arm": 100}
    values.update(changes)
    return ExperimentDesign(strategy, tuple(m.name for m in metrics), **values)


def _one(job: Job) -> SimulatedCutover:
    design, metrics, traffic, looks, seed, by_key = job
    return simulate(design, metrics, traffic, max_looks=looks, seed=seed, by_key=by_key)


def _runs(pool: ProcessPoolExecutor, design: ExperimentDesign,
          metrics: Sequence[OutcomeMetric], traffic: Traffic, looks: int, runs: int,
          by_key: bool = True) -> list[SimulatedCutover]:
    jobs = [(design, tuple(metrics), traffic, looks, seed, by_key) for seed in range(runs)]
    return list(pool.map(_one, jobs, chunksize=max(1, runs // 40)))


def _false(found: list[SimulatedCutover]) -> dict[str, Any]:
    wrong = sum(r.verdict != Verdict.CONTINUE for r in found)
    return {"runs": len(found), "false_decisions": wrong, "rate": wrong / len(found),
            "false_promotions": sum(r.verdict == Verdict.PROMOTE for r in found)}


def a_a(pool: ProcessPoolExecutor, runs: int) -> list[dict[str, Any]]:
    out = []
    for strategy in (Strategy.AB, Strategy.BANDIT):
        for keys in (40, 400):
            traffic = Traffic(keys=keys, per_look=400, base_rate=0.1)
            for unit, history, by_key in (("key", 0, True), ("key, with history", 20, True),
                                          ("observation", 0, False)):
                found = _runs(pool, _design(strategy, [CONVERTS]), [CONVERTS],
                              replace(traffic, history_looks=history), 100, runs, by_key)
                out.append({"strategy": strategy.value, "keys": keys, "unit": unit,
                            **_false(found)})
    return out


def metrics(pool: ProcessPoolExecutor, runs: int) -> list[dict[str, Any]]:
    traffic = Traffic(keys=400, per_look=400, base_rate=0.1, history_looks=20)
    out = []
    for chosen in ((CONVERTS, ERRORS, SECONDS), (SECONDS_DECIDE,)):
        for strategy in (Strategy.AB, Strategy.BANDIT):
            found = _runs(pool, _design(strategy, chosen), chosen, traffic, 100, runs)
            out.append({"metrics": [m.name for m in chosen], "strategy": strategy.value,
                        **_false(found)})
    return out


def power(pool: ProcessPoolExecutor, runs: int) -> list[dict[str, Any]]:
    out = []
    for keys, heterogeneity, history in ((400, 20.0, 0), (400, 20.0, 50), (400, 2000.0, 0),
                                         (40, 20.0, 50), (40, 2000.0, 0)):
        traffic = Traffic(keys=keys, per_look=2000, base_rate=0.05, lift=1.1,
                          heterogeneity=heterogeneity, history_looks=history)
        design = _design(Strategy.AB, [CONVERTS], start_percent=50, mixture_sd=0.05)
        found = _runs(pool, design, [CONVERTS], traffic, 400, max(runs // 10, 20))
        promoted = [r for r in found if r.verdict == Verdict.PROMOTE]
        out.append({"keys": keys, "beta_a_plus_b": heterogeneity, "history_looks": history,
                    "runs": len(found),
                    "promoted": len(promoted),
                    "rolled_back": sum(r.verdict == Verdict.ROLL_BACK for r in found),
                    "median_observations_to_promote":
                        statistics.median(r.observations for r in promoted) if promoted
                        else None})
    return out


def regret(pool: ProcessPoolExecutor, runs: int) -> list[dict[str, Any]]:
    traffic = Traffic(keys=400, per_look=200, base_rate=0.3, lift=0.8, history_looks=100)
    out = []
    for strategy in (Strategy.AB, Strategy.BANDIT):
        design = _design(strategy, [CONVERTS], start_percent=50, min_percent=5, max_percent=95)
        found = _runs(pool, design, [CONVERTS], traffic, 400, max(runs // 5, 20))
        out.append({"strategy": strategy.value, "runs": len(found),
                    "rolled_back": sum(r.verdict == Verdict.ROLL_BACK for r in found),
                    "promoted": sum(r.verdict == Verdict.PROMOTE for r in found),
                    "mean_exposure": statistics.mean(r.candidate_observations for r in found)})
    return out


def late(pool: ProcessPoolExecutor, runs: int) -> list[dict[str, Any]]:
    traffic = Traffic(keys=400, per_look=400, base_rate=0.3, lift=0.8, max_delay_looks=2.0,
                      history_looks=50)
    out = []
    for name, served, delay in (("observed_at", False, 0.0),
                                ("observed_at, --attribution-delay 2 looks", False, 2.0),
                                ("served_at", True, 0.0)):
        design = _design(Strategy.BANDIT, [LENIENT], start_percent=50, min_percent=5,
                         max_percent=95, allow_non_inferior=True, attribution_delay_s=delay)
        found = _runs(pool, design, [LENIENT], replace(traffic, by_served_at=served), 300,
                      max(runs // 5, 20))
        out.append({"credited_by": name, "runs": len(found),
                    "false_promotions": sum(r.verdict == Verdict.PROMOTE for r in found),
                    "rolled_back": sum(r.verdict == Verdict.ROLL_BACK for r in found),
                    "mean_exposure": statistics.mean(r.candidate_observations for r in found),
                    "mean_left_out": statistics.mean(r.left_out for r in found)})
    return out


def few_keys(pool: ProcessPoolExecutor, runs: int) -> list[dict[str, Any]]:
    """A/A with 2 to 20 keys per arm (#61 path 2): the keys split about evenly (ab at 50 %,
    the bandit from 50 % within 5-95 %), 100 looks of 400 observations. A rollback for want
    of evidence is not a false call; it is counted apart."""
    out = []
    for strategy in (Strategy.AB, Strategy.BANDIT):
        for per_arm in (2, 3, 5, 8, 12, 20):
            design = _design(strategy, [CONVERTS], start_percent=50, min_percent=5,
                             max_percent=95, no_data_timeout_s=1e9)
            found = _runs(pool, design, [CONVERTS], Traffic(keys=2 * per_arm, per_look=400,
                                                              base_rate=0.1), 100, runs)
            out.append({"strategy": strategy.value, "keys_per_arm": per_arm, **_false(found)})
    return out


SCENARIOS = {"a_a": a_a, "few_keys": few_keys, "metrics": metrics, "power": power,
             "regret": regret, "late": late}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    began = time.monotonic()
    with ProcessPoolExecutor(max_workers=2) as pool:
        for name, scenario in SCENARIOS.items():
            if args.only and name not in args.only:
                continue
            started = time.monotonic()
            result[name] = scenario(pool, args.runs)
            print(f"{name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
            if not args.json:
                for row in result[name]:
                    print(f"  {row}")
    result["seconds"] = round(time.monotonic() - began, 1)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
