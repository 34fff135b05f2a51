"""The `kappa` command: parse, call one service method, print."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator.cli import outcomes as outcome_commands
from orchestrator.cli.output import ProgressBar, print_error, print_json, status_table, table
from orchestrator.errors import KappaError
from orchestrator.states import RunState

BREAKING_HELP = ("split even when the version removes output columns (its keys read NULL "
                 "there) or retypes them (served as text while both serve); a version that "
                 "only adds columns needs no flag")


# What each positional of the commands means: the reference (docs/reference/cli.md) shows it.
POSITIONAL_HELP = {
    "job": "the job's name (JOB in its file)",
    "version": "the version's label (VERSION in its file), e.g. v2",
    "job_file": "the job's Python file",
    "name": "the outcome metric's name",
    "version_a": "the first version's label",
    "version_b": "the second version's label",
}
JSON_HELP = "print JSON, for scripts"
ALIAS_HELP = "the alias (default: the job's name)"


def _command(sub: Any, name: str, text: str, *positionals: str, alias: bool = False,
             json: bool = True) -> argparse.ArgumentParser:
    """A subcommand with its positionals ("job?" is optional), ``--alias`` for the alias
    commands, and ``--json`` for scripts."""
    c: argparse.ArgumentParser = sub.add_parser(name, help=text, description=text)
    for arg in positionals:
        if arg.endswith("?"):
            c.add_argument(arg[:-1], nargs="?", help=f"{POSITIONAL_HELP[arg[:-1]]}; "
                                                     "all of them if left out")
        else:
            c.add_argument(arg, help=POSITIONAL_HELP[arg])
    if alias:
        c.add_argument("--alias", help=ALIAS_HELP)
    if json:
        c.add_argument("--json", action="store_true", help=JSON_HELP)
    return c


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kappa", description="Kappa-architecture reprocessing "
                                "orchestrator: replay versioned PySpark jobs from the log.")
    p.add_argument("--state-dir", help="state directory (default .kappa; env KAPPA_STATE_DIR)")
    p.add_argument("--kafka-bootstrap", help="Kafka bootstrap servers (env KAPPA_KAFKA_BOOTSTRAP)")
    p.add_argument("--spark-master", help="Spark master, local[*] or spark://HOST:PORT")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = _command(sub, "deploy", "register a job version and start replaying it", "job_file")
    d.add_argument("--wait", action="store_true", help="wait until it has caught up")
    d.add_argument("--timeout", type=float, help="seconds to wait with --wait")
    d.add_argument("--allow-gap", action="store_true",
                   help="deploy even if retention removed the start of the log")
    d.add_argument("--allow-incompatible", action="store_true",
                   help="deploy an Avro job whose reader schema cannot read some of the log's "
                   "writer schemas: their records go to the dead-letter table")
    d.add_argument("--priority", default="0",
                   help="its place in the replay queue when replay_slots are all taken: an "
                   "integer from -1000 to 1000, higher first, then the older (default 0)")
    q = _command(sub, "queue", "the replay budget: catch-ups holding slots, queued versions, "
                 "ETAs, and who hands the slots out")
    q.add_argument("action", nargs="?", choices=["keep"],
                   help="keep: hand out the slots every --interval seconds until stopped, as "
                   "`kappa agent` does (`kappa dev up` runs one)")
    q.add_argument("--interval", type=float, default=2.0,
                   help="keep: seconds between looks (default 2)")

    _command(sub, "status", "every version: state, driver, table, offsets, lag", "job?")
    _command(sub, "stop", "stop a version's driver", "job", "version")
    r = _command(sub, "restart", "resume a version from its checkpoint", "job", "version")
    r.add_argument("--allow-gap", action="store_true",
                   help="if the log changed under the version (topic recreated, retention past "
                   "what it read), go on from the log start and record the gap")
    r.add_argument("--quarantine", action="store_true",
                   help="re-run the batch that keeps failing range by range, move the records "
                   "that fail to the dead-letter table with their error, and go on")

    w = _command(sub, "wait", "wait until a version has caught up", "job", "version")
    w.add_argument("--max-lag", type=int, default=0, help="records behind that count as caught up")
    w.add_argument("--timeout", type=float, help="seconds to wait at most (default: no limit)")

    lg = _command(sub, "lag", "records and time behind the log end, rates, ETA, state", "job?")
    lg.add_argument("--version", help="only this version of the job")
    lg.add_argument("--partitions", action="store_true", help="one row per partition")
    lg.add_argument("--watch", action="store_true", help="redraw every --interval seconds")
    lg.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    lg.add_argument("--window", type=float, default=30.0,
                    help="evaluation window in seconds for rates and states")

    for name, text in (("agent", "long-running agent: serves the Prometheus exporter and "
                                 "restarts this host's drivers that died"),
                       ("metrics", "Prometheus exporter (`kappa metrics serve`)")):
        m = _command(sub, name, text, json=False)
        if name == "metrics":
            m.add_argument("action", choices=["serve"], help="serve: run the exporter")
        m.add_argument("--host", default="127.0.0.1", help="address to serve /metrics on")
        m.add_argument("--port", type=int, default=9464, help="port to serve /metrics on")
        m.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
        m.add_argument("--window", type=float, default=30.0, help="evaluation window, seconds")
        if name == "agent":
            m.add_argument("--no-restart", dest="restart", action="store_false",
                           help="do not restart this host's drivers that died")
            m.add_argument("--no-archive", dest="archive", action="store_false",
                           help="do not archive the topics that deployed jobs read")

    pr = _command(sub, "promote", "switch an alias to a version", "job", "version", alias=True)
    pr.add_argument("--force", action="store_true",
                    help="promote even if not caught up or not validated (needs --reason)")
    pr.add_argument("--reason", help="why, kept in the alias's history")

    ab = _command(sub, "ab", "serve PERCENT %% of the keys from a version", "job", "version",
                  alias=True)
    ab.add_argument("--percent", type=int, required=True,
                    help="share of the keys the version serves, 0 to 100")
    ab.add_argument("--reason", help="why, kept in the alias's history")
    ab.add_argument("--breaking", action="store_true", help=BREAKING_HELP)

    rb = _command(sub, "rollback", "back to what the alias served before this cutover", "job",
                  alias=True)
    rb.add_argument("--force", action="store_true",
                    help="roll back even to a version that is stopped or failed (needs --reason)")
    rb.add_argument("--reason", help="why, kept in the alias's history")

    co = _command(sub, "cutover", "validate, ramp with soaks and checks, promote", "job",
                  "version", alias=True)
    co.add_argument("--ramp", default="10,50,100", help="percentages, e.g. 10,50,100")
    co.add_argument("--soak", type=float, default=60.0, help="seconds at each step")
    co.add_argument("--breaking", action="store_true", help=BREAKING_HELP)
    outcome_commands.add_cutover_options(co)
    outcome_commands.add_commands(sub, _command)

    _command(sub, "history", "every switch of the job's aliases", "job", alias=True)
    _command(sub, "diff", "compare two versions' tables by key; run guardrails", "job",
             "version_a", "version_b")
    rt = _command(sub, "retire", "stop a version for good; --drop its table too", "job",
                  "version")
    rt.add_argument("--drop", action="store_true", help="drop its output table too")

    e = _command(sub, "events", "the orchestrator's event log, newest first", "job?")
    e.add_argument("--version", help="only this version's events")
    e.add_argument("--limit", type=int, default=1000, help="how many events (default 1000)")

    ps = _command(sub, "produce-sample",
                  "produce deterministic sample page views or profile changes")
    ps.add_argument("--topic", default="pageviews", help="topic to write (default pageviews)")
    ps.add_argument("--count", type=int, default=200_000, help="how many records")
    ps.add_argument("--seed", type=int, default=1, help="the same seed gives the same records")
    ps.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    ps.add_argument("--kind", choices=["pageviews", "profiles"],
                    help="what to produce (default: profiles for a topic named profiles*, "
                    "else pageviews)")
    ps.add_argument("--users", type=int, help="user ids 1..N (default 5000)")
    ps.add_argument("--format", choices=["json", "avro", "protobuf"], default="json",
                    dest="event_format", help="json, or avro or protobuf in the schema "
                    "registry's wire format (page views, two schema versions registered at "
                    "KAPPA_SCHEMA_REGISTRY_URL)")
    ps.add_argument("--transactional", action="store_true",
                    help="produce in transactions of 1,000 records and abort every 5th")
    ps.add_argument("--invalid-share", type=float,
                    help="share of invalid events in [0, 1) (default: 0.4 %% of page views, "
                    "0.1 %% of profile changes)")

    dev = _command(sub, "dev", "the embedded PostgreSQL and Kafka-protocol broker")
    dev.add_argument("action", choices=["up", "down", "status", "env", "reset"],
                     help="up: start (or restore) the stack; down: stop it; status; env: its "
                     "settings as export lines; reset: delete its state")
    dev.add_argument("--memory", action="store_true",
                     help="up: keep the log in the broker's memory only (lost when it stops)")
    dev.add_argument("--s3", action="store_true",
                     help="up: the broker keeps the log in a local S3 server (slow to read a "
                     "log written at a steady rate)")
    dev.add_argument("--yes", action="store_true", help="reset: do not ask for confirmation")

    from orchestrator.cli.archive import add_archive_parser

    add_archive_parser(sub)
    demo = _command(sub, "demo", "the whole story on the embedded default")
    demo.add_argument("--count", type=int, default=200_000, help="page views to produce")
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

        return run_dev(settings, args.action, args.json, memory=args.memory, s3=args.s3,
                       yes=args.yes)
    if cmd == "demo":
        from orchestrator.cli.demo import run_demo

        return run_demo(settings, args.count, args.json)

    service = Orchestrator(settings)
    if cmd == "deploy":
        result = service.deploy(args.job_file, allow_gap=args.allow_gap, priority=args.priority,
                                allow_incompatible=args.allow_incompatible)
        st = result.status
        for warning in result.warnings:
            print(f"Warning: output may depend on batch boundaries: {warning}", file=sys.stderr)
        if not args.json:
            verb = "deployed" if result.created else "already deployed (same code)"
            how = f"driver pid {st.pid}" if st.pid else st.reason
            print(f"{st.job} {st.version} {verb}: {st.state.value}, output {st.output_table}, "
                  f"{how}")
        if args.wait:
            st = _wait(service, st.job, st.version, args.timeout, quiet=args.json)
        if args.json:
            print_json(st.to_json() | {"created": result.created,
                                       "warnings": list(result.warnings)})
        return 0
    if cmd == "status":
        statuses = service.status(args.job)
        if args.json:
            print_json([st.to_json() for st in statuses])
        else:
            print(status_table(statuses) if statuses else "no job versions deployed yet: "
                  "`kappa deploy jobs/<job>/<version>.py`")
        if any(st.state == RunState.QUEUED for st in statuses):
            from orchestrator.cli.queue import unkept_warning

            unkept = unkept_warning(service.replays.keepers())
            if unkept is not None:  # on stderr beside --json, whose stdout scripts parse
                print(unkept, file=sys.stderr if args.json else sys.stdout)
        return 0
    if cmd in ("stop", "restart"):
        st = (service.restart(args.job, args.version, allow_gap=args.allow_gap,
                              quarantine=args.quarantine)
              if cmd == "restart" else service.stop(args.job, args.version))
        print_json(st.to_json()) if args.json else print(status_table([st]))
        return 0
    if cmd == "wait":
        st = _wait(service, args.job, args.version, args.timeout, quiet=args.json,
                   max_lag=args.max_lag)
        if args.json:
            print_json(st.to_json())
        return 0
    if cmd == "queue":
        from orchestrator.cli.queue import run_queue

        return run_queue(service, args)
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
                               alias=args.alias, say=None if args.json else print,
                               experiment=outcome_commands.design(args),
                               breaking=args.breaking)
        if args.json:
            print_json(plan)
        elif plan["status"] != "already_serving":  # the plan said so already
            print(f"cutover plan {plan['plan']} succeeded: {plan['alias']} serves "
                  f"{plan['version']}")
        return 0
    if cmd in ("metric", "experiment"):
        return outcome_commands.run(service, args)
    if cmd in ("promote", "ab", "rollback", "history", "diff", "retire"):
        from orchestrator.cli.aliases import run_alias_command

        return run_alias_command(service, args)
    if cmd in ("agent", "metrics"):
        from orchestrator.cli.agent import run_agent

        return run_agent(service, args)
    if cmd == "archive":
        from orchestrator.cli.archive import run_archive

        return run_archive(service, args)
    if cmd == "events":
        rows = service.events(args.job, args.version, limit=args.limit)
        if args.json:
            print_json(rows)
        else:
            print(table(["at", "actor", "job", "version", "kind", "detail"],
                        [[r["at"], r["actor"], r["job"], r["version"], r["kind"], r["detail"]]
                         for r in rows]))
        return 0
    if cmd == "produce-sample":
        if args.users is not None and args.users < 1:
            raise KappaError(f"--users must be at least 1, not {args.users}")
        if args.invalid_share is not None and not 0 <= args.invalid_share < 1:
            raise KappaError(f"--invalid-share must be in [0, 1), not {args.invalid_share:g}")
        kind = args.kind or ("profiles" if args.topic.startswith("profiles") else "pageviews")
        count = service.produce_sample(args.topic, args.count, args.seed, args.rate, kind=kind,
                                       users=args.users, invalid_share=args.invalid_share,
                                       transactional=args.transactional,
                                       event_format=args.event_format)
        if args.json:
            print_json({"topic": args.topic, "produced": count, "seed": args.seed,
                        "kind": kind, "transactional": args.transactional,
                        "format": args.event_format})
        else:
            what = "profile changes" if kind == "profiles" else "page views"
            how = (" in transactions of 1,000, every 5th aborted" if args.transactional else "")
            print(f"produced {count:,} sample {what} to {args.topic} (seed {args.seed}){how}")
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
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KappaError as exc:
        if args.debug:
            raise
        print_error(f"Error: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main"]
