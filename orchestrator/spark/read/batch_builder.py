"""The Arrow batches a read task yields: the Kafka metadata columns and the parsed fields of the
valid records, and the dead letters read beside them (on the executors)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pyarrow as pa

_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
KAFKA_FIELDS = (
    pa.field("kafka_topic", pa.string()),
    pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()),
    pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("kafka_key", pa.string()),
    pa.field("kafka_headers", pa.list_(_HEADER)),
)
ROWS_PER_ARROW_BATCH = 20_000


class BatchBuilder:
    """Column lists for one Arrow batch of valid rows, and the dead letters read beside them."""

    def __init__(self, schema: pa.Schema, topic: str, partition: int, n_fields: int, *,
                 pass_tombstones: bool, version_id: int, catalog_schema: str,
                 wanted: frozenset[str] | None = None):
        self.schema, self.topic, self.partition, self.n_fields = schema, topic, partition, n_fields
        self.pass_tombstones = pass_tombstones
        self.version_id, self.catalog_schema = version_id, catalog_schema
        self.wanted = wanted  # the columns built; the others are null (None: all)
        self.dead: list[tuple[Any, ...]] = []
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.headers: list[_Headers | None] = []  # as Kafka gives them; see kafka_arrays
        self.fields: list[list[Any]] = [[] for _ in range(self.n_fields)]

    @property
    def size(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
            headers: list[tuple[str, bytes | None]] | None, values: tuple[Any, ...] | None,
            error: str | None) -> None:
        if values is None:
            if not (value is None and self.pass_tombstones):
                self.dead.append((self.version_id, self.topic, self.partition, offset,
                                  timestamp_ms, key, value, error))
                return
            values = (None,) * self.n_fields
        self.offsets.append(offset)
        self.timestamps.append(timestamp_ms)
        self.keys.append(key)
        self.headers.append(headers)
        for column, v in zip(self.fields, values, strict=True):
            column.append(v)

    def extend(self, offsets: list[int], timestamps: list[int], keys: list[bytes | None],
               headers: list[_Headers | None], fields: list[list[Any]],
               dead: list[tuple[int, int, bytes | None, bytes | None, str | None]]) -> None:
        """Add a chunk parsed a column at a time (ColumnarParser.parse): the rows it keeps,
        then its dead letters, as ``add`` would have added its records one by one."""
        self.offsets += offsets
        self.timestamps += timestamps
        self.keys += keys
        self.headers += headers
        for column, values in zip(self.fields, fields, strict=True):
            column.extend(values)
        self.add_dead_letters(dead)

    def add_dead_letters(self, dead: list[tuple[int, int, bytes | None, bytes | None,
                                                str | None]]) -> None:
        """(offset, timestamp ms, key, value, error) of records that become dead letters."""
        self.dead += map((self.version_id, self.topic, self.partition).__add__, dead)

    def flush_dead_letters(self) -> None:
        from orchestrator.spark.writer import stage_dead_letters

        stage_dead_letters(self.catalog_schema, self.dead)
        self.dead = []

    def flush(self) -> pa.RecordBatch:
        arrays = kafka_arrays(self.topic, self.partition, self.offsets, self.timestamps,
                              self.keys, self.headers, self.wanted)
        n = len(self.offsets)
        for name, values in zip(self.schema.names[len(KAFKA_FIELDS):], self.fields, strict=True):
            kind = self.schema.field(name).type
            arrays.append(built_or_null(name, self.wanted, n, kind,
                                        partial(pa.array, values, kind)))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._reset()
        return batch


def utf8_keys(keys: list[bytes | None]) -> pa.Array:
    """Keys as UTF-8 strings; a key that is not UTF-8 is decoded with replacement characters."""
    raw = pa.array(keys, pa.binary())
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([k.decode("utf-8", "replace") if k is not None else None for k in keys],
                        pa.string())


# [(name, value)] of one record, as confluent-kafka gives them
_Headers = list[tuple[str, bytes | None]]


def built_or_null(name: str, wanted: frozenset[str] | None, n: int, kind: pa.DataType,
           build: Callable[[], pa.Array]) -> pa.Array:
    """``build()`` if the column is wanted, else n nulls of its type (never read: see
    pruning.py)."""
    return build() if wanted is None or name in wanted else pa.nulls(n, kind)


def kafka_arrays(topic: str, partition: int, offsets: list[int], timestamps: list[int],
                 keys: list[bytes | None], headers: list[_Headers | None],
                 wanted: frozenset[str] | None = None) -> list[pa.Array]:
    """The Kafka metadata columns of one batch, in KAFKA_FIELDS order (null where not
    ``wanted``)."""
    n = len(offsets)

    def header_lists() -> pa.Array:
        lists = headers if headers.count(None) == n else [h or None for h in headers]
        return pa.array(lists, pa.list_(_HEADER))  # pyarrow reads each (name, value) as a struct

    builds: tuple[Callable[[], pa.Array], ...] = (
        lambda: pa.array([topic] * n, pa.string()),
        lambda: pa.array([partition] * n, pa.int32()),
        lambda: pa.array(offsets, pa.int64()),
        lambda: pa.array(timestamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        .cast(pa.timestamp("us", tz="UTC")),
        lambda: utf8_keys(keys),
        header_lists,  # none, or an empty list: null, as from Kafka
    )
    return [built_or_null(field.name, wanted, n, field.type, build)
            for field, build in zip(KAFKA_FIELDS, builds, strict=True)]
