"""Topic administration, and the one place where confluent-kafka errors become KappaErrors.

Every other module of ``orchestrator.kafka`` wraps its client calls in :func:`kafka_errors` (or
passes a ``KafkaError`` to :func:`translate`), so a caller only ever sees
``ServiceUnavailableError`` (broker unreachable: start it or fix the address), ``NotFoundError``
(unknown topic) or ``KappaError`` (the broker refused), each with a message that says what to do.

Quirk handled here: the Tansu broker creates a topic on a Metadata request that names it (it
ignores ``allow_auto_topic_creation=false``). Existence checks therefore use DescribeTopics,
never ``list_topics(topic)`` from an AdminClient.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from orchestrator.errors import KappaError, NotFoundError, ServiceUnavailableError

__all__ = [
    "base_config",
    "broker_reachable",
    "ensure_topic",
    "kafka_errors",
    "topic_partitions",
    "translate",
]

# Error codes that mean "the broker cannot be reached (now)", as opposed to "it said no".
_UNAVAILABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._DESTROY,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
    }
)
_NOT_FOUND = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                        KafkaError._UNKNOWN_PARTITION})

DEFAULT_TIMEOUT_S = 10.0

# librdkafka's own log lines (e.g. "Connect to ... failed" every 50 ms while the broker is down)
# go to this logger instead of stderr; the errors that matter reach callers as KappaErrors.
LIBRDKAFKA_LOG = logging.getLogger("orchestrator.kafka.librdkafka")
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())


def base_config(bootstrap: str) -> dict[str, Any]:
    """Settings shared by every client the orchestrator creates."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": "kappa-orchestrator",
        # Fail fast enough for a CLI when the broker is down; librdkafka retries on its own.
        "socket.connection.setup.timeout.ms": 5000,
        "log.connection.close": False,
        "logger": LIBRDKAFKA_LOG,
    }


def translate(err: KafkaError | BaseException | str, doing: str, bootstrap: str) -> KappaError:
    """Turn a confluent-kafka error into the KappaError a user can act on."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if isinstance(err, KafkaError):
        code = err.code()
        detail = f"{err.name()}: {err.str()}"
        if code in _UNAVAILABLE:
            return ServiceUnavailableError(
                f"the Kafka broker at {bootstrap} did not answer while {doing} ({detail}): "
                "start it (`kappa dev up`) or fix KAPPA_KAFKA_BOOTSTRAP, then retry"
            )
        if code in _NOT_FOUND:
            return NotFoundError(
                f"Kafka at {bootstrap} has no such topic or partition while {doing} ({detail}): "
                "create the topic or fix the topic name in the job file"
            )
        return KappaError(
            f"Kafka at {bootstrap} refused {doing} ({detail}): check the broker log and the "
            "topic settings, then retry"
        )
    return KappaError(
        f"Kafka client failed while {doing} at {bootstrap} ({err}): check KAPPA_KAFKA_BOOTSTRAP "
        "and the broker log, then retry"
    )


@contextmanager
def kafka_errors(doing: str, bootstrap: str) -> Iterator[None]:
    """Re-raise any confluent-kafka exception raised inside the block as a KappaError."""
    try:
        yield
    except KappaError:
        raise
    except KafkaException as exc:
        raise translate(exc, doing, bootstrap) from exc
    except BufferError as exc:  # the producer's local queue is full
        raise translate(exc, doing, bootstrap) from exc


def _admin(bootstrap: str) -> AdminClient:
    with kafka_errors("creating an admin client", bootstrap):
        return AdminClient(base_config(bootstrap))


def _describe(admin: AdminClient, bootstrap: str, topic: str, timeout_s: float) -> list[int] | None:
    """Partition ids of ``topic``, or None if the broker does not know it."""
    doing = f"describing topic {topic!r}"
    with kafka_errors(doing, bootstrap):
        futures = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
        try:
            description = futures[topic].result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in _NOT_FOUND:
                return None
            raise
    return sorted(p.id for p in description.partitions)


def topic_partitions(
    bootstrap: str, topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[int]:
    """Sorted partition ids of an existing topic; NotFoundError if there is no such topic."""
    partitions = _describe(_admin(bootstrap), bootstrap, topic, timeout_s)
    if not partitions:
        raise NotFoundError(
            f"topic {topic!r} does not exist on the Kafka broker at {bootstrap}: create it "
            "(e.g. by producing the sample events) or fix the topic name in the job file"
        )
    return partitions


def ensure_topic(
    bootstrap: str, topic: str, partitions: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Create ``topic`` with ``partitions`` partitions if it is missing; True if it was created.

    An existing topic is left as it is (its partition count is not changed). After a creation,
    waits until the topic's metadata shows every partition, or raises ServiceUnavailableError
    after ``timeout_s``.
    """
    if partitions < 1:
        raise KappaError(f"a topic needs at least one partition, not {partitions}: fix the call")
    admin = _admin(bootstrap)
    if _describe(admin, bootstrap, topic, timeout_s) is not None:
        return False
    created = True
    with kafka_errors(f"creating topic {topic!r}", bootstrap):
        futures = admin.create_topics(
            [NewTopic(topic, partitions)], operation_timeout=timeout_s, request_timeout=timeout_s
        )
        try:
            futures[topic].result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise
            created = False  # someone else created it in between
    deadline = time.monotonic() + timeout_s
    expected = list(range(partitions))
    while True:
        seen = _describe(admin, bootstrap, topic, timeout_s)
        if seen is not None and (seen == expected or not created):
            return created
        if time.monotonic() >= deadline:
            raise ServiceUnavailableError(
                f"topic {topic!r} on {bootstrap} shows partitions {seen} {timeout_s:g} s after "
                f"its creation, expected {partitions}: check the broker log, then retry"
            )
        time.sleep(0.05)


def broker_reachable(bootstrap: str, timeout_s: float = 1.0) -> bool:
    """True if the broker answers a metadata request within ``timeout_s``."""
    try:
        AdminClient(base_config(bootstrap)).list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True
