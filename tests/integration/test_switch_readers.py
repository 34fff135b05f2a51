"""32 readers, some holding transactions open for seconds, while 50 switches run: no reader
fails, stalls or sees a key twice, and no switch runs DDL or waits for a reader. Whether a
reader waited is told by locks, never by a clock: a switch held before its COMMIT, with every
lock it takes, for as long as the test needs (fail point `switch.before_commit`).

Both tests switch one deployment, made once (v1 and v2 caught up, validated), each an alias of its
own."""

from __future__ import annotations

import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import ROOT, job_file, settings_for, wait_until

sys.path.insert(0, str(ROOT))
from bench.switch import prepare, run_scenario

# One deployment for the module's tests, on one xdist worker (--dist loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.spark,
              pytest.mark.xdist_group("switch_readers")]
SWITCH_HELD = "switch.before_commit"
JOB = "pageview_counts"


@pytest.fixture(scope="module")
def deployed(stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """(settings, service): v1 and v2 caught up on a topic that receives nothing more, each
    validated against the other, and the job's own alias serving v1 (bench.switch.prepare).
    A test that switches another alias promotes it first."""
    from orchestrator.service import Orchestrator

    from integration.helpers import stop_drivers

    tag = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("switch_readers")
    settings = settings_for(stack, tmp / "state", serving_schema=f"serving_{tag}")
    service = Orchestrator(settings)
    try:
        topic = f"pageviews_{tag}"
        service.produce_sample(topic, 20_000, seed=121)
        for version in ("v1", "v2"):
            service.deploy(job_file(tmp, version, topic))
        prepare(service, JOB)
        yield settings, service
    finally:
        stop_drivers(service)


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


def test_readers_never_fail_stall_or_see_a_key_twice(deployed, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The job's own alias (bench.switch switches no other), which the fixture made serve v1.
    settings, service = deployed
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
        # (A reader's statement time is no test of a stall: on a loaded machine waiting for a
        # CPU has made one take seconds. Its locks are, below.)
        service.lag("pageview_counts")  # fresh samples: the held switches ask no broker
        for kind, switch in (
                ("ab", lambda: service.ab("pageview_counts", "v2", 30, reason="held")),
                ("promote", lambda: service.promote("pageview_counts", "v2", reason="held")),
                ("rollback", lambda: service.rollback("pageview_counts", reason="held"))):
            with monkeypatch.context() as held:
                release = tmp_path / f"release-{kind}"
                release.mkdir()
                held.setenv("KAPPA_FAIL_POINTS", f"{SWITCH_HELD}=pause")
                held.setenv("KAPPA_FAIL_POINTS_RELEASE", str(release))
                _switch_held_while_a_reader_holds_the_alias(settings, backend, release, kind,
                                                            switch)
    assert ddl == [], f"switches ran DDL: {ddl}"
    assert waits == [], f"lock waits on the alias or its tables: {waits[:10]}"
    # The first promote, 50 switches and the three held while a reader held the alias (its
    # own history: the other test switches another alias of the job).
    history = service.history("pageview_counts", "pageview_counts")
    assert [(h["action"], h["reason"]) for h in history[-3:]] == [
        ("ab", "held"), ("promote", "held"), ("rollback", "held")]
    assert len(history) == 54

    # With fresh lag samples (as `kappa agent` keeps them), each kind of switch makes two round
    # trips to PostgreSQL: the alias locked with every fact its gates need, then the write
    # with the COMMIT.
    service.lag("pageview_counts")
    for switch in (lambda: service.ab("pageview_counts", "v2", 10, reason="round trips"),
                   lambda: service.promote("pageview_counts", "v2", reason="round trips"),
                   lambda: service.rollback("pageview_counts", reason="round trips")):
        assert _round_trips(service, switch) == 2
    assert [h["action"] for h in service.history("pageview_counts", "pageview_counts")[-3:]] \
        == ["ab", "promote", "rollback"]


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


def _switch_held_while_a_reader_holds_the_alias(settings, backend: int, release: Path,
                                                kind: str, switch: Callable[[], object]
                                                ) -> None:
    """A reader's open transaction holds its locks on the view and both tables while ``switch``
    runs, and the switch is held after its write, before its COMMIT, with every lock it takes:
    the switch must get there without waiting for the reader, and a second reader must read
    the alias without waiting for the switch. Each wait is a lock that is never released
    while it is held, so neither check depends on how fast the machine is."""
    from orchestrator import failpoints

    alias = sql.SQL("{}.{}").format(sql.Identifier(settings.serving_schema),
                                    sql.Identifier("pageview_counts"))
    history = f"{settings.catalog_schema}.alias_history"
    with psycopg.connect(settings.pg_dsn) as reader, \
            psycopg.connect(settings.pg_dsn, autocommit=True) as watcher:
        reader.execute(sql.SQL("SELECT count(*) FROM {}").format(alias)).fetchone()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                switch()
            except BaseException as exc:  # reported by the test's thread
                failed.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            def where() -> str | None:
                if not worker.is_alive():
                    return "returned"
                blocked, written = watcher.execute(
                    "SELECT %s = ANY(pg_blocking_pids(%s)), EXISTS (SELECT FROM pg_locks "
                    "WHERE pid = %s AND granted AND relation = %s::regclass)",
                    (reader.info.backend_pid, backend, backend, history)).fetchone()
                return "blocked" if blocked else "held" if written else None

            reached = wait_until(where, 300, f"the {kind} to reach its COMMIT or a lock wait")
            assert reached != "blocked", f"the {kind} waited for a reader's open transaction"
            assert reached == "held", f"the {kind} ended without its fail point: {failed}"
            with psycopg.connect(settings.pg_dsn, autocommit=True) as second:
                # Any wait for a lock fails it: the switch holds its locks until released.
                second.execute("SET lock_timeout = '1s'")
                try:
                    dupes = second.execute(sql.SQL(
                        "SELECT url FROM {} GROUP BY url HAVING count(*) > 1").format(alias)
                    ).fetchall()
                except psycopg.errors.LockNotAvailable:
                    locks = watcher.execute(
                        "SELECT relation::regclass::text, mode FROM pg_locks WHERE pid = %s "
                        "AND relation IS NOT NULL", (backend,)).fetchall()
                    raise AssertionError(f"a reader waited for the held {kind}'s lock; the "
                                         f"switch holds {locks}") from None
            assert dupes == []
            assert reader.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        finally:
            failpoints.release(release, SWITCH_HELD)
            reader.rollback()  # lets a waiting switch finish, so that nothing is left behind
            worker.join(300)
    assert not worker.is_alive() and failed == [], failed


def test_kill_9_mid_switch_leaves_alias_and_history_consistent(deployed) -> None:
    import os
    import signal
    import subprocess

    from conftest import kappa_cli, wait_until
    from integration.helpers import reap

    settings, service = deployed
    # An alias of the test's own, serving v1 as the fixture's does.
    alias = "killed_mid_switch"
    service.promote(JOB, "v1", alias, force=True, reason="start on v1")
    aliases = sql.SQL("{}.aliases").format(sql.Identifier(settings.catalog_schema))

    def routing() -> tuple:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            return conn.execute(sql.SQL(
                "SELECT primary_version, candidate_version, percent FROM {} WHERE name = %s")
                .format(aliases), (alias,)).fetchone()

    env = dict(os.environ, **settings.driver_environment())
    exe = str(Path(sys.executable).with_name("kappa"))
    # Hold the routing row so that the CLI's switch stops inside its transaction, then kill it.
    with psycopg.connect(settings.pg_dsn) as holder, \
            psycopg.connect(settings.pg_dsn, autocommit=True) as watcher:
        holder.execute(sql.SQL("SELECT 1 FROM {} WHERE name = %s FOR UPDATE").format(aliases),
                       (alias,))
        cli = subprocess.Popen([exe, "promote", "pageview_counts", "v2", "--alias", alias],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    assert [h["action"] for h in service.history("pageview_counts", alias)] == ["promote"]

    # Two promotes at once: one switches, the other finds it done; history tells exactly that.
    both: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):
            both.append(subprocess.Popen([exe, "promote", "pageview_counts", "v2", "--alias",
                                          alias], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
        results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in both]
    finally:
        reap(*both)
    assert sorted(code for code, _ in results) == [0, 1]
    assert any("already serves v2" in err for _, err in results)
    assert routing() == ("v2", None, 0)
    assert [h["to"] for h in service.history("pageview_counts", alias)] == ["v1", "v2"]
    assert kappa_cli(settings, "history", "pageview_counts", "--alias", alias).returncode == 0
