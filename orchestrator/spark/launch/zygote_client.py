"""The started process's side of the zygote (orchestrator.spark.launch.zygote): light, because the
worker site runs it first in every Python process that a driver's JVM starts."""

from __future__ import annotations

import contextlib
import os
import struct
import sys

SOCKET_VARIABLE = "KAPPA_ZYGOTE_SOCKET"
# The zygote's hash seed: a forked child keeps it, so only a process asking for the same seed
# (Spark gives its workers PYTHONHASHSEED, 0 by default) is handed over.
HASH_SEED_VARIABLE = "KAPPA_ZYGOTE_HASH_SEED"
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
# The streaming source's runner, the daemons that look up, create and plan data sources, and the
# read tasks' daemon (orchestrator.spark.daemon): the processes a query waits for before its
# first batch. (Tried before the daemon froze its imports out of the collector, read workers
# forked from the zygote replayed 15 % slower; now faster than started ones: README.)
MODULES = (RUNNER, "pyspark.daemon", "orchestrator.spark.daemon")
HEADER = struct.Struct("!I")
STATUS = struct.Struct("!i")


def hand_over() -> None:
    """If this process's module is one the zygote runs and the zygote listens, let it run there
    and exit with its status; else return, and the process starts as it would have."""
    path = os.environ.get(SOCKET_VARIABLE)
    argv = getattr(sys, "orig_argv", [])
    if not path or "-m" not in argv or \
            os.environ.get("PYTHONHASHSEED") != os.environ.get(HASH_SEED_VARIABLE):
        return
    at = argv.index("-m")
    if at + 1 >= len(argv) or argv[at + 1] not in MODULES:
        return
    # Only here: every Python process that a driver's JVM starts runs the lines above.
    import json
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        payload = json.dumps({"module": argv[at + 1], "args": argv[at + 2:], "cwd": os.getcwd(),
                              "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
        conn.sendall(payload)
    except OSError:
        conn.close()
        return
    status = b""
    with contextlib.suppress(OSError):
        while len(status) < STATUS.size and (chunk := conn.recv(STATUS.size - len(status))):
            status += chunk
    os._exit(STATUS.unpack(status)[0] if len(status) == STATUS.size else 1)
