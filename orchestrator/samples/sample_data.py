"""Deterministic sample records written to a topic: `kappa produce-sample`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypedDict

from orchestrator.errors import KappaError
from orchestrator.settings import Settings


class SampleOptions(TypedDict, total=False):
    """produce_sample's keyword arguments, as the facade passes them on."""

    kind: str | None
    users: int | None
    invalid_share: float | None
    transactional: bool
    event_format: str


def produce_sample(settings: Settings, topic: str, count: int, seed: int,
                   rate: float | None = None, partitions: int = 4, *, kind: str | None = None,
                   users: int | None = None, invalid_share: float | None = None,
                   transactional: bool = False, event_format: str = "json") -> int:
    """Produce ``count`` deterministic sample records for ``seed`` to ``topic``; return how
    many reached the log.

    ``transactional``: in transactions of 1,000 records, every 5th aborted (its records reach
    the log and take offsets, but read_committed readers skip them).

    ``kind``: "pageviews" (orchestrator.samples.sample) or "profiles" (a changelog with tombstones,
    orchestrator.samples.sample_profiles); None picks "profiles" for a topic whose name starts with
    "profiles", else "pageviews". ``users``/``invalid_share``: None keeps the generator's
    default. ``event_format``: "json", or "avro" or "protobuf" (page views only) in the schema
    registry's wire format, its two schema versions registered in ``settings.schema_registry``
    (samples/sample_avro.py, samples/sample_protobuf.py). Arguments are checked before the
    topic is created.
    """
    from orchestrator.kafka.admin import ensure_topic
    from orchestrator.kafka.producer import produce, produce_in_transactions

    if kind is None:
        kind = "profiles" if topic.startswith("profiles") else "pageviews"
    records: Iterator[tuple[bytes, bytes | None]]
    if event_format not in ("json", "avro", "protobuf"):
        raise KappaError(f"unknown sample format {event_format!r}: use json, avro or protobuf")
    if event_format != "json":
        if kind != "pageviews":
            raise KappaError(f"the {event_format} sample is of page views: drop --kind "
                             "profiles, or produce the profiles as JSON")
        records = _framed_pageviews(settings, topic, event_format, count, seed, users,
                                    invalid_share)
    elif kind == "pageviews":
        from orchestrator.samples.sample import USERS, sample_events

        records = sample_events(count, seed, users=USERS if users is None else users,
                                invalid_share=invalid_share)
    elif kind == "profiles":
        from orchestrator.samples import sample_profiles as profiles

        records = profiles.sample_profiles(
            count, seed, users=profiles.USERS if users is None else users,
            invalid_share=profiles.INVALID_SHARE if invalid_share is None else invalid_share)
    else:
        raise KappaError(f"unknown sample kind {kind!r}: use pageviews or profiles")
    _, bootstrap = settings.require_services()
    ensure_topic(bootstrap, topic, partitions)
    if transactional:
        if rate is not None:
            raise KappaError("--transactional produces as fast as it can: drop --rate")
        result = produce_in_transactions(bootstrap, topic, records)
        return result.committed + result.aborted
    return produce(bootstrap, topic, records, rate=rate)


def _framed_pageviews(settings: Settings, topic: str, event_format: str, count: int, seed: int,
                      users: int | None, invalid_share: float | None
                      ) -> Iterator[tuple[bytes, bytes | None]]:
    from orchestrator.errors import ConfigError
    from orchestrator.kafka.registry import avro_serializer, protobuf_serializer
    from orchestrator.samples.sample import USERS
    from orchestrator.samples.sample_avro import SCHEMAS, framed_sample_events
    from orchestrator.samples.sample_protobuf import DESCRIPTOR_SETS, MESSAGE

    endpoint = settings.schema_registry
    if endpoint is None:
        raise ConfigError(f"the {event_format} sample registers its schemas: set "
                          "schema_registry_url (KAPPA_SCHEMA_REGISTRY_URL)")
    serialize = avro_serializer(endpoint, topic, SCHEMAS) if event_format == "avro" else \
        protobuf_serializer(endpoint, topic, DESCRIPTOR_SETS, MESSAGE)
    return framed_sample_events(count, seed, serialize,
                              users=USERS if users is None else users,
                              invalid_share=invalid_share)
