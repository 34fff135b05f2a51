"""An object store's errors as a driver reads them (README, When things go wrong): a store
that is away is an outage wherever the archive was read, also when a read task's error reaches
the driver wrapped in the archive's own error for a segment; a store that refuses the key, or
a segment gone or damaged, is not.

The texts are pyarrow's (AWS SDK) as seen from s3rver suspended, killed, and given an unknown
key id (tests/integration/test_store_outage.py)."""

from __future__ import annotations

import pytest

from orchestrator.spark.failures import is_outage, job_error

KEY = "archive/pageviews/kappa-memory-1/AaIk/p0/00000000000000000000-00000000000000001543.parquet"
TIMED_OUT = (f"When getting information for key '{KEY}' in bucket 'kappa-archive': AWS Error "
             "NETWORK_CONNECTION during HeadObject operation: curlCode: 28, Timeout was reached; "
             "Details: Operation too slow. Less than 1 bytes/sec transferred the last 3 seconds")
REFUSED = (f"When getting information for key '{KEY}' in bucket 'kappa-archive': AWS Error "
           "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to "
           "server; Details: Failed to connect to 127.0.0.1:40821 after 0 ms: Could not connect "
           "to server")
DENIED = (f"When getting information for key '{KEY}' in bucket 'kappa-archive': AWS Error "
          "ACCESS_DENIED during HeadObject operation: No response body.")
UNKNOWN_KEY = ("When listing objects under key 'archive/t/' in bucket 'kappa-archive': AWS Error "
               "INVALID_ACCESS_KEY_ID during ListObjectsV2 operation: The AWS Access Key Id you "
               "provided does not exist in our records.")


def relayed(inner: str) -> Exception:
    """A read task's ArchiveError as Spark relays it to the driver's query."""
    return Exception(
        "[STREAM_FAILED] Query [id = f1] terminated with exception: Job aborted\n"
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "/work/main/orchestrator/archive/parquet_store.py", line 107, in read_table\n'
        '    raise ArchiveError(f"cannot read a segment: {exc} (segment {location}): the "\n'
        f"orchestrator.archive_model.segments.ArchiveError: cannot read a segment: {inner} "
        f"(segment kappa-archive/{KEY}): the store was away, or the segment is gone or damaged; "
        "once the store answers, run `kappa archive verify`\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
        "(PythonRunner.scala:1097)")


@pytest.mark.parametrize("inner", [TIMED_OUT, REFUSED,
                                   "AWS Error SERVICE_UNAVAILABLE during GetObject operation",
                                   "AWS Error SLOW_DOWN during GetObject operation: Please "
                                   "reduce your request rate."])
def test_a_store_away_while_a_read_task_reads_a_segment_is_an_outage(inner: str) -> None:
    exc = relayed(inner)
    assert job_error(exc) is None  # not failed at once: waited out
    assert is_outage(exc)


@pytest.mark.parametrize("text", [TIMED_OUT, REFUSED])
def test_a_store_away_while_the_driver_lists_the_archive_is_an_outage(text: str) -> None:
    exc = OSError(text)
    assert job_error(exc) is None and is_outage(exc)


@pytest.mark.parametrize("text", [DENIED, UNKNOWN_KEY])
def test_a_store_that_refuses_the_key_fails_at_once_wherever_it_was_asked(text: str) -> None:
    """Met by the driver (which segments the store holds) or in a read task: no outage, and
    asking again cannot help, so the version fails at once with the store's error and what to
    fix (it was restarted ten times over about four minutes before)."""
    for exc in (OSError(text), relayed(text)):
        assert not is_outage(exc)
        mistake = job_error(exc)
        assert mistake is not None and text in str(mistake), exc
        assert "credentials" in str(mistake) and "kappa restart" in str(mistake)


def test_a_segment_that_differs_from_its_manifest_still_fails_at_once() -> None:
    exc = Exception(
        f"orchestrator.archive_model.segments.ArchiveError: segment kappa-archive/{KEY} differs "
        "from the archive's manifest (1,542 records against 1,543, or another checksum): run "
        "`kappa archive verify`, then restore the segment from a backup")
    mistake = job_error(exc)
    assert mistake is not None and "differs from the archive's manifest" in str(mistake)
