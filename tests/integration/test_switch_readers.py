"""32 readers, some holding transactions open for seconds, while 50 switches run: no reader
fails, stalls or sees a key twice, and no switch runs DDL or waits for a reader."""

from __future__ import annotations

import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import ROOT, job_file

sys.path.insert(0, str(ROOT))
from bench.switch import prepare, run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.spark]
# Readers' statements take milliseconds; on a loaded 2-core machine waiting for a CPU has made
# one take 0.7 s. A lock wait is caught by sampling pg_locks instead (`lock_waits_on`).
LONGEST_READER_STATEMENT_S = 3.0


@contextmanager
def ddl_of_backend(settings, backend_pid: int) -> Iterator[list[str]]:
    """Records every DDL command that PostgreSQL starts for one backend, through an event
    trigger (which sees DDL however it was issued); yields the list filled at exit."""
    tag = uuid.uuid4().hex[:8]
    table, function, trigger = (sql.Identifier(f"{kind}_{tag}") for kind in
                                ("ddl_seen", "record_ddl", "ddl_watch"))
    seen: list[str] = []
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE public.{} (command text)").format(table))
        conn.execute(sql.SQL(
            "CREATE FUNCTION public.{f}() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF pg_backend_pid() = {pid} THEN INSERT INTO public.{t} VALUES (tg_tag); END IF; "
            "END $$").format(f=function, pid=sql.Literal(backend_pid), t=table))
        conn.execute(sql.SQL("CREATE EVENT TRIGGER {} ON ddl_command_start "
                             "EXECUTE FUNCTION public.{}()").format(trigger, function))
        try:
            yield seen
        finally:
            seen += [r[0] for r in conn.execute(
                sql.SQL("SELECT command FROM public.{}").format(table))]
            conn.execute(sql.SQL("DROP EVENT TRIGGER {}").format(trigger))
            conn.execute(sql.SQL("DROP FUNCTION public.{}()").format(function))
            conn.execute(sql.SQL("DROP TABLE public.{}").format(table))


@contextmanager
def lock_waits_on(settings, relations: list[str]) -> Iterator[list[tuple]]:
    """Samples pg_locks every 10 ms for a lock that someone waits for on these relations; a
    switch that took a lock readers conflict with (DDL) makes them wait, and waits for the
    readers that hold transactions open for seconds. Yields the waits seen, filled at exit."""
    seen: list[tuple] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            while not stop.wait(0.01):
                seen.extend(conn.execute(
                    "SELECT pid, mode, relation::regclass::text FROM pg_locks "
                    "WHERE NOT granted AND relation = ANY(%s::regclass[])",
                    (relations,)).fetchall())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join(30)


def test_readers_never_fail_stall_or_see_a_key_twice(service, settings, topic, tmp_path: Path
                                                     ) -> None:
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 20_000, seed=121)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp_path, version, topic))
    prepare(service, "pageview_counts")
    with service._switching() as board:  # the connection every switch of this service uses
        backend = board.conn.info.backend_pid
    watched = [f"{settings.serving_schema}.pageview_counts",
               *(f"{settings.data_schema}.pageview_counts__{v}" for v in ("v1", "v2"))]
    with ddl_of_backend(settings, backend) as ddl, lock_waits_on(settings, watched) as waits:
        outcome = run_scenario(service, settings, "pageview_counts", switches=50, readers=32)
        summary = outcome.summary()
        print(summary)
        assert outcome.reader_errors == []
        assert outcome.duplicate_keys == 0
        assert outcome.stale_after_switch == []
        assert summary["switches"] == 50 and summary["reader_statements"] > 32
        assert max(outcome.statement_seconds) < LONGEST_READER_STATEMENT_S, summary
        _switch_while_a_reader_holds_the_alias(service, settings)
    assert ddl == [], f"switches ran DDL: {ddl}"
    assert waits == [], f"lock waits on the alias or its tables: {waits[:10]}"
    # The first promote, 50 switches and the one made while a reader held the alias.
    assert len(service.history("pageview_counts")) == 52

    # With fresh lag samples (as `kappa agent` keeps them), each kind of switch makes two round
    # trips to PostgreSQL: the alias locked with every fact its gates need, then the write
    # with the COMMIT.
    service.lag("pageview_counts")
    for switch in (lambda: service.ab("pageview_counts", "v2", 10, reason="round trips"),
                   lambda: service.promote("pageview_counts", "v2", reason="round trips"),
                   lambda: service.rollback("pageview_counts", reason="round trips")):
        assert _round_trips(service, switch) == 2
    assert [h["action"] for h in service.history("pageview_counts")[-3:]] == [
        "ab", "promote", "rollback"]


