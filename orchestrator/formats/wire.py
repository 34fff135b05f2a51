"""The schema registry's wire format, as Confluent's serializers write it (and Karapace,
Redpanda and Apicurio's compatible serializers): a magic byte 0, the writer schema's id in 4
bytes big-endian, then, for Protobuf only, the indexes of the message in its file's
descriptor, then the encoded record.

The message indexes are a count and then each index, all zigzag varints; the first message of
the file, by far the most common, is written as a single 0 (no count)."""

from __future__ import annotations

from dataclasses import dataclass

MAGIC = 0
HEADER_BYTES = 5
_MAX_VARINT_BYTES = 10


class FrameError(ValueError):
    """A value that is not in the wire format; its message is the dead letter's reason."""


@dataclass(frozen=True)
class Framed:
    schema_id: int
    body: bytes  # after the header: for Protobuf, the indexes and then the message


def split(value: bytes) -> Framed:
    """The writer schema's id and what follows it, or FrameError saying why there are none."""
    if len(value) < HEADER_BYTES:
        raise FrameError(f"not in the schema registry's wire format: {len(value)} bytes, fewer "
                         f"than its {HEADER_BYTES}-byte header")
    if value[0] != MAGIC:
        raise FrameError("not in the schema registry's wire format: no magic byte (the first "
                         f"byte is 0x{value[0]:02x}, not 0x00)")
    return Framed(int.from_bytes(value[1:HEADER_BYTES], "big", signed=True),
                  bytes(value[HEADER_BYTES:]))


def read_frame(value: bytes | None, *, indexed: bool) -> tuple[int, bytes] | str:
    """(writer schema id, encoded record) of a record's value, or why it is a dead letter;
    ``indexed``: Protobuf's message indexes follow the id (read past)."""
    if value is None:
        return "empty value (tombstone)"
    try:
        framed = split(value)
        body = message_indexes(framed.body)[1] if indexed else framed.body
    except FrameError as exc:
        return str(exc)
    return framed.schema_id, body


def message_indexes(body: bytes) -> tuple[tuple[int, ...], bytes]:
    """Protobuf: the message's indexes in its file's descriptor, and the message's bytes."""
    count, at = _zigzag_varint(body, 0)
    if count == 0:
        return (0,), body[at:]
    if count < 0 or count > len(body):
        raise FrameError(f"garbled message indexes: a count of {count}")
    indexes = []
    for _ in range(count):
        index, at = _zigzag_varint(body, at)
        if index < 0:
            raise FrameError(f"garbled message indexes: index {index}")
        indexes.append(index)
    return tuple(indexes), body[at:]


def _zigzag_varint(data: bytes, at: int) -> tuple[int, int]:
    """One zigzag varint from ``at``: (its value, the position after it)."""
    shift = result = 0
    for i in range(at, min(len(data), at + _MAX_VARINT_BYTES)):
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    raise FrameError("truncated message indexes: the value ends inside a varint")


def frame(schema_id: int, body: bytes, indexes: tuple[int, ...] | None = None) -> bytes:
    """The wire format of ``body`` (what a producer writes; the samples and tests use it)."""
    head = bytes([MAGIC]) + schema_id.to_bytes(4, "big", signed=True)
    if indexes is None:
        return head + body
    if indexes == (0,):
        return head + b"\x00" + body
    return head + b"".join(_zigzag(v) for v in (len(indexes), *indexes)) + body


def _zigzag(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7
