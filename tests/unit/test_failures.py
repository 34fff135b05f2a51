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


@pytest.mark.parametrize("message", [
    # What pyarrow raised, reading a segment from an object store that stopped answering, or
    # refused the connection (both measured, with a silent listener and a closed port).
    "OSError: When reading information for key 'p0/00000000000000000000-00000000000000001500."
    "parquet' in bucket 'archive': AWS Error NETWORK_CONNECTION during HeadObject operation: "
    "curlCode: 28, Timeout was reached; Details: Operation too slow. Less than 1 bytes/sec "
    "transferred the last 1 seconds",
    "OSError: When getting information for key 'p0' in bucket 'archive': AWS Error "
    "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server",
    "OSError: AWS Error SERVICE_UNAVAILABLE during GetObject operation: Service Unavailable",
    "OSError: AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.",
])
def test_an_object_store_away_is_an_outage(message: str) -> None:
    # A replay reading the archive waits it out, as it waits out the broker.
    assert is_outage(Exception(message))


def test_an_object_store_refusing_a_key_is_not_an_outage() -> None:
    assert not is_outage(Exception(
        "OSError: When reading information for key 'p0/x.parquet' in bucket 'archive': AWS "
        "Error ACCESS_DENIED during HeadObject operation: No response body."))


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
