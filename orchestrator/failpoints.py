"""Named fail points: places in the driver and the commit path where a test makes the process
exit or raise, so that a crash in a window of milliseconds is repeatable (as FoundationDB's
buggify and TiKV's fail-rs do).

Off unless ``KAPPA_FAIL_POINTS`` names them, e.g.::

    KAPPA_FAIL_POINTS="batch.after_pg_commit=2*off->1*exit;driver.measure_lag=1*raise"

Each point takes a sequence of terms ``[COUNT*]ACTION`` joined by ``->``, run in order as the
point is reached in this process; a term without a count lasts for ever, and once the sequence
is used up the point is off. Actions:

- ``off``: nothing;
- ``exit``: end the process at once with status 86 (no clean-up, no state recorded: like
  SIGKILL or the out-of-memory killer);
- ``raise``: raise :class:`FailPointError`, an error the driver counts towards the poison rule;
- ``unreachable``: raise :class:`FailPointUnreachableError`, which the driver takes for an outage
  ("did not answer") and retries for as long as it lasts;
- ``sleep(MS)``: pause this thread for MS milliseconds (to hold a window open for a test);
- ``pause``: pause this thread until a file named after the point appears in the directory
  ``KAPPA_FAIL_POINTS_RELEASE`` names (a window that a loaded machine cannot miss: the test
  holds it open for as long as it needs, then releases it with :func:`release`).

The launcher passes its environment to drivers, so a test sets the variable for the deploy or
restart whose driver should fail, and a later restart without it runs clean.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError, KappaError

log = logging.getLogger("kappa.failpoints")
ENV = "KAPPA_FAIL_POINTS"
RELEASE_ENV = "KAPPA_FAIL_POINTS_RELEASE"
EXIT_STATUS = 86
ACTIONS = ("off", "exit", "raise", "unreachable", "pause", "sleep")
# A pause nobody releases ends after this: a test that forgot its release fails on its own
# timeout, not by a process held for ever.
PAUSE_LIMIT_S = 900.0
# Every point the code checks: a name outside this list is a typo in a test.
POINTS = (
    "batch.after_pg_commit",  # the batch is in PostgreSQL, Spark's commit log does not know it
    "batch.before_spark_commit",  # the sink is done; Spark has not written its commit log
    "batch.start",  # a micro-batch reached the sink: none of it is read (by any path) or committed
    "batch.staged",  # a batch's (or tile's) rows and read counts are staged; none is committed
    "driver.start",  # a driver process starts: nothing is recorded, no Spark session exists
    "driver.measure_lag",  # the driver asks how far behind the log end it is
    "driver.going_live",  # caught_up is recorded, not yet committed; live is next
    "tile.planned",  # a batch phase's tile plan is recorded; nothing of it is read or staged
    "tile.after_pg_commit",  # a tile's batch is in PostgreSQL; the next tile is not planned
    "handover.before_seed",  # the tiles reached the log end; no checkpoint is seeded from them
    "handover.before_live_batch",  # the seeded streaming query's first batch reached the sink
    "quarantine.try",  # a quarantine is about to run the batch's transform on some ranges
    "source.read",  # a read task (on an executor) is about to read its offset range
    "cutover.after_decision",  # an outcome test's promote committed; its plan has not ended
    "switch.measure_lag",  # a switch asks the broker for a version's lag ("unreachable": no answer)
    "switch.before_commit",  # a switch's write has run, its COMMIT is not sent: it holds its locks
    "archive.before_rename",  # a segment is written and synced under its temporary name
    "archive.before_record",  # a segment is in place; the manifest does not hold it yet
    "archive.topic",  # a continuous archive pass is about to write one topic's partitions
    "archive.decode",  # a raw segment is about to be decoded (raise: an error of any kind)
    "postgres.started",  # the embedded PostgreSQL accepts connections; its socket dir is as made
    "restore.start",  # `kappa dev up` (or `kappa archive restore`) is about to restore
    "restore.before_check",  # a topic's records are produced; their read-back check is next
    "ack_proxy.ledger_write",  # the ack proxy is about to sync a group of acknowledged ends
    "ack_proxy.before_forward",  # a Produce's ends are synced; its producer has not heard yet
    "probe.fetch",  # a log-end probe is about to look for its Fetch answers (or its deadline)
    "queue.claiming",  # a look read the queue under its lock; it claims the first version next
    "queue.after_claim",  # replay slots are claimed (committed); no driver launched yet
    "status.before_failing_a_dead_driver",  # a status saw an active run's driver gone
)


class FailPointError(KappaError):
    """Raised by a fail point set to ``raise``: only tests set them (KAPPA_FAIL_POINTS)."""


class FailPointUnreachableError(FailPointError):
    """Raised by a fail point set to ``unreachable``: reads as a service that did not answer."""


@dataclass(frozen=True)
class Term:
    action: str
    count: int | None  # None: for ever
    milliseconds: int = 0  # of a sleep


def parse(text: str) -> dict[str, tuple[Term, ...]]:
    points: dict[str, tuple[Term, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, spec = item.partition("=")
        name = name.strip()
        if not sep or name not in POINTS:
            raise ConfigError(f"{ENV}: {item!r} is not NAME=ACTIONS with NAME one of "
                              f"{', '.join(POINTS)}; fix or unset {ENV}")
        points[name] = tuple(_term(part.strip(), item) for part in spec.split("->"))
    return points


def _term(text: str, item: str) -> Term:
    count_text, star, action = text.rpartition("*")
    action, paren, argument = action.partition("(")
    milliseconds = argument.removesuffix(")")
    if action not in ACTIONS or (star and not count_text.isdigit()) \
            or bool(paren) != (action == "sleep") \
            or (paren and not (argument.endswith(")") and milliseconds.isdigit())):
        raise ConfigError(f"{ENV}: {item!r}: each term is [COUNT*]ACTION with ACTION one of "
                          f"{', '.join(ACTIONS[:-1])}, sleep(MS); fix or unset {ENV}")
    return Term(action, int(count_text) if star else None,
                int(milliseconds) if paren else 0)


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: str | None = None
        self._points: dict[str, tuple[Term, ...]] = {}
        self._hits: dict[str, int] = {}

    def action(self, name: str) -> Term:
        text = os.environ.get(ENV, "")
        with self._lock:
            if text != self._source:
                self._points, self._hits, self._source = parse(text), {}, text
            terms = self._points.get(name)
            if not terms:
                return _OFF
            hit = self._hits.get(name, 0)
            self._hits[name] = hit + 1
            for term in terms:
                if term.count is None or hit < term.count:
                    return term
                hit -= term.count
            return _OFF


_REGISTRY = _Registry()
_OFF = Term("off", None)


def fail_point(name: str) -> None:
    """Exit or raise here if ``KAPPA_FAIL_POINTS`` says so for ``name``; otherwise nothing."""
    if name not in POINTS:
        raise ValueError(f"unknown fail point {name!r}")
    if ENV not in os.environ:
        return
    term = _REGISTRY.action(name)
    if term.action == "exit":
        os._exit(EXIT_STATUS)
    if term.action == "raise":
        raise FailPointError(f"fail point {name} ({ENV})")
    if term.action == "unreachable":
        raise FailPointUnreachableError(f"fail point {name}: the service did not answer ({ENV})")
    if term.action == "sleep":
        log.warning("fail point %s: sleeping %d ms (%s)", name, term.milliseconds, ENV)
        time.sleep(term.milliseconds / 1000)
    if term.action == "pause":
        _pause(name)


def _pause(name: str) -> None:
    where = os.environ.get(RELEASE_ENV)
    if not where:
        raise ConfigError(f"{ENV}: {name}=pause needs {RELEASE_ENV}, a directory where the "
                          "test releases the point by creating a file of its name")
    released = Path(where) / name
    log.warning("fail point %s: paused until %s exists (%s)", name, released, ENV)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not released.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    log.warning("fail point %s: released", name)


def release(directory: Path, name: str) -> None:
    """Lets every process paused at ``name`` (``pause``, with ``RELEASE_ENV`` = directory) go
    on, and any that reaches it later."""
    if name not in POINTS:
        raise ValueError(f"unknown fail point {name!r}")
    (directory / name).touch()
