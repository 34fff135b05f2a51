"""Reading Spark's relayed errors: outages are told from poison, and the reason is one line."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from orchestrator.spark.failures import BatchFailure, is_outage, root_cause

RELAYED = """[STREAM_FAILED] Query [id = f1] terminated with exception: An exception was thrown
PythonException: An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "job.py", line 12, in checked
ValueError: poison url /poison
"""


def test_the_reason_is_the_python_error_relayed_by_spark() -> None:
    assert root_cause(Exception(RELAYED)) == "ValueError: poison url /poison"
    assert root_cause(Exception("plain")) == "plain"


def test_outages_are_told_from_poison() -> None:
    assert is_outage(Exception("psycopg.OperationalError: connection failed: refused"))
    assert is_outage(Exception("ServiceUnavailableError: the Kafka broker did not answer"))
    assert not is_outage(Exception(RELAYED))
    assert not is_outage(Exception("KappaError: transform() returned a row with a null key"))


@pytest.mark.parametrize("error", [
    errors.QueryCanceled("canceling statement due to statement timeout"),
    errors.ProgramLimitExceeded("index row requires 60016 bytes, maximum size is 8191"),
    errors.LockNotAvailable("could not obtain lock on row in relation \"runs\""),
    errors.SerializationFailure("could not serialize access due to concurrent update"),
    errors.DeadlockDetected("deadlock detected"),
    errors.UniqueViolation("duplicate key value violates unique constraint"),
])
def test_what_postgres_answers_about_a_batch_is_not_an_outage(error: psycopg.Error) -> None:
    # Each of these fails every try of the batch the same way: the poison rule must see it.
    assert not is_outage(error)


@pytest.mark.parametrize("error", [
    psycopg.OperationalError("connection failed: Connection refused"),
    psycopg.InterfaceError("the connection is closed"),
    errors.AdminShutdown("terminating connection due to administrator command"),
    errors.CannotConnectNow("the database system is starting up"),
    errors.TooManyConnections("sorry, too many clients already"),
    errors.DiskFull("could not extend file"),
    errors.ConnectionFailure("connection failure"),
])
def test_a_server_that_cannot_serve_now_is_an_outage(error: psycopg.Error) -> None:
    assert is_outage(error)


def test_a_poison_batch_names_its_offsets_the_error_and_the_remedy() -> None:
    failure = BatchFailure(7, {"t": {"0": 10, "1": 5}}, {"t": {"0": 20, "1": 5}},
                           "ValueError: poison", 3)
    reason = failure.reason("job", "v1")
    assert reason.startswith("batch 7 (t/0 [10, 20)) failed 3 times: ValueError: poison.")
    assert "kappa restart --quarantine job v1" in reason
