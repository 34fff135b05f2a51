"""The manifest's checksum of a segment, computed from its Arrow table without a Python object
per record.

``segments.checksum`` defines the digest: SHA-256 over every field of every record, each
length-prefixed. Here the same byte stream is laid out by Arrow kernels, one concatenation per
record in C, and hashed in one call. A segment whose records carry headers takes the
per-record definition itself: headers are rare, and the digest must not differ by a byte.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.archive_model.segments import checksum


def table_checksum(table: pa.Table) -> str:
    """``segments.checksum`` of the records of ``table`` (parquet_store.SCHEMA)."""
    if table.num_rows and table.column("headers").null_count != table.num_rows:
        from orchestrator.archive.parquet_store import from_table

        return checksum(from_table(table))
    digest = hashlib.sha256()
    if table.num_rows:
        stream = _record_bytes(table)
        _, offsets, data = stream.buffers()
        bounds = np.frombuffer(offsets, np.int64)[stream.offset:stream.offset + len(stream) + 1]
        digest.update(memoryview(data)[int(bounds[0]):int(bounds[-1])])
    return digest.hexdigest()


def _record_bytes(table: pa.Table) -> pa.LargeBinaryArray:
    """Each record's share of the digested stream, as one binary value per record."""
    key = table.column("key").combine_chunks()
    value = table.column("value").combine_chunks()
    n = table.num_rows
    parts = [
        _longs(table.column("offset").to_numpy()),
        _longs(table.column("timestamp_ms").to_numpy()),
        _longs(table.column("timestamp_type").to_numpy().astype(np.int64)),
        *_field(key),
        *_field(value),
        _longs(np.full(n, -1, np.int64)),  # no headers
    ]
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))


def _field(data: pa.BinaryArray) -> tuple[pa.Array, pa.Array]:
    """A nullable bytes field: its length (-1 for none), then its bytes (none for none)."""
    lengths = pc.binary_length(data).fill_null(-1).to_numpy(zero_copy_only=False)
    filled = data.fill_null(b"").cast(pa.large_binary())
    return _longs(lengths.astype(np.int64)), filled


def _longs(values: np.ndarray) -> pa.Array:
    """Each value as the 8 big-endian bytes that ``struct.pack(">q")`` gives."""
    packed = np.ascontiguousarray(values, dtype=">i8")
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(values),
                                                 [None, pa.py_buffer(packed.tobytes())])
    return fixed.cast(pa.large_binary())
