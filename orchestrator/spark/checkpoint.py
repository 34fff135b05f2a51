"""A version's Spark checkpoint: the offset log Spark writes, and our one file beside it.

Spark writes ``<checkpoint>/offsets/<batch id>`` before it runs the batch, so inside
``foreachBatch`` the batch's end offsets are known exactly, and the previous entry gives its start.

A checkpoint may be a local path or any URI that Spark accepts (``hdfs://``, ``s3a://``, ...),
so that a driver can move hosts. Local paths are read with pathlib; a URI needs the driver's
Hadoop file system, reached through its Spark session (``jvm``), so this module imports no
pyspark and the service side can still inspect local checkpoints.

``kappa.json`` holds the checkpoint's *batch base*: Spark numbers a new checkpoint's batches
from 0, but a version that lost its checkpoint has already applied batches under those ids. The
catalog keys a batch by base + Spark's id, and the base lives with the checkpoint it belongs to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from orchestrator.models import Offsets

_META = "kappa.json"
FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_FILE_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                      "FileSystemBasedCheckpointFileManager")


def is_local(location: str) -> bool:
    scheme = urlparse(location).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter


def _is_uri(location: str) -> bool:
    return len(urlparse(location).scheme) > 1


def local_path(location: str) -> Path:
    parsed = urlparse(location)
    return Path(parsed.path) if parsed.scheme == "file" else Path(location)


def write_through_filesystem(spark: Any, location: str) -> None:
    """Have Spark write a local checkpoint through Hadoop's FileSystem, not its FileContext.

    Without Hadoop's native library (pip's pyspark has none), FileContext checks the rename of
    each checkpoint file and of its checksum with eight ``readlink`` processes, beside the two
    ``chmod`` processes that give both their mode: 20 processes per micro-batch for the offset
    and commit logs alone, more for a state store's files. The FileSystem-based manager starts no
    ``readlink`` (the ``chmod`` are RawLocalFileSystem's own and stay). On a local disk its
    rename is FileContext's: both check that the target is absent, then rename. Other
    checkpoints (``hdfs://``, ...) keep Spark's default."""
    if is_local(location):
        spark.conf.set(FILE_MANAGER_CONF, LOCAL_FILE_MANAGER)


class Checkpoint:
    """Reads and writes small files of one checkpoint. ``spark``: the driver's session, needed
    for a location that is not local."""

    def __init__(self, location: str, spark: Any | None = None) -> None:
        self.location = location.rstrip("/")
        self._fs: Any = None
        self._jvm: Any = None
        # A URI goes through Hadoop's file system whenever a session is at hand (file:// too,
        # so that the path a remote checkpoint takes is the one tests run).
        if _is_uri(location) and (spark is not None or not is_local(location)):
            if spark is None:
                raise ValueError(f"checkpoint {location} is not local: only a driver can read it")
            self._jvm = spark._jvm
            hadoop_path = self._jvm.org.apache.hadoop.fs.Path(self.location)
            self._fs = hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration())

    def _read(self, relative: str) -> str | None:
        if self._fs is None:
            path = local_path(self.location) / relative
            return path.read_text() if path.is_file() else None
        path = self._jvm.org.apache.hadoop.fs.Path(f"{self.location}/{relative}")
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def _write(self, relative: str, text: str) -> None:
        if self._fs is None:
            path = local_path(self.location) / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        stream = self._fs.create(self._jvm.org.apache.hadoop.fs.Path(
            f"{self.location}/{relative}"), True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def has_batches(self) -> bool:
        """True if Spark has planned at least one batch here (its offset log is not empty)."""
        return bool(self._batch_ids("offsets"))

    def _batch_ids(self, folder: str) -> list[int]:
        if self._fs is None:
            path = local_path(self.location) / folder
            names = [p.name for p in path.iterdir()] if path.is_dir() else []
        else:
            path = self._jvm.org.apache.hadoop.fs.Path(f"{self.location}/{folder}")
            names = ([str(st.getPath().getName()) for st in self._fs.listStatus(path)]
                     if self._fs.exists(path) else [])
        return sorted(int(name) for name in names if name.isdigit())

    def unfinished_plan(self) -> tuple[int, Offsets] | None:
        """The batch Spark planned (its offsets are logged) and did not finish (no commit):
        its id and end offsets."""
        planned, finished = self._batch_ids("offsets"), self._batch_ids("commits")
        if not planned or (finished and planned[-1] <= finished[-1]):
            return None
        ends = self.batch_end_offsets(planned[-1])
        return None if ends is None else (planned[-1], ends)

    def forget_batch(self, batch_id: int) -> None:
        """Remove an unfinished batch's plan: Spark plans that batch again, from where the
        last finished one ended, as when it first got there."""
        if self._fs is None:
            offsets = local_path(self.location) / "offsets"
            for name in (str(batch_id), f".{batch_id}.crc"):
                (offsets / name).unlink(missing_ok=True)
            return
        self._fs.delete(self._jvm.org.apache.hadoop.fs.Path(
            f"{self.location}/offsets/{batch_id}"), False)

    def batch_end_offsets(self, batch_id: int) -> Offsets | None:
        text = self._read(f"offsets/{batch_id}")
        return None if text is None else _offsets(text)

    def batch_base(self) -> int:
        text = self._read(_META)
        return int(json.loads(text).get("batch_base", 0)) if text else 0

    def start(self, batch_base: int, start_offsets: Offsets) -> None:
        """Record a new checkpoint's batch base and the offsets its first batch starts from."""
        self._write(_META, json.dumps({"batch_base": batch_base, "start": start_offsets}))

    def start_offsets(self) -> Offsets | None:
        text = self._read(_META)
        start = json.loads(text).get("start") if text else None
        return None if start is None else {t: {str(p): int(o) for p, o in ps.items()}
                                           for t, ps in start.items()}


def remove_local(location: str) -> bool:
    """Delete a local checkpoint; False for a URI, which only its file system can remove."""
    if not is_local(location):
        return False
    shutil.rmtree(local_path(location), ignore_errors=True)
    return True


def set_aside_local(location: str, suffix: str) -> str | None:
    """Rename a local checkpoint out of the way (kept for inspection); its new path, or None
    if there was none."""
    path = local_path(location)
    if not path.exists():
        return None
    target = path.with_name(f"{path.name}.{suffix}")
    path.rename(target)
    return str(target)


def batch_end_offsets(checkpoint_dir: str | Path, batch_id: int) -> Offsets | None:
    return Checkpoint(str(checkpoint_dir)).batch_end_offsets(batch_id)


def _offsets(text: str) -> Offsets:
    lines = [line for line in text.splitlines() if line.strip()]
    # Line 0 is the log version, line 1 the batch metadata, then one line per source: a job
    # reads each topic through its own source, and each source's offsets name their topic.
    offsets: Offsets = {}
    for line in lines[2:]:
        if line.strip() == "-":  # a source with no offset yet
            continue
        for topic, partitions in json.loads(line).items():
            offsets.setdefault(topic, {}).update({str(p): int(o) for p, o in partitions.items()})
    return offsets
