"""`kappa promote | ab | rollback | history | diff | retire`."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.output import print_json, table


def run_alias_command(service: Any, args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "history":
        rows = service.history(args.job, args.alias)
        if args.json:
            print_json(rows)
        else:
            print(table(["when", "who", "alias", "action", "from", "to", "percent", "reason",
                         "lag"], [[r["at"], r["who"], r["alias"], r["action"], r["from"],
                                   r["to"], r["percent"], r["reason"], r["lag"]] for r in rows]))
        return 0
    if cmd == "diff":
        report = service.diff(args.job, args.version_a, args.version_b)
        if args.json:
            print_json(report.to_json())
        else:
            print(_diff_text(report))
        return 0 if report.passed else 1
    if cmd == "promote":
        result = service.promote(args.job, args.version, args.alias, force=args.force,
                                 reason=args.reason)
    elif cmd == "ab":
        result = service.ab(args.job, args.version, args.percent, args.alias, reason=args.reason,
                            breaking=args.breaking)
    elif cmd == "rollback":
        result = service.rollback(args.job, args.alias, reason=args.reason, force=args.force)
    else:
        result = service.retire(args.job, args.version, drop=args.drop)
    if args.json:
        print_json(result)
    elif cmd == "retire":
        print(f"{result['job']} {result['version']} retired"
              f"{'; its table and checkpoint are dropped' if result['dropped'] else ''}")
    else:
        split = (f"{result['candidate']} serves {result['percent']} % of keys, "
                 f"{result['primary']} the rest" if result["candidate"]
                 else f"{result['primary']} serves every key")
        print(f"{result['alias']}: {split}"
              + (f" (rollback goes to {result['rollback_to']})" if result["rollback_to"] else ""))
    return 0


def _diff_text(report: Any) -> str:
    lines = [f"{report.job}: {report.a} vs {report.b}"]
    if report.aligned:
        lines.append(f"aligned at the same source offsets: {report.offsets_a}")
    else:
        lines.append(f"NOT aligned: the versions' processed offsets differ by "
                     f"{report.offsets_apart} records ({report.a}: {report.offsets_a}; "
                     f"{report.b}: {report.offsets_b})")
    lines.append(f"rows: {report.rows_a} in {report.a}, {report.rows_b} in {report.b}; "
                 f"only in {report.a}: {report.only_in_a}; only in {report.b}: "
                 f"{report.only_in_b}")
    for column, count in report.differing.items():
        lines.append(f"same key, different {column}: {count}")
    for name, rows in report.samples.items():
        if rows:
            lines.append(f"samples {name}: {rows}")
    for check in report.guardrails:
        lines.append(f"guardrail {check.name!r}: {'passed' if check.passed else 'FAILED'}"
                     + (f" ({check.detail})" if check.detail else ""))
    lines.append(f"validation {report.verdict}; stored as {report.b}'s latest validation")
    return "\n".join(lines)
