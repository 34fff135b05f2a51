"""Reading Spark's relayed errors: outages are told from poison, and the reason is one line."""

from __future__ import annotations

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


def test_a_poison_batch_names_its_offsets_the_error_and_the_remedy() -> None:
    failure = BatchFailure(7, {"t": {"0": 10, "1": 5}}, {"t": {"0": 20, "1": 5}},
                           "ValueError: poison", 3)
    reason = failure.reason("job", "v1")
    assert reason.startswith("batch 7 (t/0 [10, 20)) failed 3 times: ValueError: poison.")
    assert "kappa restart --quarantine job v1" in reason
