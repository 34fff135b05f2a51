"""The replay budget's acceptance run: six catch-ups within a budget, beside a live version.

    .venv/bin/python bench/budget.py [--events 200000] [--live-rate 1000] [--slots 2]
                                     [--protect 12] [--runs RUN [RUN ...]] [--json]

Three runs, each on an embedded stack of its own (bench/stack.py), with `kappa agent` sampling
every second:
1. ``budget``: replay_slots = SLOTS, live first on (live_lag_protect_s = PROTECT);
2. ``budget_unprotected``: the same budget, live first off; the agent is killed once at the
   fail point queue.after_claim (exit, as SIGKILL) and started again;
3. ``all_at_once``: no budget (replay_slots = 0), live first off;
4. ``all_at_once_protected``: no budget, live first on: on a host where two catch-ups leave the
   live version room, live first matters when more run than the host can bear.

In each: a live version of pageview_counts reads a topic that a producer writes LIVE_RATE page
views a second into for the whole run; then six versions (three jobs, pageview_counts v1 and
v2 under each name) are deployed at once on a topic of EVENTS page views, with priorities that
make the order of their starts differ from the order of their deploys. Every second the bench
counts the catch-ups holding a slot and reads the live version's lag (seconds).

It reports, per run: the most catch-ups seen at once, the order in which the six started, the
live version's largest lag (and its 95th percentile) while they caught up, the pauses, the time
from the first deploy to the last `caught_up`, and how often each driver was started. It raises
if any output differs from the reference computed from the log (tests/reference.py), if the
budget was exceeded, if the starts did not follow priority then age (in a run that neither
paused nor held: there no one order is defined, and it reports null), or if a driver was started
twice but for its pauses. It asserts nothing about speed: the figures are compared within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for entry in (ROOT, ROOT / "tests"):  # run as a script; the reference lives with the tests
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from bench.kappa_runs import job_file, state_times  # noqa: E402
from bench.stack import bench_stack, report  # noqa: E402

# (job, version, priority) in the order they are deployed. Slots go by priority, then age.
SIX = (("budget_a", "v1", 0), ("budget_a", "v2", 0), ("budget_c", "v1", -1),
       ("budget_c", "v2", 0), ("budget_b", "v1", 5), ("budget_b", "v2", 5))
LIVE = ("budget_live", "v1")
# run: (within the budget, live first on, the agent killed once at queue.after_claim)
PLANS = {"budget": (True, True, False), "budget_unprotected": (True, False, True),
         "all_at_once": (False, False, False), "all_at_once_protected": (False, True, False)}


def expected_order(slots: int | None) -> list[tuple[str, str]]:
    """The first SLOTS start at their deploy; the rest by priority, then age."""
    if slots is None:
        return [(j, v) for j, v, _ in SIX]
    first, rest = list(SIX[:slots]), list(SIX[slots:])
    rest.sort(key=lambda s: -s[2])  # stable: equal priorities keep their deploy order
    return [(j, v) for j, v, _ in first + rest]


class _Producer(threading.Thread):
    """An application writing ``rate`` page views a second until stopped."""

    def __init__(self, service: Any, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.service, self.topic, self.rate = service, topic, rate
        self.done = threading.Event()

    def run(self) -> None:
        seed = 10_000
        while not self.done.is_set():
            self.service.produce_sample(self.topic, int(self.rate), seed=seed, rate=self.rate)
            seed += 1


def _agent(settings: Any, workdir: Path, fail_points: str | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, **settings.driver_environment(), "KAPPA_WARM_SPARES": "0"}
    env.pop("KAPPA_FAIL_POINTS", None)
    if fail_points:
        env["KAPPA_FAIL_POINTS"] = fail_points
    out = open(workdir / "agent.out", "ab")  # noqa: SIM115 - the agent's, closed with it
    return subprocess.Popen([str(Path(sys.executable).with_name("kappa")), "agent", "--port",
                             "0", "--no-archive", "--interval", "1", "--window", "10"],
                            env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    from orchestrator.process import stop_process

    stop_process(proc)


def one_run(name: str, events: int, live_rate: float, slots: int | None,
            protect: float | None, kill_agent: bool) -> dict[str, Any]:
    from integration.helpers import output
    from reference import compute

    with bench_stack(f"budget-{name}") as (stack_settings, _, workdir, tag):
        from orchestrator.service import Orchestrator

        settings = replace(stack_settings, replay_slots=slots or 0,
                           live_lag_protect_s=protect or 0, spark_driver_memory="768m")
        service = Orchestrator(settings)
        backlog, live_topic = f"budget_{tag}", f"budget_live_{tag}"
        service.produce_sample(backlog, events, seed=61)
        service.produce_sample(live_topic, 10_000, seed=62)
        service.deploy(job_file(workdir, live_topic, LIVE[1], name=LIVE[0]))
        service.wait(*LIVE, timeout_s=600)
        producer = _Producer(service, live_topic, live_rate)
        producer.start()
        agent = _agent(settings, workdir, "queue.after_claim=exit" if kill_agent else None)
        agent_exits: list[int | None] = []
        samples: list[dict[str, Any]] = []
        try:
            time.sleep(5)  # the live version under the producer, before the catch-ups
            began = time.time()
            for job, version, priority in SIX:
                service.deploy(job_file(workdir, backlog, version, shipped=version, name=job),
                               priority=priority)
            while True:
                if agent.poll() is not None:  # killed at the fail point: start another
                    agent_exits.append(agent.returncode)
                    agent = _agent(settings, workdir)
                holding, queued, _ = service.replays.counts()
                (live,) = service.lag(*LIVE)
                states = {(s.job, s.version): s.state.value for s in service.status()}
                samples.append({"t": round(time.time() - began, 1), "holding": holding,
                                "queued": queued, "live_lag_s": live.lag_seconds})
                if all(states[(j, v)] in ("caught_up", "live") for j, v, _ in SIX):
                    break
                failed = [(j, v) for j, v, _ in SIX if states[(j, v)] == "failed"]
                if failed:
                    raise RuntimeError(f"{name}: {failed[0]} failed: " + json.dumps(
                        [service.version_status(*failed[0]).reason,
                         service.events(*failed[0], limit=12)], default=str))
                if time.time() - began > 3600:
                    raise RuntimeError(f"{name}: not caught up in an hour: {states}")
                time.sleep(1.0)
        finally:
            producer.done.set()
            producer.join(60)
            _stop(agent)
        service.wait(*LIVE, timeout_s=600)
        ref, live_ref = (compute(settings.kafka_bootstrap, t) for t in (backlog, live_topic))
        wrong = [f"{j} {v}" for j, v, _ in SIX
                 if output(settings, f"{j}__{v}") != getattr(ref, v)]
        if output(settings, f"{LIVE[0]}__{LIVE[1]}") != live_ref.v1:
            wrong.append(" ".join(LIVE))
        if wrong:
            raise RuntimeError(f"{name}: outputs differ from the reference: {', '.join(wrong)}")
        return _figures(name, settings, service, samples, began, slots, agent_exits)


def _figures(name: str, settings: Any, service: Any, samples: list[dict[str, Any]],
             began: float, slots: int | None, agent_exits: list[int | None]) -> dict[str, Any]:
    starts = _starts(settings)
    order = list(dict.fromkeys(starts))
    launches = {f"{j} {v}": _launches(service, j, v) for j, v, _ in SIX}
    pauses: dict[str, int] = {}
    for event in service.events(limit=100_000):
        if event["kind"] == "paused":
            key = f"{event['job']} {event['version']}"
            pauses[key] = pauses.get(key, 0) + 1
    once = all(launches[k] == 1 + pauses.get(k, 0) for k in launches)
    # A pause puts a catch-up back in the queue, and the hold queues deploys: the first starts
    # then follow no one order, and are not judged (null).
    follows = None if pauses or _held(service) else order == expected_order(slots)
    if follows is False:
        raise RuntimeError(f"{name}: started in the order {order}, not {expected_order(slots)}")
    most = max(s["holding"] for s in samples)
    if slots is not None and most > slots:
        raise RuntimeError(f"{name}: {most} catch-ups at once over a budget of {slots}")
    if not once:
        raise RuntimeError(f"{name}: a driver was started twice: {launches}, pauses {pauses}")
    lags = [s["live_lag_s"] for s in samples if s["live_lag_s"] is not None]
    caught = max(state_times(settings, v, job=j)["caught_up"].timestamp() for j, v, _ in SIX)
    return {
        "run": name, "replay_slots": slots, "samples": len(samples),
        "most_catch_ups_at_once": most, "start_order": [" ".join(k) for k in order],
        "start_order_follows_priority_then_age": follows,
        "first_deploy_to_last_caught_up_s": round(caught - began, 1),
        "live_lag_max_s": round(max(lags), 1) if lags else None,
        "live_lag_p95_s": round(statistics.quantiles(lags, n=20)[-1], 1)
        if len(lags) >= 20 else None,
        "live_lag_unmeasured_samples": len(samples) - len(lags),
        "pauses": sum(pauses.values()), "launches": launches,
        "agent_exits_at_the_fail_point": list(agent_exits),
        "each_started_once_but_for_pauses": once, "outputs_equal_reference": True,
        "trace": samples,
    }


def _held(service: Any) -> bool:
    return any(e["kind"] == "replay_hold" for e in service.events(limit=100_000))


def _starts(settings: Any) -> list[tuple[str, str]]:
    from psycopg import sql

    from orchestrator.catalog.db import connect

    with connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT job, version FROM {}.events WHERE kind = 'state' AND detail ->> 'to' = "
            "'starting' AND job <> %s ORDER BY id").format(
                sql.Identifier(settings.catalog_schema)), (LIVE[0],)).fetchall()
    return [(str(j), str(v)) for j, v in rows]


def _launches(service: Any, job: str, version: str) -> int:
    """Drivers launched for the version: attempts its driver's log says started."""
    log = Path(service.version_status(job, version).log_path or "")
    return log.read_text().count("=== attempt ") if log.is_file() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="page views to replay")
    parser.add_argument("--live-rate", type=float, default=1000.0,
                        help="page views a second the live version's producer writes")
    parser.add_argument("--slots", type=int, default=2, help="replay_slots of the budget runs")
    parser.add_argument("--protect", type=float, default=12.0,
                        help="live_lag_protect_s of the protected run")
    parser.add_argument("--runs", nargs="+", choices=list(PLANS), default=list(PLANS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"events": args.events, "live_rate": args.live_rate,
                               "slots": args.slots, "live_lag_protect_s": args.protect}
    for name in args.runs:
        budget, protected, kill = PLANS[name]
        results[name] = one_run(name, args.events, args.live_rate,
                                args.slots if budget else None,
                                args.protect if protected else None, kill)
    if {"budget", "all_at_once"} <= set(results):  # the total time, all at once over budgeted
        results["all_at_once_over_budget_time"] = round(
            results["all_at_once"]["first_deploy_to_last_caught_up_s"]
            / results["budget"]["first_deploy_to_last_caught_up_s"], 2)
    if args.json:
        report(results, True)
    else:
        for name in args.runs:
            run = {k: v for k, v in results[name].items() if k != "trace"}
            print(f"== {name}")
            report(run, False, width=40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
