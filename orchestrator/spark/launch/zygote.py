"""A fork server for the Python processes a driver's JVM starts on its host.

Spark starts a fresh interpreter for each kind of Python work: the streaming source's runner
(again for every query: each catch-up round and the live query), and one daemon each to look
up, create and plan data sources and to run read tasks. Each imports pyspark, pyarrow and the
log source before it does anything: 0.3 s on an idle core, 1.2-1.5 s while the JVM plans the
query beside it, on the path from a deploy to its first batch.

The driver starts this process before its JVM (``python -m orchestrator.spark.launch.zygote PATH``);
it imports all of that once and listens on the Unix socket PATH. The worker site's
sitecustomize (every Python process that the JVM starts runs it first) hands the process over
when its module is one of :data:`MODULES`: it sends its standard streams, environment, working
directory and arguments; the zygote forks a child that takes them on and runs the module, and
the started process waits for the child's exit status and exits with it. Until the zygote
listens, or when it is gone, processes start as before.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import struct
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from orchestrator.spark.daemon import PRELOAD as WORKER_PRELOAD
from orchestrator.spark.launch.zygote_client import (
    HASH_SEED_VARIABLE,
    HEADER,
    RUNNER,
    SOCKET_VARIABLE,
    STATUS,
)
from orchestrator.spark.pyspark_path import is_source_zip

_PRELOAD = (
    "pyspark", "pyspark.daemon", RUNNER,
    "pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    # What the source of an archived log imports in its first batch: 0.1-0.2 s.
    "orchestrator.archive.parquet_store", "orchestrator.catalog.archive_manifest",
    "orchestrator.archive.table_checksum",
    # What the read tasks' daemon, forked here too, holds for its workers (pyspark's
    # worker, pyarrow, pandas, the log source).
    *WORKER_PRELOAD,
)


def start() -> int:
    """Start this driver's zygote, and name it in this process's environment, which the JVM
    (started next) and the processes it starts inherit; its PID. It ends with the driver.

    posix_spawn rather than subprocess.Popen: nothing waits for the zygote, which exits once
    orphaned, and a Popen object dropped (or collected at exit) while its child runs warns
    (ResourceWarning). In the driver's process group, as a Popen's child was: a stop that
    signals the group ends it too."""
    path = str(Path(tempfile.mkdtemp(prefix="kappa-zygote-")) / "zygote.sock")
    seed = os.environ.get("PYTHONHASHSEED", "0")  # what pyspark gives its workers unless set
    pid = os.posix_spawn(sys.executable,
                         [sys.executable, "-m", "orchestrator.spark.launch.zygote", path],
                         {**os.environ, "PYTHONUNBUFFERED": "YES", "PYTHONHASHSEED": seed},
                         file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
    os.environ[SOCKET_VARIABLE] = path
    os.environ[HASH_SEED_VARIABLE] = seed
    return pid


def serve(path: str) -> None:
    for module in _PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    # Out of the children's collections: a collection neither walks these objects nor copies
    # their pages.
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    driver = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(16)
    os.rename(path + ".tmp", path)  # found only once it listens
    server.settimeout(2.0)
    try:
        while os.getppid() == driver:  # orphaned: the driver is gone, and so is its JVM
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            _fork_for(server, conn)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(os.path.dirname(path))


def _fork_for(server: socket.socket, conn: socket.socket) -> None:
    conn.settimeout(10.0)
    fds: list[int] = []
    try:
        header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
        (length,) = HEADER.unpack(header)
        payload = b""
        while len(payload) < length:
            chunk = conn.recv(length - len(payload))
            if not chunk:
                raise ConnectionError("the process hung up")
            payload += chunk
        request = json.loads(payload)
    except (OSError, ValueError, struct.error):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        server.close()
        _become(conn, request, fds)
    for fd in fds:
        os.close(fd)
    conn.close()


def _become(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the child: take on the started process's streams, environment and arguments, run
    its module, report its status. Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a daemon waits for its own children
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # Entries its PYTHONPATH has that this process started without (a job's code).
        for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path and not is_source_zip(entry):
                sys.path.insert(0, entry)
        module = request["module"]
        sys.argv = [module, *request["args"]]
        # Run afresh as __main__; left in sys.modules, runpy warns that it was imported.
        sys.modules.pop(module, None)
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            conn.sendall(STATUS.pack(code))
        os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1])
