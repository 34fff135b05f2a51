"""`kappa metric define | list | drop`, `kappa experiment`, and `kappa cutover --strategy`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.cli.output import print_json, table
from orchestrator.errors import KappaError
from orchestrator.experiment.design import ExperimentDesign, Strategy
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role

Command = Callable[..., argparse.ArgumentParser]


def add_commands(sub: Any, command: Command) -> None:
    m = command(sub, "metric", "outcome metrics that judge an outcome cutover", json=False)
    actions = m.add_subparsers(dest="action", required=True, metavar="ACTION")
    d = command(actions, "define", "define (or replace) a job's outcome metric", "job", "name")
    query = d.add_mutually_exclusive_group(required=True)
    query.add_argument("--sql", help="a SELECT of (key, value, observed_at) over the "
                       "application's tables, with a {since} placeholder")
    query.add_argument("--sql-file", type=Path, help="the same, read from a file")
    query.add_argument("--promql", help="PromQL: the sum of the observed values served by "
                       "{version} (conversions, for a proportion), from counters labelled by it")
    d.add_argument("--promql-count", help="with --promql: the number of observations served by "
                   "{version}")
    d.add_argument("--promql-squares", help="with --promql, for a mean: the sum of the squared "
                   "values served by {version}")
    d.add_argument("--kind", choices=[k.value for k in Kind], required=True,
                   help="proportion (values 0/1) or mean")
    d.add_argument("--better", choices=["higher", "lower"], required=True,
                   help="which way the candidate should move the metric")
    d.add_argument("--role", choices=[r.value for r in Role], default="decision",
                   help="decision (decides the test) or guardrail (must not degrade)")
    d.add_argument("--margin", type=float, default=0.0,
                   help="how much worse than the baseline, relative to its mean, still passes "
                   "(0.02: 2 %%); guardrails need one")
    command(actions, "list", "the outcome metrics defined", "job?")
    command(actions, "drop", "forget an outcome metric", "job", "name")
    command(sub, "experiment", "the alias's latest outcome cutover and its evidence", "job",
            alias=True)


def add_cutover_options(co: argparse.ArgumentParser) -> None:
    co.add_argument("--strategy", choices=[s.value for s in Strategy],
                    help="test by the readers' outcomes instead of ramping: ab keeps a fixed "
                    "split, bandit moves it by Thompson sampling")
    co.add_argument("--metric", action="append", default=[],
                    help="an outcome metric (repeat for several; `kappa metric define`)")
    defaults = ExperimentDesign(Strategy.AB, ("m",))
    for flag, kind, field, text in [
            ("--start-percent", int, "start_percent", "the candidate's share at the start"),
            ("--min-percent", int, "min_percent", "the bandit's lowest share"),
            ("--max-percent", int, "max_percent", "the bandit's highest share"),
            ("--max-step", int, "max_step", "points the bandit moves the share by per look"),
            ("--look-seconds", float, "look_seconds", "seconds between looks"),
            ("--max-duration", float, "max_duration_s", "seconds until the policy's default "
             "decides: promote if non-inferior, else roll back"),
            ("--no-data-timeout", float, "no_data_timeout_s", "seconds without usable evidence "
             "before rolling back"),
            ("--alpha", float, "alpha", "the chance of any false decision"),
            ("--mixture-sd", float, "mixture_sd", "the mSPRT's mixture, in standard deviations"),
            ("--min-per-arm", int, "min_per_arm", "observations per arm before any judgement"),
            ("--attribution-delay", float, "attribution_delay_s", "the longest seconds from "
             "serving a key to its outcome, for metrics without served_at: outcomes whose key "
             "changed arm within it are left out"),
            ("--pre-period", float, "pre_period_s", "seconds of each key's outcomes before the "
             "test (the baseline serving it) that take the keys' own differences out of the "
             "test; 0 reads none")]:
        co.add_argument(flag, type=kind, dest=field,
                        help=f"{text} (default {getattr(defaults, field):g})")
    co.add_argument("--allow-non-inferior", action="store_true",
                    help="promote a candidate shown no worse than its margins")


def design(args: argparse.Namespace) -> ExperimentDesign | None:
    """The outcome test the cutover's flags ask for; None for a ramp."""
    if args.strategy is None:
        if args.metric:
            raise KappaError("--metric judges an outcome cutover: add --strategy ab or "
                             "--strategy bandit")
        return None
    given = {name: getattr(args, name) for name in _DESIGN_FIELDS
             if getattr(args, name, None) is not None}
    return ExperimentDesign(Strategy(args.strategy), tuple(args.metric),
                            allow_non_inferior=args.allow_non_inferior, **given)


