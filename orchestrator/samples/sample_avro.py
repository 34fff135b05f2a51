"""The page-view sample in the schema registry's wire format, as Avro (the schemas here) or as
Protobuf (samples/sample_protobuf.py): the events of ``sample.sample_events``, the same for the
same arguments, written under two versions of their schema. The second version adds a field
with a default (``referrer``) and writes the second half of the stream, as a producer upgraded
midway would.

The JSON sample's invalid events become what goes wrong in the wire format: a value that is
not in it (``not_json``: the JSON text itself), truncated bytes (``missing_field``), an id that
the registry does not know (``wrong_type``), and a valid record with a negative duration
(``negative_duration``, a NON_NEGATIVE dead letter). Serializing is the caller's: the
registry's own serializer registers each version (samples/sample_data.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.formats import wire
from orchestrator.samples.sample import FIELDS, USERS, sample_events

PAGE_VIEW_V1: dict[str, Any] = {
    "type": "record", "name": "PageView", "namespace": "kappa.samples",
    "fields": [{"name": "user_id", "type": "long"}, {"name": "url", "type": "string"},
               {"name": "ts", "type": "long"}, {"name": "duration_ms", "type": "long"}]}
PAGE_VIEW_V2: dict[str, Any] = {
    **PAGE_VIEW_V1,
    "fields": [*PAGE_VIEW_V1["fields"],
               {"name": "referrer", "type": ["null", "string"], "default": None}]}
SCHEMAS = (PAGE_VIEW_V1, PAGE_VIEW_V2)
UNKNOWN_ID = 999_999  # no registry here hands out ids this high for a sample's two schemas

# (record, schema version 1 or 2) -> the framed value
Serialize = Callable[[dict[str, Any], int], bytes]


def framed_sample_events(count: int, seed: int, serialize: Serialize, *, users: int = USERS,
                         invalid_share: float | None = None) -> Iterator[tuple[bytes, bytes]]:
    """``count`` (key, value) events for ``seed``: the first half written with the schema's
    first version, the rest with its second (which adds ``referrer``)."""
    halfway = count // 2
    for i, (key, text) in enumerate(sample_events(count, seed, users=users,
                                                  invalid_share=invalid_share)):
        version = 1 if i < halfway else 2
        try:
            event = json.loads(text)
        except ValueError:
            yield key, text  # not JSON: in Avro's terms, no magic byte
            continue
        if not isinstance(event, dict) or set(event) != set(FIELDS) or not all(
                type(event[f]) is int for f in ("user_id", "ts", "duration_ms")) or \
                type(event["url"]) is not str:
            yield key, _broken(event, version, serialize)
            continue
        if version == 2:
            event["referrer"] = None if event["user_id"] % 3 else "/"
        yield key, serialize(event, version)


def _broken(event: Any, version: int, serialize: Serialize) -> bytes:
    """A missing field's event as truncated bytes, a wrongly typed one under an unknown id."""
    valid = {"user_id": 1, "url": "/", "ts": 0, "duration_ms": 0}
    if isinstance(event, dict) and len(event) < len(FIELDS):
        framed = serialize(valid, 1)
        return framed[:-1]
    framed = serialize(valid | ({"referrer": None} if version == 2 else {}), version)
    return wire.frame(UNKNOWN_ID, framed[wire.HEADER_BYTES:])
