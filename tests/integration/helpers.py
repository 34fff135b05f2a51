"""Reading a version's results straight from PostgreSQL, for comparison with the reference."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql


def query(settings: Any, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(text, args).fetchall()  # type: ignore[arg-type]


def rows_hashed(conn: psycopg.Connection, serving_schema: str, alias: str) -> int:
    """Rows whose A/B bucket a full read of the alias computed: the rows that executed plan
    nodes filtered by an md5 (EXPLAIN ANALYZE)."""
    ((plan,),) = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM {}")
                              .format(sql.Identifier(serving_schema, alias))).fetchall()
    hashed, pending = 0, [plan[0]["Plan"]]
    while pending:
        node = pending.pop()
        pending += node.get("Plans", [])
        for kind in ("Filter", "Join Filter"):
            if "md5" in node.get(kind, "") and node.get("Actual Loops", 0):
                hashed += node["Actual Rows"] + node.get(f"Rows Removed by {kind}", 0)
    return hashed


def output(settings: Any, table: str) -> dict[str, tuple[int, int]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT url, views, total_duration_ms FROM {}.{}").format(
            sql.Identifier(settings.data_schema), sql.Identifier(table))).fetchall()
    return {url: (views, total) for url, views, total in rows}


def dead_letters(settings: Any, table: str) -> set[tuple[int, int]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT partition, \"offset\" FROM {}.{}").format(
            sql.Identifier(settings.data_schema), sql.Identifier(table))).fetchall()
    return {(p, o) for p, o in rows}


def batches(settings: Any, job: str, version: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(
            "SELECT b.batch_id, b.attempt, b.start_offsets, b.end_offsets, b.records "
            "FROM {}.batches b JOIN {}.job_versions v ON v.id = b.version_id "
            "WHERE v.job = %s AND v.version = %s ORDER BY b.batch_id").format(
            sql.Identifier(settings.catalog_schema), sql.Identifier(settings.catalog_schema)),
            (job, version)).fetchall()


def assert_batches_tile_the_log(settings: Any, job: str, version: str, topic: str,
                                log_end: dict[int, int]) -> list[tuple[Any, ...]]:
    """Each batch applied once, each starting where the previous ended, from 0 to the end."""
    rows = batches(settings, job, version)
    assert rows, "no batch was applied"
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids))
    position = {str(p): 0 for p in log_end}
    for batch_id, _attempt, start, end, records in rows:
        assert start[topic] == {p: position[p] for p in start[topic]}, f"batch {batch_id} gap"
        assert records == sum(end[topic][p] - start[topic][p] for p in end[topic])
        position.update(end[topic])
    assert position == {str(p): e for p, e in log_end.items()}
    return rows


def assert_exact(settings: Any, job: str, version: str, topic: str, reference: Any,
                 rows: dict[str, tuple[int, int]]) -> list[tuple[Any, ...]]:
    """The version's output is ``rows`` (the reference's, for its code), its dead letters are
    the log's invalid records (of which there are some), and its batches tile the log."""
    assert output(settings, f"{job}__{version}") == rows
    assert dead_letters(settings, f"{job}__{version}__dead_letters") == \
        reference.invalid_offsets
    assert reference.invalid_offsets
    return assert_batches_tile_the_log(settings, job, version, topic, reference.log_end)


