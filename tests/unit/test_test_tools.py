"""The suite's own tools (tests/conftest.py, tests/cpu_accounting.py): a missing tool fails a
test unless the run opts out, whose skips the run's end lists; and the run's figures per module,
driver starts included, written to a JSON file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_accounting import (
    BETWEEN_TESTS,
    STARTS_DIR_VARIABLE,
    DriverStarts,
    Span,
    run_figures,
    slowest_modules_lines,
    write_figures,
)

from orchestrator.spark.launch.driver_process import START_LOG_VARIABLE, note_start

from conftest import (
    MISSING_TOOL,
    MISSING_TOOLS_VARIABLE,
    debian_tool,
    skipped_for_a_missing_tool,
)

ABSENT = "kappa-no-such-tool"


def _outcome_of_a_missing_tool() -> BaseException:
    """What debian_tool raised for a tool that is not there: caught here, whether a failure or
    a skip, since a skip escaping this test would end it green."""
    try:
        debian_tool(ABSENT, "kappa-package")
    except (pytest.fail.Exception, pytest.skip.Exception) as raised:
        return raised
    raise AssertionError(f"debian_tool found {ABSENT}")


@pytest.mark.parametrize("environment", [{}, {"CI": "true"}, {MISSING_TOOLS_VARIABLE: "1"}])
def test_a_missing_tool_fails_the_test_and_names_it_and_the_opt_out(
        environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MISSING_TOOLS_VARIABLE, raising=False)
    monkeypatch.delenv("CI", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    failed = _outcome_of_a_missing_tool()
    assert isinstance(failed, pytest.fail.Exception), f"not a failure: {failed!r}"
    assert f"{ABSENT} is not installed: `apt-get install kappa-package`" in str(failed)
    assert f"{MISSING_TOOLS_VARIABLE}=skip" in str(failed)


def test_with_the_opt_out_it_is_a_skip_that_the_end_of_the_run_finds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MISSING_TOOLS_VARIABLE, "skip")
    skipped = _outcome_of_a_missing_tool()
    assert isinstance(skipped, pytest.skip.Exception), f"not a skip: {skipped!r}"
    reason = str(skipped)
    assert reason.startswith(MISSING_TOOL) and ABSENT in reason
    assert debian_tool("sh", "dash").endswith("/sh")  # one that is there: its path

    def report(outcome: str, longrepr: object) -> pytest.TestReport:
        return pytest.TestReport("tests/x.py::t", ("tests/x.py", 1, "t"), {}, outcome,  # type: ignore[arg-type]
                                 longrepr, "setup")  # type: ignore[arg-type]

    # As pytest makes a skip's report, and as it comes back from an xdist worker (a list).
    assert skipped_for_a_missing_tool(report("skipped", ("x.py", 3, f"Skipped: {reason}"))) \
        == reason
    assert skipped_for_a_missing_tool(report("skipped", ["x.py", 3, f"Skipped: {reason}"])) \
        == reason
    assert skipped_for_a_missing_tool(report("skipped", ("x.py", 3, "Skipped: other"))) is None
    assert skipped_for_a_missing_tool(report("passed", None)) is None


def test_driver_starts_count_for_the_test_that_made_them_children_included(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As an xdist worker finds them: the controller's directory; the worker's own file restored.
    monkeypatch.setenv(STARTS_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv(START_LOG_VARIABLE, str(tmp_path / "unused"))
    starts = DriverStarts()
    starts.open()
    starts.started("tests/a.py::test_one")
    note_start("cold")
    note_start("adopted")
    # A spare's JVM starts in a process of its own, which inherits the test's file.
    subprocess.run([sys.executable, "-c", "from orchestrator.spark.launch.driver_process "
                    "import note_start; note_start('spare')"], check=True, timeout=60)
    starts.finished()
    note_start("cold")
    starts.started("tests/b.py::test_two@group")
    starts.finished()
    assert starts.counts(["tests/a.py::test_one", "tests/b.py::test_two@group"]) == {
        "tests/a.py::test_one": {"adopted": 1, "cold": 1, "spare": 1},
        BETWEEN_TESTS: {"cold": 1}}
    starts.close()
    assert tmp_path.is_dir()  # the controller's, not this worker's, to remove


def test_the_figures_per_module_and_the_table_of_the_slowest(tmp_path: Path) -> None:
    seconds = {"tests/a.py::t1": 10.0, "tests/a.py::t2@g": 5.0, "tests/b.py::t": 40.0,
               "tests/c.py::t": 1.0}
    cpu = {"tests/a.py::t1": 30.0, "tests/a.py::t2@g": 20.0, "tests/b.py::t": 8.0,
           "tests/c.py::t": 0.5}
    starts = {"tests/a.py::t1": {"cold": 2, "spare": 1, "adopted": 1},
              BETWEEN_TESTS: {"spare": 1}}
    span = Span(began_epoch=1000.0)
    span.saw("tests/a.py::t1", "gw0", 1000.5, 1002.0)  # setup
    span.saw("tests/a.py::t1", "gw0", 1002.0, 1010.5)  # call, then teardown
    span.saw("tests/a.py::t1", "gw0", 1010.5, 1011.0)
    span.saw("tests/b.py::t", "gw1", 1001.0, 1041.0)
    figures = run_figures(wall_s=61.04, seconds=seconds, cpu=cpu, starts=starts,
                          kinds={"Spark drivers and spares (JVM)": 40.0, "PostgreSQL": 18.5},
                          exit_status=0, spans=span.spans)
    assert figures["modules"]["tests/a.py"] == {
        "tests": 2, "wall_s": 15.0, "cpu_s": 50.0, "driver_starts": 3, "cold_starts": 2,
        "spare_starts": 1, "adopted": 1}
    assert figures["modules"]["tests/b.py"]["driver_starts"] == 0
    assert (figures["wall_s"], figures["test_wall_s"], figures["cpu_s"]) == (61.0, 56.0, 58.5)
    assert figures["driver_starts"] == 4  # the spare started between tests too
    assert figures["tests"]["tests/a.py::t1"] == {"wall_s": 10.0, "cpu_s": 30.0,
                                                  "driver_starts": 3, "worker": "gw0",
                                                  "began_s": 0.5, "ended_s": 11.0}
    assert "worker" not in figures["tests"]["tests/c.py::t"]  # not seen: no span made up
    # gw1 ran its one test to 41 s of a 61 s run: idle for its last 20 s.
    assert figures["workers"] == {
        "gw0": {"tests": 1, "busy_s": 10.5, "last_ended_s": 11.0, "idle_at_the_end_s": 50.0},
        "gw1": {"tests": 1, "busy_s": 40.0, "last_ended_s": 41.0, "idle_at_the_end_s": 20.0}}
    assert BETWEEN_TESTS not in figures["tests"]
    assert figures["cpu_kinds"] == {"total_s": 58.5, "per_kind": {
        "Spark drivers and spares (JVM)": 40.0, "PostgreSQL": 18.5}}
    path = tmp_path / ".ci-figures" / "test-figures.json"
    write_figures(path, figures)
    assert json.loads(path.read_text()) == figures
    assert (path.parent / ".gitignore").read_text() == "*\n"
    lines = slowest_modules_lines(figures, top=2)
    assert [line.split()[-1] for line in lines[1:3]] == ["tests/a.py", "tests/b.py"]  # by CPU
    assert lines[1].split()[:3] == ["50.0", "15.0", "3"]
    assert lines[-1].split()[:3] == ["58.5", "56.0", "4"]
    # Where no CPU is measured (not root): by wall, and said so.
    unmeasured = run_figures(wall_s=1.0, seconds=seconds, cpu={}, starts={}, kinds=None,
                             exit_status=1)
    assert unmeasured["cpu_s"] is None and unmeasured["cpu_kinds"] is None
    assert slowest_modules_lines(unmeasured, top=1)[1].split() == ["-", "40.0", "0",
                                                                   "tests/b.py"]