def _round_trips(service, switch) -> int:
    """The times ``switch()`` waited for PostgreSQL on the service's switch connection: runs of
    messages sent, each answered before the next (libpq's protocol trace)."""
    with service._switching() as board:
        conn = board.conn
    with tempfile.NamedTemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS
                                    | psycopg.pq.Trace.REGRESS_MODE)
        try:
            switch()
        finally:
            conn.pgconn.untrace()
        sent = [line.split(b"\t", 1)[0] == b"F"
                for line in Path(trace.name).read_bytes().splitlines() if line.strip()]
    return sum(1 for i, frontend in enumerate(sent) if frontend and (i == 0 or not sent[i - 1]))


def _switch_while_a_reader_holds_the_alias(service, settings) -> None:
    """A reader's open transaction holds its locks on the view and both tables; a switch that
    waited for readers would not return until it commits."""
    alias = sql.SQL("{}.{}").format(sql.Identifier(settings.serving_schema),
                                    sql.Identifier("pageview_counts"))
    with psycopg.connect(settings.pg_dsn) as reader:
        reader.execute(sql.SQL("SELECT count(*) FROM {}").format(alias)).fetchone()
        switched = threading.Event()

        def switch() -> None:
            service.ab("pageview_counts", "v2", 30, reason="while a reader holds the alias")
            switched.set()

        worker = threading.Thread(target=switch, daemon=True)
        worker.start()
        try:
            assert switched.wait(30), "the switch waited for a reader's open transaction"
            assert reader.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        finally:
            reader.rollback()  # lets a waiting switch finish, so that nothing is left behind
            worker.join(30)


def test_kill_9_mid_switch_leaves_alias_and_history_consistent(service, settings, topic,
                                                               tmp_path: Path) -> None:
    import os
    import signal
    import subprocess

    from orchestrator.service import Orchestrator

    from conftest import kappa_cli, wait_until

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 5_000, seed=131)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp_path, version, topic))
    prepare(service, "pageview_counts")
    aliases = sql.SQL("{}.aliases").format(sql.Identifier(settings.catalog_schema))

    def routing() -> tuple:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            return conn.execute(sql.SQL(
                "SELECT primary_version, candidate_version, percent FROM {} WHERE name = %s")
                .format(aliases), ("pageview_counts",)).fetchone()

    env = dict(os.environ, **settings.driver_environment())
    exe = str(Path(sys.executable).with_name("kappa"))
    # Hold the routing row so that the CLI's switch stops inside its transaction, then kill it.
    with psycopg.connect(settings.pg_dsn) as holder, \
            psycopg.connect(settings.pg_dsn, autocommit=True) as watcher:
        holder.execute(sql.SQL("SELECT 1 FROM {} WHERE name = %s FOR UPDATE").format(aliases),
                       ("pageview_counts",))
        cli = subprocess.Popen([exe, "promote", "pageview_counts", "v2"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # (A separate autocommit connection: pg_stat_activity is frozen within a transaction.)
            # Waiting on this holder's lock, not any kappa's: other tests share the server.
            wait_until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'kappa' "
                "AND %s = ANY(pg_blocking_pids(pid))", (holder.info.backend_pid,)
            ).fetchone()[0] == 1, 60, "the CLI's switch to wait inside its transaction")
        finally:
            os.kill(cli.pid, signal.SIGKILL)
            cli.wait()
        holder.rollback()
    assert routing() == ("v1", None, 0)
    assert [h["action"] for h in service.history("pageview_counts")] == ["promote"]

    # Two promotes at once: one switches, the other finds it done; history tells exactly that.
    both = [subprocess.Popen([exe, "promote", "pageview_counts", "v2"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in both]
    for p in both:
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()
    assert sorted(code for code, _ in results) == [0, 1]
    assert any("already serves v2" in err for _, err in results)
    assert routing() == ("v2", None, 0)
    assert [h["to"] for h in service.history("pageview_counts")] == ["v1", "v2"]
    assert kappa_cli(settings, "history", "pageview_counts").returncode == 0