def reap(*procs: subprocess.Popen[Any]) -> None:
    """Kill each of ``procs`` that still runs, wait for it and close its pipes. For the
    ``finally`` of a test that starts a process: a Popen dropped while its child runs, or with
    a pipe open, warns (ResourceWarning) only when the garbage collector finds it, which may be
    in a later test on the worker, and that test fails for it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with suppress(OSError):  # a write still buffered for a child that is gone
                    stream.close()


def stop_drivers(service: Any) -> None:
    """Stop every driver the service's catalog shows running (a test's clean-up)."""
    from orchestrator.spark.launch import launcher

    for status in service.status():
        if status.pid:
            launcher.terminate(status.pid, None, grace_s=2)


@dataclass(frozen=True)
class OwnStack:
    state: Path
    settings: Any
    service: Any
    broker: psutil.Process


@contextmanager
def own_stack(prefix: str, *, memory: bool = True) -> Iterator[OwnStack]:
    """A stack of the test's own, for a test that takes its services away; on exit its
    broker is resumed if suspended, its drivers stopped and the stack removed."""
    from orchestrator.dev import stack as dev_stack
    from orchestrator.service import Orchestrator
    from orchestrator.settings import Settings
    from orchestrator.spark.launch import spares

    # mkdtemp, not tmp_path: the embedded server runs as another user (see conftest.stack).
    state = Path(tempfile.mkdtemp(prefix=prefix))
    # No queue keeper: these tests hand out slots themselves (schedule()), and a keeper
    # looking meanwhile started their queued versions first, without their fail points.
    up = dev_stack.up(state, memory=memory, queue_keeper=False)
    assert up.queue_keeper is None
    settings = Settings(state_dir=state, pg_dsn=up.pg_dsn, kafka_bootstrap=up.kafka_bootstrap,
                        spark_driver_memory="768m", heartbeat_interval_s=1.0,
                        spare_dir=state / "spares")
    service = Orchestrator(settings)
    broker = psutil.Process(json.loads((state / "dev" / "stack.json").read_text())["broker_pid"])
    try:
        yield OwnStack(state, settings, service, broker)
    finally:
        with suppress(psutil.Error):
            broker.resume()
        try:
            stop_drivers(service)
            spares.withdraw_all(settings)
        finally:
            dev_stack.down(state)
            shutil.rmtree(state, ignore_errors=True)


def live_lag(job: str, seconds: float) -> Any:
    """A live version of ``job`` ``seconds`` behind, as the agent's sample gives it to live
    first: what a test holds the replay queue with (``service.replays.protect_live``)."""
    from orchestrator.models import VersionLag
    from orchestrator.states import RunState

    return VersionLag(job, "v1", "live", RunState.LIVE, 0, seconds, 0.0, 0.0, None, ())


SEED_ENV = "KAPPA_TEST_SEED"


def test_seed(name: str) -> int:
    """The seed of a test's random choices (kill moments): ``KAPPA_TEST_SEED`` when set, to
    replay a failure, else a fresh one. Printed, so that pytest shows it for a failing test."""
    import os
    import random

    given = os.environ.get(SEED_ENV)
    seed = int(given) if given else random.randrange(1 << 30)
    print(f"{name}: {SEED_ENV}={seed}")
    return seed


test_seed.__test__ = False  # type: ignore[attr-defined]  # a helper that pytest must not collect


def archiver(settings: Any, topics: list[str], fail_points: str, released: Path | None = None,
             *args: str, stdout: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """A `kappa archive run` of ``topics`` with ``fail_points`` set (KAPPA_FAIL_POINTS), whose
    paused points a test releases in ``released``; stderr is piped, for its lines, and stdout
    where ``stdout`` asks for it."""
    import os
    import sys

    env = dict(os.environ, **settings.driver_environment(), KAPPA_FAIL_POINTS=fail_points)
    if released is not None:
        env["KAPPA_FAIL_POINTS_RELEASE"] = str(released)
    kappa = str(Path(sys.executable).with_name("kappa"))
    return subprocess.Popen([kappa, "archive", "run", *args, *topics], env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def without_spark(settings: Any, topic: str, tmp_path: Path, monkeypatch: Any, driver: str,
                  **changes: Any) -> Any:
    """A service whose drivers stop at the fail point driver.start (``driver``: "exit", as an
    OOM kill would end them, or "pause", alive and holding their slot until stopped), with no
    warm spare and 100 records in ``topic``: a version's run, its queue and its catalog rows
    with no JVM started."""
    from dataclasses import replace

    from orchestrator.failpoints import ENV, RELEASE_ENV
    from orchestrator.service import Orchestrator

    changed = replace(settings, warm_spares=0, spare_dir=tmp_path / "no-spares", **changes)
    service = Orchestrator(changed)
    service.produce_sample(topic, 100, seed=1)
    if driver == "pause":
        (tmp_path / "never-released").mkdir()
        monkeypatch.setenv(RELEASE_ENV, str(tmp_path / "never-released"))
    monkeypatch.setenv(ENV, f"driver.start={driver}")
    return service