_DESIGN_FIELDS = ("start_percent", "min_percent", "max_percent", "max_step", "look_seconds",
                  "max_duration_s", "no_data_timeout_s", "alpha", "mixture_sd", "min_per_arm",
                  "attribution_delay_s", "pre_period_s")


def run(service: Any, args: argparse.Namespace) -> int:
    desk = service.outcomes
    if args.command == "experiment":
        found = desk.experiment(args.job, args.alias)
        if args.json:
            print_json(found)
        elif found is None:
            print(f"no outcome cutover of {args.job} yet: `kappa cutover {args.job} VERSION "
                  "--strategy bandit --metric NAME`")
        else:
            print(_experiment_text(found))
        return 0
    if args.action == "define":
        text = args.sql_file.read_text() if args.sql_file else args.sql
        metric = OutcomeMetric(args.name, Kind(args.kind), args.better == "higher",
                               Role(args.role), args.margin, sql=text, promql=args.promql,
                               promql_count=args.promql_count,
                               promql_squares=args.promql_squares)
        result = desk.define(args.job, metric)
        print_json(result) if args.json else print(
            f"{'replaced' if result['replaced'] else 'defined'} outcome metric {args.name} of "
            f"{args.job}: {args.kind}, {args.better} is better, {args.role}")
        return 0
    if args.action == "list":
        rows = desk.listed(args.job)
        print_json(rows) if args.json else print(table(
            ["job", "metric", "kind", "better", "role", "margin", "query"],
            [[r["job"], r["metric"], r["kind"], r["better"], r["role"], r["margin"],
              r["sql"] or r["promql"]] for r in rows]))
        return 0
    dropped = desk.drop(args.job, args.name)
    if not dropped:
        raise KappaError(f"{args.job} has no outcome metric {args.name}: `kappa metric list "
                         f"{args.job}` shows what is defined")
    print_json({"job": args.job, "metric": args.name, "dropped": True}) if args.json else \
        print(f"dropped outcome metric {args.name} of {args.job}")
    return 0


def _experiment_text(found: dict[str, Any]) -> str:
    design = found["design"]
    lines = [f"cutover plan {found['plan']}: {found['job']} {found['version']} against "
             f"{found['baseline']} on alias {found['alias']}, {design['strategy']} test, "
             f"{found['status']}" + (f" ({found['reason']})" if found["reason"] else "")]
    looks = [look for look in found["looks"] if look["look"] > 0]
    if not looks:
        return "\n".join([*lines, "no look taken yet"])
    last = looks[-1]
    lines.append(f"look {last['look']} at {last['at']}: {last['verdict']} ({last['reason']}); "
                 f"the candidate's share {last['percent']} % -> {last['next_percent']} %"
                 + (f"; P(candidate better) {last['evidence']['p_better']:.3f}"
                    if last["evidence"].get("p_better") is not None else ""))
    rows = []
    for m in last["evidence"]["metrics"]:
        for side in ("baseline", "candidate"):
            arm = m[side]
            keys = arm.get("keys")
            rows.append([m["metric"], m["role"], arm["version"], arm["count"],
                         "unknown" if keys is None else keys, _num(arm["mean"]),
                         _interval(arm["interval"]),
                         _num(m["difference"]) if side == "candidate" else "",
                         _interval(m["interval"]) if side == "candidate" else "",
                         f"{_num(m['statistic'])} / {_num(m['threshold'])}"
                         if side == "candidate" else "",
                         m["outcome"] if side == "candidate" else ""])
    lines.append(table(["metric", "role", "arm", "count", "keys", "mean", "interval",
                        "difference", "its interval", "statistic / threshold", "outcome"], rows))
    for m in last["evidence"]["metrics"]:
        if m.get("unit") is not None:  # looks stored before the key was the unit have none
            lines.append(f"{m['metric']}: the {m['unit']} is the unit, variance "
                         f"{_num(m.get('design_effect'))} x what counting observations says"
                         + (f", keys' history slope {_num(m['history_slope'])}"
                            if m.get("history_slope") else "")
                         + (f"; {m['left_out']} observations left out (their key moved "
                            "within --attribution-delay)" if m.get("left_out") else ""))
    if last["evidence"].get("clock_skew_s") is not None:
        lines.append(f"the outcome database's clock against the catalog's: "
                     f"{last['evidence']['clock_skew_s']:+.3f} s")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def _interval(bounds: list[float] | None) -> str:
    return "unknown" if bounds is None else f"[{bounds[0]:.4g}, {bounds[1]:.4g}]"
