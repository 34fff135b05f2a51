"""Switch benchmark: readers hammer an alias while it is switched back and forth.

    .venv/bin/python bench/switch.py [--switches 50] [--readers 32] [--reader-cost] [--json]

Sets up its own embedded stack (or uses KAPPA_PG_DSN / KAPPA_KAFKA_BOOTSTRAP), deploys
pageview_counts v1 and v2 on a fresh topic and lets them catch up (nothing more is produced, so
both tables hold still while their drivers stay live), then runs `run_scenario`: READERS
connections, in 4 processes of their own, query the alias continuously (a quarter of them hold
their transactions open for 1-3 s), and a lag sample is taken every second as `kappa agent`
does, while SWITCHES A/B steps, promotes and rollbacks run.
Prints switch latency (p50, p99, max) and the longest reader statement against the median one.
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
    statement_seconds: list[float] = field(default_factory=list)
    statements: int = 0
    reader_errors: list[str] = field(default_factory=list)
    duplicate_keys: int = 0
    stale_after_switch: list[str] = field(default_factory=list)
    # Per switch: time its thread and its PostgreSQL backend spent runnable but not running.
    runqueue_seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        sw = sorted(self.switch_seconds)
        st = sorted(self.statement_seconds)
        return {
            "switches": len(sw),
            "switch_p50_ms": round(1000 * statistics.median(sw), 2),
            "switch_p99_ms": round(1000 * sw[max(0, int(len(sw) * 0.99) - 1)], 2),
            "switch_max_ms": round(1000 * sw[-1], 2),
            "reader_statements": self.statements,
            # None with --readers 0: the switch's own cost, nothing competing with it.
            "reader_statement_p50_ms": round(1000 * statistics.median(st), 2) if st else None,
            "longest_reader_statement_ms": round(1000 * st[-1], 2) if st else None,
            "switch_runqueue_wait_p50_ms": round(1000 * statistics.median(self.runqueue_seconds),
                                                 2) if self.runqueue_seconds else None,
            "switch_time_share_waiting_for_a_cpu": round(
                sum(self.runqueue_seconds) / sum(sw), 3) if self.runqueue_seconds else None,
            "reader_errors": len(self.reader_errors),
            "duplicate_keys_seen": self.duplicate_keys,
            "stale_reads_after_switch": len(self.stale_after_switch),
        }


def runqueue_wait_s(*schedstats: str) -> float:
    """Seconds these threads have waited on a run queue (Linux schedstat's second field)."""
    total = 0
    for path in schedstats:
        with open(path) as f:
            total += int(f.read().split()[1])
    return total / 1e9


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
                            outcome.statement_seconds.append(elapsed)
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


def run_scenario(service: Any, settings: Any, job: str, *, switches: int = 50,
                 readers: int = 32, seed: int = 7) -> Outcome:
    """v1 and v2 must be caught up on a topic that receives nothing more, validated, and the
    alias `job` must serve v1 entirely."""
    import multiprocessing

    outcome = Outcome()
    spawn = multiprocessing.get_context("spawn")
    stop, results, started = spawn.Event(), spawn.Queue(), spawn.Value("i", 0)
    sampling = threading.Event()
    dsn = settings.pg_dsn
    alias = sql.SQL("{}.{}").format(sql.Identifier(settings.serving_schema), sql.Identifier(job))
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = {v: _rows(conn, settings.data_schema, f"{job}__{v}") for v in ("v1", "v2")}

    def sampler() -> None:
        """What `kappa agent` does: a lag sample every second, which the switches then read
        instead of asking the broker."""
        from orchestrator.service import Orchestrator

        agent = Orchestrator(settings)
        try:
            while not sampling.wait(1.0):
                agent.lag(job)
        finally:
            agent.close()

    groups = [list(range(i, readers, READER_PROCESSES)) for i in range(READER_PROCESSES)]
    processes = [spawn.Process(target=_reader_process, daemon=True,
                               args=(dsn, settings.serving_schema, job, g, seed, stop, results,
                                     started))
                 for g in groups if g]
    agent = threading.Thread(target=sampler, daemon=True)
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
    try:
        with psycopg.connect(dsn, autocommit=True) as verify:
            for i in range(switches):
                action, percent = CYCLE[i % len(CYCLE)]
                waited = runqueue_wait_s(*waits)
                began = time.monotonic()
                if action == "ab":
                    service.ab(job, "v2", percent, reason=f"bench step {i}")
                elif action == "promote":
                    service.promote(job, "v2", reason=f"bench step {i}")
                else:
                    service.rollback(job, reason=f"bench step {i}")
                outcome.switch_seconds.append(time.monotonic() - began)
                outcome.runqueue_seconds.append(runqueue_wait_s(*waits) - waited)
                # A statement that starts after the switch returned sees the new routing.
                served = {r[0]: tuple(r[1:]) for r in verify.execute(sql.SQL(
                    "SELECT url, views, total_duration_ms FROM {}").format(alias)).fetchall()}
                if action == "ab":
                    expected = {k: v for k, v in tables["v1"].items() if bucket(k) >= percent}
                    expected |= {k: v for k, v in tables["v2"].items() if bucket(k) < percent}
                else:
                    expected = tables["v2" if action == "promote" else "v1"]
                if served != expected:
                    outcome.stale_after_switch.append(f"switch {i} ({action} {percent})")
    finally:
        stop.set()
        sampling.set()
        for _ in processes:
            part = results.get(timeout=60)
            outcome.statements += part.statements
            outcome.statement_seconds += part.statement_seconds
            outcome.duplicate_keys += part.duplicate_keys
            outcome.reader_errors += part.reader_errors
        for p in processes:
            p.join(30)
        agent.join(30)
    return outcome


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
        print(json.dumps({**result, **({"reader_cost": cost} if cost else {})}, indent=2))
        return 0
    print("\n".join(f"{k:32} {v}" for k, v in result.items()))
    if cost:
        alias_cost.show(cost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
