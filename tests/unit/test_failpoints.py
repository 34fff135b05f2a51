"""Fail points: off unless named, counted per process, and typos refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import failpoints
from orchestrator.errors import ConfigError
from orchestrator.failpoints import (
    POINTS,
    FailPointError,
    FailPointUnreachableError,
    Term,
    fail_point,
    parse,
)
from orchestrator.spark.failures import is_outage, root_cause


def test_terms_run_in_order_then_the_point_is_off(monkeypatch) -> None:
    monkeypatch.setattr(failpoints, "_REGISTRY", failpoints._Registry())
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.after_pg_commit=2*off->1*raise")
    fail_point("batch.after_pg_commit")
    fail_point("batch.after_pg_commit")
    with pytest.raises(FailPointError, match=r"batch\.after_pg_commit"):
        fail_point("batch.after_pg_commit")
    fail_point("batch.after_pg_commit")  # used up
    fail_point("driver.measure_lag")  # not named: off


def test_a_term_without_count_lasts_for_ever(monkeypatch) -> None:
    monkeypatch.setattr(failpoints, "_REGISTRY", failpoints._Registry())
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "driver.measure_lag=1*off->raise")
    fail_point("driver.measure_lag")
    for _ in range(3):
        with pytest.raises(FailPointError):
            fail_point("driver.measure_lag")


def test_unreachable_reads_as_an_outage_and_raise_does_not(monkeypatch) -> None:
    monkeypatch.setattr(failpoints, "_REGISTRY", failpoints._Registry())
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "source.read=1*unreachable->1*raise")
    with pytest.raises(FailPointUnreachableError) as unreachable:
        fail_point("source.read")
    with pytest.raises(FailPointError) as deterministic:
        fail_point("source.read")
    assert is_outage(unreachable.value) and not is_outage(deterministic.value)
    # As Spark relays it from a read task: the text alone must still read as an outage.
    relayed = RuntimeError(
        "[STREAM_FAILED] Query terminated. Return Message: Traceback (most recent call last):\n"
        '  File "source.py", line 9, in read\n'
        f"orchestrator.failpoints.FailPointUnreachableError: {unreachable.value}\n")
    assert is_outage(relayed)
    assert root_cause(relayed) == f"FailPointUnreachableError: {unreachable.value}"


def test_unset_means_off_and_unknown_names_are_bugs(monkeypatch) -> None:
    monkeypatch.delenv("KAPPA_FAIL_POINTS", raising=False)
    fail_point("batch.before_spark_commit")
    with pytest.raises(ValueError, match="unknown fail point"):
        fail_point("batch.after_commit")


@pytest.mark.parametrize("text", ["batch.after_commit=exit", "batch.after_pg_commit",
                                  "batch.after_pg_commit=x*exit",
                                  "batch.after_pg_commit=1*crash",
                                  "quarantine.try=sleep", "quarantine.try=sleep(x)",
                                  "quarantine.try=exit(5)"])
def test_malformed_settings_say_what_to_fix(text: str) -> None:
    with pytest.raises(ConfigError, match="KAPPA_FAIL_POINTS"):
        parse(text)


def test_parse_reads_every_point() -> None:
    assert parse("batch.after_pg_commit=2*off->1*exit; driver.measure_lag=raise; "
                 "quarantine.try=1*sleep(250)") == {
        "batch.after_pg_commit": (Term("off", 2), Term("exit", 1)),
        "driver.measure_lag": (Term("raise", None),),
        "quarantine.try": (Term("sleep", 1, 250),),
    }
    assert parse("quarantine.try=1*pause") == {"quarantine.try": (Term("pause", 1),)}


def test_a_paused_point_goes_on_once_released_and_only_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from orchestrator.failpoints import release

    monkeypatch.setenv("KAPPA_FAIL_POINTS", "quarantine.try=1*pause")
    monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(tmp_path))
    paused = threading.Thread(target=fail_point, args=("quarantine.try",))
    paused.start()
    paused.join(0.5)
    assert paused.is_alive()
    release(tmp_path, "driver.measure_lag")  # another point's release is not this one's
    paused.join(0.3)
    assert paused.is_alive()
    release(tmp_path, "quarantine.try")
    paused.join(5)
    assert not paused.is_alive()


def test_a_pause_without_its_release_directory_says_what_to_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "quarantine.try=pause")
    monkeypatch.delenv("KAPPA_FAIL_POINTS_RELEASE", raising=False)
    with pytest.raises(ConfigError, match="KAPPA_FAIL_POINTS_RELEASE"):
        fail_point("quarantine.try")


def test_the_readme_lists_every_point() -> None:
    """An operator learns the points from the operations page: one the code checks must be there."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    begins = readme.index("The points:", readme.index("**Fail points.**"))
    listed = readme[begins:].split("\n\n", 1)[0]  # that paragraph only
    assert [p for p in POINTS if f"`{p}`" not in listed] == []
