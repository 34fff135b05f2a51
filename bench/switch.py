"""Switch benchmark: readers hammer an alias while it is switched back and forth.

    .venv/bin/python bench/switch.py [--switches 50] [--readers 32] [--reader-cost] [--json]

Sets up its own embedded stack (or uses KAPPA_PG_DSN / KAPPA_KAFKA_BOOTSTRAP), deploys
pageview_counts v1 and v2 on a fresh topic and lets them catch up (nothing more is produced, so
both tables hold still while their drivers stay live), then runs `run_scenario`: READERS
connections, in 4 processes of their own, query the alias continuously (a quarter of them hold
their transactions open for 1-3 s), and a lag sample is taken every second as `kappa agent`
does, while SWITCHES A/B steps, promotes and rollbacks run.
Prints switch latency (p50, p99, max) and the longest reader statement against the median one.

Two limits measured in the same run say what the switch itself costs on a busy machine: after
each switch, two round trips that do nothing (``BEGIN; SELECT 1`` and ``SELECT 1; COMMIT``, each
one pipeline, as a switch's two) on a connection of their own, so that a switch's time can be read
against the time any two round trips take under the same readers; and the longest reader statement
while the switches ran, against the longest in as long again with the same readers and no
switch.
The integration test runs the same scenario with assertions. With --reader-cost, it also runs
bench/alias_cost.py's measurement in the same stack: what a reader's statement pays through the
alias, at 0 %, 10 % and 100 %.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

CYCLE = (("ab", 10), ("ab", 50), ("promote", 100), ("rollback", 0))


@dataclass
class Outcome:
    switch_seconds: list[float] = field(default_factory=list)
    # (start, seconds) on CLOCK_MONOTONIC, which every process of the machine shares.
    statement_spans: list[tuple[float, float]] = field(default_factory=list)
    # The switches' phase, then as long with the same readers and no switch: the limit the
    # longest reader statement is read against (a statement that overlapped a switch is
    # likelier to be a long one, so comparing those with the rest would be biased).
    switching_phase: tuple[float, float] | None = None
    quiet_phase: tuple[float, float] | None = None
    # Switches that found no fresh lag sample and asked the broker (their events' lag_from).
    asked_the_broker: int | None = None
    sampler_exit_code: int | None = None  # not 0: the lag sampler failed (its stderr says why)
    # Two round trips that do nothing, after each switch: the machine's floor for a switch.
    floor_seconds: list[float] = field(default_factory=list)
    statements: int = 0
    reader_errors: list[str] = field(default_factory=list)
    duplicate_keys: int = 0
    stale_after_switch: list[str] = field(default_factory=list)
    # Per switch: time its thread and its PostgreSQL backend spent runnable but not running.
    runqueue_seconds: list[float] = field(default_factory=list)
    # Per switch: CPU time its thread and its backend used (schedstat's first field).
    cpu_seconds: list[float] = field(default_factory=list)
    floor_runqueue_seconds: list[float] = field(default_factory=list)

    @property
    def statement_seconds(self) -> list[float]:
        return [seconds for _, seconds in self.statement_spans]

    def summary(self) -> dict[str, Any]:
        sw = sorted(self.switch_seconds)
        st = sorted(self.statement_seconds)
        floor = sorted(self.floor_seconds)
        with_switches = longest_begun_in(self.statement_spans, self.switching_phase)
        without = longest_begun_in(self.statement_spans, self.quiet_phase)
        return {
            "switches": len(sw),
            "switch_p50_ms": _ms(statistics.median(sw)),
            "switch_p99_ms": _ms(p99(sw)),
            "switch_max_ms": _ms(sw[-1]),
            "floor_two_round_trips_p50_ms": _ms(statistics.median(floor)) if floor else None,
            "floor_two_round_trips_p99_ms": _ms(p99(floor)) if floor else None,
            "switch_p99_over_floor_p99": round(p99(sw) / p99(floor), 2) if floor else None,
            "reader_statements": self.statements,
            # None with --readers 0: the switch's own cost, nothing competing with it.
            "reader_statement_p50_ms": _ms(statistics.median(st)) if st else None,
            "longest_reader_statement_ms": _ms(st[-1]) if st else None,
            "longest_reader_statement_while_switching_ms": _ms(with_switches)
            if with_switches is not None else None,
            "longest_reader_statement_in_as_long_without_switches_ms": _ms(without)
            if without is not None else None,
            "switch_runqueue_wait_p50_ms": round(1000 * statistics.median(self.runqueue_seconds),
                                                 2) if self.runqueue_seconds else None,
            "switch_time_share_waiting_for_a_cpu": round(
                sum(self.runqueue_seconds) / sum(sw), 3) if self.runqueue_seconds else None,
            "switch_cpu_p50_ms": _ms(statistics.median(self.cpu_seconds))
            if self.cpu_seconds else None,
            "floor_runqueue_wait_p50_ms": _ms(statistics.median(self.floor_runqueue_seconds))
            if self.floor_runqueue_seconds else None,
            "switches_that_asked_the_broker": self.asked_the_broker,
            "lag_sampler_exit_code": self.sampler_exit_code,
            "reader_errors": len(self.reader_errors),
            "duplicate_keys_seen": self.duplicate_keys,
            "stale_reads_after_switch": len(self.stale_after_switch),
        }


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def p99(ordered: list[float]) -> float:
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def longest_begun_in(spans: list[tuple[float, float]], phase: tuple[float, float] | None
                     ) -> float | None:
    """The longest of the ``spans`` (start, seconds) that began within ``phase`` (start,
    seconds); None if none did."""
    if phase is None:
        return None
    began, seconds = phase
    inside = [s for start, s in spans if began <= start < began + seconds]
    return max(inside) if inside else None


def two_round_trips(conn: psycopg.Connection) -> None:
    """A switch's two round trips with nothing in them: the floor under the same load."""
    with conn.pipeline():
        conn.execute("BEGIN")
        first = conn.execute("SELECT 1")
    with conn.pipeline():
        second = conn.execute("SELECT 1")
        conn.execute("COMMIT")
    assert first.fetchone() == second.fetchone() == (1,)


