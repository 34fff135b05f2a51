"""Segments as Parquet files under the archive root: a local path or any URI that pyarrow's
filesystems accept.

A segment is written whole and then put in place under its final name, so that a reader (and
the manifest, which records a segment only after this) never sees half of one: on a local disk
it is written to a temporary name, synced, renamed and its directory synced; an object store's
PUT is atomic by itself.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

from orchestrator.archive_model.segments import (
    ArchivedRecord,
    ArchiveError,
    parse_segment_name,
)
from orchestrator.failpoints import fail_point

SCHEMA = pa.schema([
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("timestamp_type", pa.int8()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("name", pa.string()), ("value", pa.binary())]))),
])
_TEMPORARY = ".tmp-"


# pyarrow's AWS SDK sends every PUT in aws-chunked encoding with a trailing checksum unless told
# to add checksums only where S3 requires them. S3-compatible stores that do not decode that
# encoding (s3rver, older MinIO, several clouds' S3 APIs) keep its framing as the object's
# bytes: the write succeeds and every read of the segment fails. Each segment carries the
# manifest's own checksum, so asking for the SDK's only where required loses nothing. A
# setting of the user's own wins.
_S3_CHECKSUMS = {"AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
                 "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}


class ParquetStore:
    def __init__(self, root: str):
        self.root = root
        if root.startswith("s3://"):
            for name, value in _S3_CHECKSUMS.items():
                os.environ.setdefault(name, value)
        try:
            self.fs, base = fs.FileSystem.from_uri(root) if "://" in root else (
                fs.LocalFileSystem(), str(Path(root).absolute()))
        except (pa.ArrowInvalid, OSError) as exc:
            raise ArchiveError(f"archive_root {root!r} is not a path or URI that pyarrow can "
                               f"open ({exc}): fix archive_root") from exc
        self.base = base.rstrip("/")
        self.local = isinstance(self.fs, fs.LocalFileSystem)

    def location(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def write(self, relative: str, records: Sequence[ArchivedRecord]) -> int:
        """Write ``records`` as the segment ``relative``; return its size in bytes."""
        return self.write_table(relative, to_table(records))

    def write_table(self, relative: str, table: pa.Table) -> int:
        """Write ``table`` whole under ``relative``, atomically; return its size in bytes."""
        return self.write_bytes(relative, parquet_bytes(table))

    def write_bytes(self, relative: str, data: bytes) -> int:
        """Put ``data`` in place under ``relative``, atomically; return its size in bytes."""
        final = self.location(relative)
        directory = final.rsplit("/", 1)[0]
        try:
            self.fs.create_dir(directory, recursive=True)
            if not self.local:
                with self.fs.open_output_stream(final) as out:
                    out.write(data)
                return len(data)
            temporary = f"{final}{_TEMPORARY}{uuid.uuid4().hex[:12]}"
            with open(temporary, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            fail_point("archive.before_rename")
            os.replace(temporary, final)
            _sync_directory(directory)
            return len(data)
        except OSError as exc:
            raise ArchiveError(f"cannot write segment {final} ({exc}): make archive_root "
                               "writable, or point it elsewhere, and run `kappa archive run` "
                               "again") from exc

    def read(self, relative: str) -> list[ArchivedRecord]:
        return from_table(self.read_table(relative))

    def read_table(self, relative: str) -> pa.Table:
        location = self.location(relative)
        try:
            return pq.read_table(location, filesystem=self.fs, schema=SCHEMA)
        except (OSError, pa.ArrowInvalid) as exc:
            # The store's own error first: a reason cut to length keeps it.
            raise ArchiveError(f"cannot read a segment: {str(exc)[:300]} (segment {location}): "
                               "the store was away, or the segment is gone or damaged; once the "
                               "store answers, run `kappa archive verify`") from exc

    def read_bytes(self, relative: str) -> pa.Buffer:
        """A file's bytes, to check against its manifest checksum before it is parsed."""
        location = self.location(relative)
        try:
            with self.fs.open_input_file(location) as stream:
                return stream.read_buffer()
        except (OSError, pa.ArrowInvalid) as exc:
            raise ArchiveError(f"cannot read a file: {str(exc)[:300]} (file {location}): the "
                               "store was away, or the file is gone or damaged; once the store "
                               "answers, run `kappa archive verify`") from exc

    def remove_tree(self, directory: str) -> None:
        """Delete ``directory`` and all under it (absent: nothing to do)."""
        where = self.location(directory)
        try:
            if self.fs.get_file_info(where).type != fs.FileType.NotFound:
                self.fs.delete_dir(where)
        except OSError as exc:
            raise ArchiveError(f"cannot remove {where} ({exc}): make archive_root writable") \
                from exc

    def files(self, directory: str) -> list[fs.FileInfo]:
        where = self.location(directory)
        try:
            return list(self.fs.get_file_info(fs.FileSelector(where, allow_not_found=True)))
        except OSError as exc:
            raise ArchiveError(f"cannot list {where} ({exc}): make archive_root readable") \
                from exc

    def remove_unrecorded(self, directory: str, recorded: set[str], from_offset: int) -> list[str]:
        """Delete what a crash left in a partition's directory: temporary files, and segments
        at or past ``from_offset`` that the manifest does not hold. Returns their names; a
        recorded segment that is not there stops the archive."""
        infos = self.files(directory)
        missing = sorted(recorded - {info.base_name for info in infos})
        if missing:
            raise ArchiveError(
                f"segment {self.location(directory)}/{missing[0]} is in the manifest but gone "
                "from archive_root: restore it from a backup, then run `kappa archive verify`")
        removed = []
        for info in infos:
            base, temporary, _ = info.base_name.partition(_TEMPORARY)
            bounds = parse_segment_name(base)
            if bounds is None:
                continue  # not the archive's
            if temporary or (base not in recorded and bounds[0] >= from_offset):
                self.fs.delete_file(info.path)
                removed.append(info.base_name)
        return removed


