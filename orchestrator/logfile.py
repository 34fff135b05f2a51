"""A driver's log, capped in size: its own output and its JVM's go through a pipe to a file that
is rotated (one older file kept, ``<log>.1``) when it passes the cap. Logs are private to the
user who runs the orchestrator (mode 0600): they name hosts, tables and paths."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import BinaryIO

MODE = 0o600


def open_private(path: Path) -> BinaryIO:
    """Open ``path`` for appending, created (or narrowed) to mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, MODE)
    os.fchmod(fd, MODE)
    return os.fdopen(fd, "ab", buffering=0)


class RotatingLog(threading.Thread):
    """Copies everything written to this process's stdout and stderr (and its children's) into
    ``path``, rotating it at ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        super().__init__(name="kappa-log", daemon=True)
        self.path, self.max_bytes = path, max(1_000_000, max_bytes)
        self._lock = threading.Lock()  # the file changes under retarget()
        self._read, write = os.pipe()
        self._file = open_private(path)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)

    def run(self) -> None:
        while chunk := os.read(self._read, 65536):
            with self._lock:
                self._write(chunk)
        self._file.close()

    def _write(self, chunk: bytes) -> None:
        if self._file.tell() + len(chunk) > self.max_bytes:
            # Rotate at the last line's end that fits, so that each file starts with a whole
            # line and none passes the cap.
            room = max(0, self.max_bytes - self._file.tell())
            cut = chunk.rfind(b"\n", 0, room) + 1
            self._file.write(chunk[:cut])
            self._file.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._file = open_private(self.path)
            chunk = chunk[cut:]
        self._file.write(chunk)

    def retarget(self, path: Path) -> None:
        """Write what follows into ``path``: a warm spare's log becomes its version's."""
        sys.stdout.flush()
        sys.stderr.flush()
        with self._lock:
            previous, self._file, self.path = self._file, open_private(path), path
            previous.close()

    def finish(self, timeout_s: float = 5.0) -> None:
        """Flush and stop: the thread ends once every writer (a JVM too) has closed the pipe."""
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # not a close: the interpreter still flushes them at exit
        os.dup2(devnull, 2)
        os.close(devnull)
        self.join(timeout_s)
