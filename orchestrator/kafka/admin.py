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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from orchestrator.errors import ConfigError, KappaError, NotFoundError, ServiceUnavailableError
from orchestrator.kafka.endpoint import Kafka, as_endpoint
from orchestrator.log_identity import LogIdentity, topic_id_text

__all__ = [
    "base_config",
    "broker_reachable",
    "check_access",
    "delete_topic",
    "ensure_topic",
    "kafka_errors",
    "log_identity",
    "topic_names",
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


# Errors that mean "the broker refused who we are" (TLS handshake, SASL). librdkafka reports them
# only to the error callback; the call itself then fails as a plain transport error. The last one
# per bootstrap is kept here so that translate() can name the setting to fix.
_SECURITY = frozenset({KafkaError._SSL, KafkaError._AUTHENTICATION,
                       KafkaError.SASL_AUTHENTICATION_FAILED,
                       KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaError.ILLEGAL_SASL_STATE})
_security_errors: dict[str, KafkaError] = {}


def _on_error(bootstrap: str) -> Any:
    def record(err: KafkaError) -> None:
        if err.code() in _SECURITY:
            _security_errors[bootstrap] = err
    return record


def base_config(bootstrap: Kafka) -> dict[str, Any]:
    """Settings shared by every client the orchestrator creates: the endpoint's (security
    included), then ours. Each client adds its own on top."""
    endpoint = as_endpoint(bootstrap)
    return {
        "client.id": "kappa-orchestrator",  # unless the endpoint names its own
        **endpoint.client_config(),
        # Fail fast enough for a CLI when the broker is down; librdkafka retries on its own.
        "socket.connection.setup.timeout.ms": 5000,
        "log.connection.close": False,
        "logger": LIBRDKAFKA_LOG,
        "error_cb": _on_error(endpoint.bootstrap),
    }


def _refused(bootstrap: Kafka, doing: str) -> ConfigError | None:
    """The security error behind a transport failure, as the setting to fix, if there was one."""
    endpoint = as_endpoint(bootstrap)
    err = _security_errors.pop(endpoint.bootstrap, None)
    if err is None:
        return None
    return ConfigError(f"the Kafka broker at {endpoint.bootstrap} refused the connection while "
                       f"{doing} ({_short(err)}): {endpoint.hint()}")


def _short(err: KafkaError) -> str:
    """librdkafka's reason without the broker prefix and the state-machine suffix."""
    text = err.str().split("/bootstrap: ", 1)[-1].split(" (after ", 1)[0]
    return f"{err.name()}: {text.split(', verify that ', 1)[0]}"


def check_access(kafka: Kafka, timeout_s: float = 5.0) -> None:
    """Connect and read the cluster's metadata, or raise the error that names what to fix: a
    ConfigError for a refused certificate or password, ServiceUnavailableError for silence."""
    endpoint = as_endpoint(kafka)
    _security_errors.pop(endpoint.bootstrap, None)
    admin = admin_client(endpoint)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=0.25)
            return
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback, which carries the TLS or SASL reason
            refused = _refused(endpoint, "connecting")
            if refused is not None:
                raise refused from exc
            if time.monotonic() >= deadline:
                raise translate(exc, "connecting", endpoint) from exc