def parquet_bytes(table: pa.Table, plain: tuple[str, ...] = ()) -> bytes:
    """A table as one Parquet file's bytes (zstd), the way every segment is written; the
    ``plain`` columns without a dictionary (Spark's reader would test a range filter against
    every entry of an offsets' dictionary, each as large as the column)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd",
                   use_dictionary=[c for c in table.column_names if c not in plain]
                   if plain else True)
    return bytes(sink.getvalue())


def to_table(records: Sequence[ArchivedRecord]) -> pa.Table:
    columns: list[Sequence[object]] = (list(zip(*records, strict=True)) if records
                                       else [[] for _ in SCHEMA])
    headers = [None if h is None else [{"name": n, "value": v} for n, v in h]  # type: ignore[attr-defined]
               for h in columns[5]]
    return pa.table([pa.array(columns[0], pa.int64()), pa.array(columns[1], pa.int64()),
                     pa.array(columns[2], pa.int8()), pa.array(columns[3], pa.binary()),
                     pa.array(columns[4], pa.binary()), pa.array(headers, SCHEMA.field(5).type)],
                    schema=SCHEMA)


# (offset, timestamp ms, key, value, headers): a record as the Kafka reader gives it
Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]


def from_table(table: pa.Table) -> list[ArchivedRecord]:
    rows = zip(*(table.column(name).to_pylist() for name in SCHEMA.names), strict=True)
    return [(offset, ts, ts_type, key, value,
             None if headers is None else [(h["name"], h["value"]) for h in headers])
            for offset, ts, ts_type, key, value, headers in rows]


def as_records(table: pa.Table) -> list[Record]:
    """Archived records as the Kafka reader gives them, for the record-by-record parser."""
    return [(o, ts, key, value, headers) for o, ts, _, key, value, headers in from_table(table)]


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
