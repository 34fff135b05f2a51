"""Just enough of the Kafka wire protocol to learn, from the bytes a client and a broker
exchange, which offsets the broker acknowledged: the partitions and record counts of a Produce
request, the base offsets of its response, and the topics a DeleteTopics request removes.

Frames are ``INT32 size`` followed by the message. A request header is api key, api version,
correlation id and client id (plus tagged fields in the flexible versions); a response header is
the correlation id (plus tagged fields when the request was flexible). Produce is flexible from
v9 and DeleteTopics from v4; Produce v13 names topics by id, which this module does not map, so
the ack ledger refuses it (the broker's ApiVersions answer decides what clients send).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PRODUCE, DELETE_TOPICS = 0, 20
_PRODUCE_FLEXIBLE, _DELETE_FLEXIBLE = 9, 4
_PRODUCE_BY_TOPIC_ID = 13
# A record batch's lastOffsetDelta sits 23 bytes into its header, after baseOffset (8),
# batchLength (4), partitionLeaderEpoch (4), magic (1), crc (4) and attributes (2).
_LAST_OFFSET_DELTA_AT = 23
_BATCH_OVERHEAD = 12  # baseOffset and batchLength, which batchLength does not count


class WireError(ValueError):
    """Bytes that do not parse as the message they claim to be."""


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True)
class PartitionAck:
    topic: str
    partition: int
    error_code: int
    base_offset: int


class _Reader:
    def __init__(self, data: bytes | memoryview, at: int = 0):
        self.data, self.at = memoryview(data), at

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise WireError(f"message ends at {len(self.data)}, wanted {n} bytes at {self.at}")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def int8(self) -> int:
        value: int = struct.unpack(">b", self.take(1))[0]
        return value

    def int16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def int64(self) -> int:
        value: int = struct.unpack(">q", self.take(8))[0]
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise WireError(f"varint too long at {self.at}")

    def length(self, flexible: bool, *, wide: bool = False) -> int:
        """A string, bytes or array length; -1 for null."""
        if flexible:
            return self.uvarint() - 1
        return self.int32() if wide else self.int16()

    def string(self, flexible: bool) -> str | None:
        n = self.length(flexible)
        return None if n < 0 else bytes(self.take(n)).decode("utf-8", "replace")

    def array_length(self, flexible: bool) -> int:
        return self.uvarint() - 1 if flexible else self.int32()

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def request_header(message: bytes | memoryview) -> tuple[RequestHeader, _Reader]:
    """The header of a request (without its size prefix) and a reader at its body."""
    reader = _Reader(message)
    header = RequestHeader(reader.int16(), reader.int16(), reader.int32())
    reader.string(False)  # client id: a plain nullable string in every header version
    if _flexible(header.api_key, header.api_version):
        reader.skip_tags()
    return header, reader


def request_client_id(message: bytes | memoryview) -> str | None:
    """The client id of a request (without its size prefix)."""
    reader = _Reader(message)
    reader.int16(), reader.int16(), reader.int32()
    return reader.string(False)


def _flexible(api_key: int, version: int) -> bool:
    return (api_key == PRODUCE and version >= _PRODUCE_FLEXIBLE) or (
        api_key == DELETE_TOPICS and version >= _DELETE_FLEXIBLE)


def produce_counts(message: bytes | memoryview
                   ) -> tuple[RequestHeader, int, dict[tuple[str, int], int]]:
    """A Produce request's header, its acks, and (topic, partition) -> offsets its record
    batches take."""
    header, reader = request_header(message)
    if header.api_key != PRODUCE:
        raise WireError(f"api key {header.api_key} is not Produce")
    version = header.api_version
    if version < 3 or version >= _PRODUCE_BY_TOPIC_ID:
        raise WireError(f"Produce v{version} is not understood (v3 to v12 are)")
    flexible = version >= _PRODUCE_FLEXIBLE
    reader.string(flexible)  # transactional id
    acks = reader.int16()
    reader.int32()  # timeout
    counts: dict[tuple[str, int], int] = {}
    for _ in range(reader.array_length(flexible)):
        topic = reader.string(flexible) or ""
        for _ in range(reader.array_length(flexible)):
            partition = reader.int32()
            size = reader.length(flexible, wide=True)
            records = reader.take(size) if size > 0 else memoryview(b"")
            counts[(topic, partition)] = counts.get((topic, partition), 0) + batch_offsets(
                records)
            if flexible:
                reader.skip_tags()
        if flexible:
            reader.skip_tags()
    return header, acks, counts


def batch_offsets(records: bytes | memoryview) -> int:
    """How many offsets the record batches in ``records`` take (magic 2 batches)."""
    view, at, taken = memoryview(records), 0, 0
    while at < len(view):
        if at + _LAST_OFFSET_DELTA_AT + 4 > len(view):
            raise WireError(f"record batch header cut off at byte {at}")
        batch_length: int = struct.unpack_from(">i", view, at + 8)[0]
        if view[at + 16] != 2:
            raise WireError(f"record batch of magic {view[at + 16]} (only 2 is understood)")
        last_delta: int = struct.unpack_from(">i", view, at + _LAST_OFFSET_DELTA_AT)[0]
        taken += last_delta + 1
        at += _BATCH_OVERHEAD + batch_length
    return taken


def produce_acks(message: bytes | memoryview, version: int) -> tuple[int, list[PartitionAck]]:
    """A Produce response's correlation id and what it says of each partition."""
    flexible = version >= _PRODUCE_FLEXIBLE
    reader = _Reader(message)
    correlation_id = reader.int32()
    if flexible:
        reader.skip_tags()
    acks = []
    for _ in range(reader.array_length(flexible)):
        topic = reader.string(flexible) or ""
        for _ in range(reader.array_length(flexible)):
            partition, error_code, base_offset = reader.int32(), reader.int16(), reader.int64()
            acks.append(PartitionAck(topic, partition, error_code, base_offset))
            reader.int64()  # log append time
            if version >= 5:
                reader.int64()  # log start offset
            if version >= 8:
                for _ in range(reader.array_length(flexible)):
                    reader.int32()
                    reader.string(flexible)
                    if flexible:
                        reader.skip_tags()
                reader.string(flexible)  # error message
            if flexible:
                reader.skip_tags()
        if flexible:
            reader.skip_tags()
    return correlation_id, acks


def delete_outcomes(message: bytes | memoryview, version: int) -> dict[str, int]:
    """What a DeleteTopics response (v0 to v5) says of each topic: its error code, 0 when the
    topic was deleted."""
    if not 0 <= version <= 5:
        raise WireError(f"not a DeleteTopics response of v0 to v5: v{version}")
    flexible = version >= _DELETE_FLEXIBLE
    reader = _Reader(message)
    reader.int32()  # correlation id
    if flexible:
        reader.skip_tags()
    if version >= 1:
        reader.int32()  # throttle time
    outcomes = {}
    for _ in range(reader.array_length(flexible)):
        topic = reader.string(flexible) or ""
        outcomes[topic] = reader.int16()
        if version >= 5:
            reader.string(flexible)  # error message
        if flexible:
            reader.skip_tags()
    return outcomes


def deleted_topics(message: bytes | memoryview) -> list[str]:
    """The topic names a DeleteTopics request (v0 to v5) removes."""
    header, reader = request_header(message)
    if header.api_key != DELETE_TOPICS or header.api_version > 5:
        raise WireError(f"not a DeleteTopics request of v0 to v5: {header}")
    flexible = header.api_version >= _DELETE_FLEXIBLE
    return [reader.string(flexible) or "" for _ in range(reader.array_length(flexible))]