def translate(err: KafkaError | BaseException | str, doing: str, bootstrap: Kafka) -> KappaError:
    """Turn a confluent-kafka error into the KappaError a user can act on."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if isinstance(err, KafkaError):
        code = err.code()
        detail = f"{err.name()}: {err.str()}"
        if code in _SECURITY:
            return ConfigError(f"the Kafka broker at {bootstrap} refused {doing} ({detail}): "
                               f"{as_endpoint(bootstrap).hint()}")
        if code in _UNAVAILABLE:
            refused = _refused(bootstrap, doing)
            if refused is not None:
                return refused
            return ServiceUnavailableError(
                f"the Kafka broker at {bootstrap} did not answer while {doing} ({detail}): "
                "start it (`kappa dev up`) or fix KAPPA_KAFKA_BOOTSTRAP (and "
                "kafka_security_protocol, if it needs TLS or SASL), then retry"
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
def kafka_errors(doing: str, bootstrap: Kafka) -> Iterator[None]:
    """Re-raise any confluent-kafka exception raised inside the block as a KappaError."""
    try:
        yield
    except KappaError:
        raise
    except KafkaException as exc:
        raise translate(exc, doing, bootstrap) from exc
    except BufferError as exc:  # the producer's local queue is full
        raise translate(exc, doing, bootstrap) from exc


def admin_client(bootstrap: Kafka) -> AdminClient:
    """A new client; callers that ask several times a second keep one."""
    with kafka_errors("creating an admin client", bootstrap):
        return AdminClient(base_config(bootstrap))


def _describe(
    admin: AdminClient, bootstrap: Kafka, topic: str, timeout_s: float
) -> list[int] | None:
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
    bootstrap: Kafka, topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[int]:
    """Sorted partition ids of an existing topic; NotFoundError if there is no such topic."""
    partitions = _describe(admin_client(bootstrap), bootstrap, topic, timeout_s)
    if not partitions:
        raise NotFoundError(
            f"topic {topic!r} does not exist on the Kafka broker at {bootstrap}: create it "
            "(e.g. by producing the sample events) or fix the topic name in the job file"
        )
    return partitions


def ensure_topic(
    bootstrap: Kafka, topic: str, partitions: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Create ``topic`` with ``partitions`` partitions if it is missing; True if it was created.

    An existing topic is left as it is (its partition count is not changed). After a creation,
    waits until the topic's metadata shows every partition, or raises ServiceUnavailableError
    after ``timeout_s``.
    """
    if partitions < 1:
        raise KappaError(f"a topic needs at least one partition, not {partitions}: fix the call")
    admin = admin_client(bootstrap)
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


def topic_names(bootstrap: Kafka, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Every topic of the broker but its internal ones (``__consumer_offsets``, ...)."""
    with kafka_errors("listing the topics", bootstrap):
        metadata = admin_client(bootstrap).list_topics(timeout=timeout_s)
    return sorted(t for t in metadata.topics if not t.startswith("__"))


def delete_topic(bootstrap: Kafka, topic: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Delete ``topic`` (if it exists) and wait until the broker no longer lists it."""
    admin = admin_client(bootstrap)
    with kafka_errors(f"deleting topic {topic!r}", bootstrap):
        futures = admin.delete_topics([topic], operation_timeout=timeout_s,
                                      request_timeout=timeout_s)
        try:
            futures[topic].result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() in _NOT_FOUND):
                raise
    deadline = time.monotonic() + timeout_s
    while _describe(admin, bootstrap, topic, timeout_s) is not None:
        if time.monotonic() >= deadline:
            raise ServiceUnavailableError(f"topic {topic!r} on {bootstrap} is still listed "
                                          f"{timeout_s:g} s after its deletion: retry")
        time.sleep(0.05)


def log_identity(bootstrap: Kafka, topics: Sequence[str], *,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 admin: AdminClient | None = None) -> LogIdentity:
    """The cluster id and the ids of ``topics`` (None for a topic the broker does not know), in
    two requests. ServiceUnavailableError when the broker cannot answer: only an answer is
    evidence that a log is gone. ``admin``: a client kept by a caller that asks often."""
    admin = admin or admin_client(bootstrap)
    with kafka_errors("describing the cluster", bootstrap):
        cluster = admin.describe_cluster(request_timeout=timeout_s).result()
    ids: dict[str, str | None] = {}
    missing: list[str] = []
    if topics:
        with kafka_errors("describing the topics read", bootstrap):
            futures = admin.describe_topics(TopicCollection(list(dict.fromkeys(topics))),
                                            request_timeout=timeout_s)
            for topic, future in futures.items():
                try:
                    ids[topic] = topic_id_text(future.result().topic_id)
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else None
                    if not (isinstance(err, KafkaError) and err.code() in _NOT_FOUND):
                        raise
                    missing.append(topic)
    return LogIdentity(cluster_id=cluster.cluster_id or None, topics=ids,
                       missing=tuple(missing))


def broker_reachable(bootstrap: Kafka, timeout_s: float = 1.0) -> bool:
    """True if the broker answers a metadata request within ``timeout_s``."""
    try:
        AdminClient(base_config(bootstrap)).list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True