def scheduled_s(*schedstats: str) -> tuple[float, float]:
    """Seconds these threads have run on a CPU and waited on a run queue (Linux schedstat)."""
    ran = waited = 0
    for path in schedstats:
        with open(path) as f:
            fields = f.read().split()
        ran += int(fields[0])
        waited += int(fields[1])
    return ran / 1e9, waited / 1e9


def bucket(key: str) -> int:
    return int(hashlib.md5(key.encode()).hexdigest()[:8], 16) % 100


def _rows(conn: psycopg.Connection, schema: str, table: str) -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(sql.SQL("SELECT url, views, total_duration_ms FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(table))).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


# Readers run in processes of their own: in the switching process, 32 threads would make every
# statement of a switch wait for the GIL, and the figure would be the bench's, not the switch's.
READER_PROCESSES = 4


def _reader_process(dsn: str, serving_schema: str, job: str, indexes: list[int], seed: int,
                    stop: Any, results: Any, started: Any) -> None:
    """Runs the readers ``indexes`` as threads until ``stop``; puts one partial Outcome."""
    outcome = Outcome()
    lock = threading.Lock()
    alias = sql.SQL("{}.{}").format(sql.Identifier(serving_schema), sql.Identifier(job))
    check = sql.SQL("SELECT url, count(*) FROM {} GROUP BY url HAVING count(*) > 1").format(alias)

    counted = dict.fromkeys(indexes, False)

    def reader(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        holder = index % 4 == 0  # holds its transaction open for seconds
        try:
            with psycopg.connect(dsn, autocommit=not holder) as conn:
                while not stop.is_set():
                    began_tx = time.monotonic()
                    while True:
                        began = time.monotonic()
                        dupes = conn.execute(check).fetchall()
                        elapsed = time.monotonic() - began
                        if not counted[index]:
                            counted[index] = True
                            with started.get_lock():
                                started.value += 1
                        with lock:
                            outcome.statements += 1
                            outcome.statement_spans.append((began, elapsed))
                            outcome.duplicate_keys += len(dupes)
                        if not holder or time.monotonic() - began_tx > rng.uniform(1, 3) \
                                or stop.is_set():
                            break
                        time.sleep(0.05)
                    if holder:
                        conn.commit()
        except Exception as exc:  # every reader error counts; none is expected
            with lock:
                outcome.reader_errors.append(f"reader {index}: {exc}")

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in indexes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(outcome)


def _sampler_process(settings: Any, job: str, stop: Any) -> None:
    """What `kappa agent` does: a lag sample every second, which the switches then read
    instead of asking the broker."""
    from orchestrator.service import Orchestrator

    agent = Orchestrator(settings)
    try:
        while not stop.wait(1.0):
            agent.lag(job)
    finally:
        agent.close()


def run_scenario(service: Any, settings: Any, job: str, *, switches: int = 50,
                 readers: int = 32, seed: int = 7) -> Outcome:
    """v1 and v2 must be caught up on a topic that receives nothing more, validated, and the
    alias `job` must serve v1 entirely."""
    import multiprocessing

    outcome = Outcome()
    spawn = multiprocessing.get_context("spawn")
    stop, results, started = spawn.Event(), spawn.Queue(), spawn.Value("i", 0)
    sampling = spawn.Event()
    dsn = settings.pg_dsn
    alias = sql.SQL("{}.{}").format(sql.Identifier(settings.serving_schema), sql.Identifier(job))
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = {v: _rows(conn, settings.data_schema, f"{job}__{v}") for v in ("v1", "v2")}

    groups = [list(range(i, readers, READER_PROCESSES)) for i in range(READER_PROCESSES)]
    processes = [spawn.Process(target=_reader_process, daemon=True,
                               args=(dsn, settings.serving_schema, job, g, seed, stop, results,
                                     started))
                 for g in groups if g]
    # A process of its own, as `kappa agent` is: a thread here would hold the switching
    # process's GIL while it samples, and the switches would wait for it.
    agent = spawn.Process(target=_sampler_process, args=(settings, job, sampling), daemon=True)
    service.lag(job)  # the first samples, before the first switch
    for p in processes:
        p.start()
    agent.start()
    # The switches are measured against readers that are all running already.
    deadline = time.monotonic() + 120
    while started.value < readers and time.monotonic() < deadline:
        time.sleep(0.1)
    with service._switching() as board:  # the kept connection, opened before the first switch
        backend = board.conn.info.backend_pid
    waits = ("/proc/thread-self/schedstat", f"/proc/{backend}/schedstat")
    read_alias = sql.SQL("SELECT url, views, total_duration_ms FROM {}").format(alias)
    try:
        with psycopg.connect(dsn, autocommit=True) as verify, \
                psycopg.connect(dsn, autocommit=True) as probe:
            probe_waits = ("/proc/thread-self/schedstat",
                           f"/proc/{probe.info.backend_pid}/schedstat")
            switching_began = time.monotonic()
            for i in range(switches):
                action, percent = CYCLE[i % len(CYCLE)]
                ran, waited = scheduled_s(*waits)
                began = time.monotonic()
                if action == "ab":
                    service.ab(job, "v2", percent, reason=f"bench step {i}")
                elif action == "promote":
                    service.promote(job, "v2", reason=f"bench step {i}")
                else:
                    service.rollback(job, reason=f"bench step {i}")
                outcome.switch_seconds.append(time.monotonic() - began)
                ran_after, waited_after = scheduled_s(*waits)
                outcome.runqueue_seconds.append(waited_after - waited)
                outcome.cpu_seconds.append(ran_after - ran)
                _, waited = scheduled_s(*probe_waits)
                began = time.monotonic()
                two_round_trips(probe)
                outcome.floor_seconds.append(time.monotonic() - began)
                outcome.floor_runqueue_seconds.append(scheduled_s(*probe_waits)[1] - waited)
                # A statement that starts after the switch returned sees the new routing.
                served = {r[0]: tuple(r[1:]) for r in verify.execute(read_alias).fetchall()}
                if action == "ab":
                    expected = {k: v for k, v in tables["v1"].items() if bucket(k) >= percent}
                    expected |= {k: v for k, v in tables["v2"].items() if bucket(k) < percent}
                else:
                    expected = tables["v2" if action == "promote" else "v1"]
                if served != expected:
                    outcome.stale_after_switch.append(f"switch {i} ({action} {percent})")
            outcome.switching_phase = (switching_began, time.monotonic() - switching_began)
            # As long again at the same pace: each switch's time waited out instead, then the
            # same empty round trips and read of the alias; no switch.
            quiet_began = time.monotonic()
            for seconds in outcome.switch_seconds:
                time.sleep(seconds)
                two_round_trips(probe)
                verify.execute(read_alias).fetchall()
            outcome.quiet_phase = (quiet_began, time.monotonic() - quiet_began)
    finally:
        stop.set()
        sampling.set()
        for _ in processes:
            part = results.get(timeout=60)
            outcome.statements += part.statements
            outcome.statement_spans += part.statement_spans
            outcome.duplicate_keys += part.duplicate_keys
            outcome.reader_errors += part.reader_errors
        for p in processes:
            p.join(30)
        agent.join(30)
        outcome.sampler_exit_code = agent.exitcode
    outcome.asked_the_broker = asked_the_broker(settings, job)
    return outcome


def asked_the_broker(settings: Any, job: str) -> int:
    """The bench's switches whose event says a lag came from the broker, not a sample."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM {}.events WHERE job = %s AND kind LIKE 'alias\\_%%' "
            "AND detail ->> 'reason' LIKE 'bench step %%' AND EXISTS (SELECT FROM "
            "jsonb_each_text(detail -> 'lag_from') f WHERE f.value = 'broker')").format(
            sql.Identifier(settings.catalog_schema)), (job,)).fetchone()
    return int(row[0]) if row else 0


def prepare(service: Any, job: str) -> None:
    """Wait for both versions, validate each against the other, serve v1."""
    for version in ("v1", "v2"):
        service.wait(job, version, timeout_s=600)
    service.diff(job, "v2", "v1")
    service.diff(job, "v1", "v2")
    # v1 declares no guardrails, so its validation checks nothing: serving it first is forced.
    service.promote(job, "v1", force=True, reason="switch scenario: start on v1")


def main() -> int:
    import argparse
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))  # run as a script: bench/ is not a package on the path
    from bench import alias_cost
    from bench.stack import bench_stack

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switches", type=int, default=50)
    parser.add_argument("--readers", type=int, default=32)
    parser.add_argument("--reader-cost", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--per-switch", action="store_true",
                        help="with --json: also each switch's and its floor's milliseconds")
    args = parser.parse_args()
    with bench_stack("switch", serving=True) as (settings, service, workdir, tag):
        topic = f"bench_switch_{tag}"
        service.produce_sample(topic, 50_000, seed=3)
        for version in ("v1", "v2"):
            source = (root / "jobs" / "pageview_counts" / f"{version}.py").read_text()
            path = workdir / f"{version}.py"
            path.write_text(re.sub(r"^TOPICS = .*$", f'TOPICS = ["{topic}"]', source,
                                   flags=re.M))
            service.deploy(path)
        prepare(service, "pageview_counts")
        outcome = run_scenario(service, settings, "pageview_counts", switches=args.switches,
                               readers=args.readers)
        for version in ("v1", "v2"):
            service.stop("pageview_counts", version)  # the CPU to the next measurement
        cost = alias_cost.reader_cost(service, settings, workdir, tag, records=300_000,
                                      users=150_000, runs=15) if args.reader_cost else None
    result = outcome.summary()
    if args.json:
        per_switch = {"switch_ms": [_ms(s) for s in outcome.switch_seconds],
                      "floor_ms": [_ms(s) for s in outcome.floor_seconds]}
        print(json.dumps({**result, **({"reader_cost": cost} if cost else {}),
                          **(per_switch if args.per_switch else {})}, indent=2))
        return 0
    print("\n".join(f"{k:32} {v}" for k, v in result.items()))
    if cost:
        alias_cost.show(cost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
