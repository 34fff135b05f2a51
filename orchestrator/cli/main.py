"""The `kappa` command: parse, call one service method, print."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator.cli.output import ProgressBar, print_json, status_table, table
from orchestrator.errors import KappaError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kappa", description="Kappa-architecture reprocessing "
                                "orchestrator: replay versioned PySpark jobs from the log.")
    p.add_argument("--state-dir", help="state directory (default .kappa; env KAPPA_STATE_DIR)")
    p.add_argument("--kafka-bootstrap", help="Kafka bootstrap servers (env KAPPA_KAFKA_BOOTSTRAP)")
    p.add_argument("--spark-master", help="Spark master, local[*] or spark://HOST:PORT")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("deploy", help="register a job version and start replaying it")
    d.add_argument("job_file")
    d.add_argument("--wait", action="store_true", help="wait until it has caught up")
    d.add_argument("--timeout", type=float, help="seconds to wait with --wait")
    d.add_argument("--allow-gap", action="store_true",
                   help="deploy even if retention removed the start of the log")
    d.add_argument("--json", action="store_true")

    s = sub.add_parser("status", help="every version: state, driver, table, offsets, lag")
    s.add_argument("job", nargs="?")
    s.add_argument("--json", action="store_true")

    for name, text in (("stop", "stop a version's driver"),
                       ("restart", "resume a version from its checkpoint")):
        c = sub.add_parser(name, help=text)
        c.add_argument("job")
        c.add_argument("version")
        c.add_argument("--json", action="store_true")

    w = sub.add_parser("wait", help="wait until a version has caught up")
    w.add_argument("job")
    w.add_argument("version")
    w.add_argument("--max-lag", type=int, default=0, help="records behind that count as caught up")
    w.add_argument("--timeout", type=float)
    w.add_argument("--json", action="store_true")

    lg = sub.add_parser("lag", help="records and time behind the log end, rates, ETA, state")
    lg.add_argument("job", nargs="?")
    lg.add_argument("--version")
    lg.add_argument("--partitions", action="store_true", help="one row per partition")
    lg.add_argument("--watch", action="store_true", help="redraw every --interval seconds")
    lg.add_argument("--interval", type=float, default=2.0)
    lg.add_argument("--window", type=float, default=30.0,
                    help="evaluation window in seconds for rates and states")
    lg.add_argument("--json", action="store_true")

    for name, text in (("agent", "long-running agent: serves the Prometheus exporter"),
                       ("metrics", "Prometheus exporter (`kappa metrics serve`)")):
        m = sub.add_parser(name, help=text)
        if name == "metrics":
            m.add_argument("action", choices=["serve"])
        m.add_argument("--host", default="127.0.0.1")
        m.add_argument("--port", type=int, default=9464)
        m.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
        m.add_argument("--window", type=float, default=30.0, help="evaluation window, seconds")

    pr = sub.add_parser("promote", help="switch an alias to a version")
    pr.add_argument("job")
    pr.add_argument("version")
    pr.add_argument("--alias")
    pr.add_argument("--force", action="store_true",
                    help="promote even if not caught up or not validated (needs --reason)")
    pr.add_argument("--reason")
    pr.add_argument("--json", action="store_true")

    ab = sub.add_parser("ab", help="serve PERCENT %% of the keys from a version")
    ab.add_argument("job")
    ab.add_argument("version")
    ab.add_argument("--percent", type=int, required=True)
    ab.add_argument("--alias")
    ab.add_argument("--reason")
    ab.add_argument("--json", action="store_true")

    rb = sub.add_parser("rollback", help="back to what the alias served before this cutover")
    rb.add_argument("job")
    rb.add_argument("--alias")
    rb.add_argument("--reason")
    rb.add_argument("--json", action="store_true")

    co = sub.add_parser("cutover", help="validate, ramp with soaks and checks, promote")
    co.add_argument("job")
    co.add_argument("version")
    co.add_argument("--ramp", default="10,50,100", help="percentages, e.g. 10,50,100")
    co.add_argument("--soak", type=float, default=60.0, help="seconds at each step")
    co.add_argument("--alias")
    co.add_argument("--json", action="store_true")

    hi = sub.add_parser("history", help="every switch of the job's aliases")
    hi.add_argument("job")
    hi.add_argument("--alias")
    hi.add_argument("--json", action="store_true")

    df = sub.add_parser("diff", help="compare two versions' tables by key; run guardrails")
    df.add_argument("job")
    df.add_argument("version_a")
    df.add_argument("version_b")
    df.add_argument("--json", action="store_true")

    rt = sub.add_parser("retire", help="stop a version for good; --drop its table too")
    rt.add_argument("job")
    rt.add_argument("version")
    rt.add_argument("--drop", action="store_true")
    rt.add_argument("--json", action="store_true")

    e = sub.add_parser("events", help="the orchestrator's event log")
    e.add_argument("job", nargs="?")
    e.add_argument("--version")
    e.add_argument("--json", action="store_true")

    ps = sub.add_parser("produce-sample", help="produce the deterministic sample page views")
    ps.add_argument("--topic", default="pageviews")
    ps.add_argument("--count", type=int, default=200_000)
    ps.add_argument("--seed", type=int, default=1)
    ps.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    ps.add_argument("--json", action="store_true")

    dev = sub.add_parser("dev", help="the embedded PostgreSQL and Kafka-protocol broker")
    dev.add_argument("action", choices=["up", "down", "status", "env"])
    dev.add_argument("--json", action="store_true")

    demo = sub.add_parser("demo", help="the whole story on the embedded default")
    demo.add_argument("--count", type=int, default=200_000)
    demo.add_argument("--json", action="store_true")
    return p


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    return {"state_dir": args.state_dir, "kafka_bootstrap": args.kafka_bootstrap,
            "spark_master": args.spark_master}


def run(args: argparse.Namespace) -> int:
    from orchestrator.service import Orchestrator
    from orchestrator.settings import load_settings

    settings = load_settings(_flags(args))
    cmd = args.command
    if cmd == "dev":
        from orchestrator.cli.dev import run_dev

        return run_dev(settings, args.action, args.json)
    if cmd == "demo":
        from orchestrator.cli.demo import run_demo

        return run_demo(settings, args.count, args.json)

    service = Orchestrator(settings)
    if cmd == "deploy":
        result = service.deploy(args.job_file, allow_gap=args.allow_gap)
        st = result.status
        if not args.json:
            verb = "deployed" if result.created else "already deployed (same code)"
            print(f"{st.job} {st.version} {verb}: {st.state.value}, output {st.output_table}, "
                  f"driver pid {st.pid}")
        if args.wait:
            st = _wait(service, st.job, st.version, args.timeout, quiet=args.json)
        if args.json:
            print_json(st.to_json() | {"created": result.created})
        return 0
    if cmd == "status":
        statuses = service.status(args.job)
        if args.json:
            print_json([st.to_json() for st in statuses])
        else:
            print(status_table(statuses) if statuses else "no job versions deployed yet: "
                  "`kappa deploy jobs/<job>/<version>.py`")
        return 0
    if cmd in ("stop", "restart"):
        st = getattr(service, cmd)(args.job, args.version)
        print_json(st.to_json()) if args.json else print(status_table([st]))
        return 0
    if cmd == "wait":
        st = _wait(service, args.job, args.version, args.timeout, quiet=args.json,
                   max_lag=args.max_lag)
        if args.json:
            print_json(st.to_json())
        return 0
    if cmd == "lag":
        from orchestrator.cli.lag import run_lag

        return run_lag(service, args)
    if cmd == "cutover":
        try:
            ramp = [int(p) for p in args.ramp.split(",") if p.strip()]
        except ValueError as exc:
            raise KappaError(f"--ramp takes percentages like 10,50,100, not {args.ramp!r}") \
                from exc
        plan = service.cutover(args.job, args.version, ramp=ramp, soak_seconds=args.soak,
                               alias=args.alias, say=None if args.json else print)
        print_json(plan) if args.json else print(
            f"cutover plan {plan['plan']} succeeded: {plan['alias']} serves {plan['version']}")
        return 0
    if cmd in ("promote", "ab", "rollback", "history", "diff", "retire"):
        from orchestrator.cli.aliases import run_alias_command

        return run_alias_command(service, args)
    if cmd in ("agent", "metrics"):
        from orchestrator.cli.agent import run_agent

        return run_agent(service, args)
    if cmd == "events":
        rows = service.events(args.job, args.version)
        if args.json:
            print_json(rows)
        else:
            print(table(["at", "actor", "job", "version", "kind", "detail"],
                        [[r["at"], r["actor"], r["job"], r["version"], r["kind"], r["detail"]]
                         for r in rows]))
        return 0
    if cmd == "produce-sample":
        count = service.produce_sample(args.topic, args.count, args.seed, args.rate)
        if args.json:
            print_json({"topic": args.topic, "produced": count, "seed": args.seed})
        else:
            print(f"produced {count:,} sample events to {args.topic} (seed {args.seed})")
        return 0
    raise KappaError(f"unknown command {cmd}")


def _wait(service: Any, job: str, version: str, timeout: float | None, *, quiet: bool,
          max_lag: int = 0) -> Any:
    bar = None if quiet else ProgressBar(f"{job} {version}")
    try:
        return service.wait(job, version, timeout_s=timeout, max_lag=max_lag,
                            progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except KappaError as exc:
        if args.debug:
            raise
        red, reset = ("\033[31m", "\033[0m") if sys.stderr.isatty() else ("", "")
        print(f"{red}Error: {exc}{reset}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main"]
