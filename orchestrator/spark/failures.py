"""Telling a batch that cannot succeed (a poison batch) from an outage that will pass.

An outage (PostgreSQL or the broker unreachable) is retried for as long as it lasts. Any other
error of the same batch, seen ``POISON_ATTEMPTS`` times, fails the driver with the batch's
offsets, the error and the remedy: retrying a null key or an exception in ``transform`` cannot
help. Errors raised on executors reach the driver as text inside Spark's exceptions, so both are
read from text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.archive_model.segments import ArchiveError
from orchestrator.errors import RegistryAuthError
from orchestrator.models import Offsets
from orchestrator.spark.shape import JobError

POISON_ATTEMPTS = 3

# Names and phrases of errors that mean "a service is unreachable now", wherever they were
# raised (driver or executor, psycopg, confluent-kafka, the schema registry's client, or
# pyarrow reading the archive from an object store: its network errors, 503 and throttling).
_OUTAGE = re.compile(
    r"ServiceUnavailableError|RegistryUnavailableError|OperationalError|InterfaceError|"
    r"AdminShutdown|"
    r"connection (?:refused|failed|to server|is closed|not open)|server closed the connection|"
    r"could not connect|Connection refused|_TRANSPORT|_ALL_BROKERS_DOWN|_TIMED_OUT|"
    r"did not answer|made no progress|terminating connection|"
    r"AWS Error (?:NETWORK_CONNECTION|SERVICE_UNAVAILABLE|SLOW_DOWN|REQUEST_TIMEOUT)",
    re.IGNORECASE)
# An object store that refuses the archive's credentials or key: asking again cannot help.
_STORE_REFUSED = re.compile(
    r"AWS Error (?:ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|"
    r"INVALID_SIGNATURE|UNRECOGNIZED_CLIENT|MISSING_AUTHENTICATION_TOKEN|EXPIRED_TOKEN)")
# "SomeError: message" lines of a Python traceback, as Spark relays them.
_PYTHON_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


# SQLSTATEs that mean "the server cannot serve now": connection exceptions (class 08),
# insufficient resources (53: disk full, out of memory, too many connections), a server shutting
# down or starting (57P01-57P05) and system errors (58). Anything else PostgreSQL answers
# (a statement timeout, an index row too large, a lock or serialisation failure) is an answer
# about this batch, and counts towards the poison rule.
_OUTAGE_SQLSTATE = re.compile(r"^(?:08|53|58|57P0[1-5])")


def is_outage(exc: BaseException) -> bool:
    import psycopg

    if isinstance(exc, psycopg.Error):
        if exc.sqlstate is not None:
            return bool(_OUTAGE_SQLSTATE.match(exc.sqlstate))
        # No SQLSTATE: the client lost or never had its connection.
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return bool(_OUTAGE.search(f"{type(exc).__name__}: {exc}"))


def root_cause(exc: BaseException) -> str:
    """The most telling one-line reason: the last Python "XError: message" line relayed from a
    worker, else the exception's first line."""
    text = str(exc).strip()
    found = None
    for line in text.splitlines():
        match = _PYTHON_ERROR.match(line)
        if match and not match.group(1).startswith(("org.", "java.", "py4j.")) \
                and not match.group(2).rstrip().endswith(":") \
                and "exception was thrown" not in match.group(2):
            found = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    if found is None:
        found = text.splitlines()[0] if text else type(exc).__name__
        if _is_database_error(exc) and text:
            found = f"{type(exc).__name__}: {found}"
    return found[:400]


def _is_database_error(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.Error)


@dataclass(frozen=True)
class BatchFailure:
    batch_id: int
    start: Offsets
    end: Offsets
    error: str
    attempts: int

    def ranges(self) -> str:
        parts = [f"{t}/{p} [{self.start.get(t, {}).get(p, hi)}, {hi})"
                 for t, ps in sorted(self.end.items()) for p, hi in sorted(ps.items())
                 if self.start.get(t, {}).get(p, hi) < hi]
        return ", ".join(parts) or "no offsets"

    def reason(self, job: str, version: str) -> str:
        return (f"batch {self.batch_id} ({self.ranges()}) failed {self.attempts} times: "
                f"{self.error}. Fix the job and redeploy it under a new VERSION, or run `kappa "
                f"restart --quarantine {job} {version}` to move the records that fail to the "
                "dead-letter table and go on")


def spark_reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:400]


def job_error(exc: BaseException) -> JobError | None:
    """A JobError raised in the sink reaches us wrapped in Spark's StreamingQueryException;
    so do the log changed under the version and an archive segment gone or damaged: running
    the batch again cannot help either. A segment that could not be read because the object
    store holding it is away (its network error, 503, throttling) is none of these: an
    outage, waited out; so is a schema registry away. A store or a schema registry that
    refuses the credentials is, wherever it was asked."""
    if isinstance(exc, JobError):
        return exc
    if isinstance(exc, RegistryAuthError):  # raised in the driver itself (a batch phase's reads)
        return JobError(str(exc)[:1000])
    if isinstance(exc, ArchiveError) and not _OUTAGE.search(str(exc)):
        return JobError(str(exc)[:1000])  # raised in the driver itself (a batch phase's reads)
    refused = next((line.strip() for line in str(exc).splitlines()
                    if _STORE_REFUSED.search(line)), None)
    if refused is not None:
        return JobError(f"the object store of the archive refused this driver: "
                        f"{refused[:600]}; fix its credentials (AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY in the drivers' environment, or archive_root's), "
                        "then `kappa restart JOB VERSION`")
    for line in str(exc).splitlines():
        for marker in ("JobError:", "LogChangedError:", "ArchiveError:", "RegistryAuthError:"):
            if marker in line and not (marker == "ArchiveError:" and _OUTAGE.search(line)):
                return JobError(line.split(marker, 1)[1].strip()[:1000])
    return None


def first_error_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "StaleDriverError" in line or "KappaError" in line or "Error" in line:
            return line.strip()[:500]
    return (text.splitlines()[0] if text else type(exc).__name__)[:500]
