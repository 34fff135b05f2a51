"""The S3 server (the npm package s3rver) that holds the log of a broker started with
`kappa dev up --s3`: Tansu's only durable storage engine in this build, kept for a log that the
broker itself must keep on disk. Its reads slow down as a partition's batch objects grow in
number, so the embedded default keeps the log in memory and archives it instead."""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.logs import tail as _tail
from orchestrator.dev.processes import STOP_TIMEOUT_S, exited, listens, pick_port, poll
from orchestrator.errors import ConfigError, ServiceUnavailableError
from orchestrator.process import spawn_detached

BROKER_HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
S3RVER_VERSION = "3.7.1"
_BUCKET = "tansu"
# s3rver accepts any key pair it is configured with; these are its documented defaults and
# guard nothing but a loopback port (they are no secret).
_S3_ENV = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER",
           "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1"}


def store_environment(store_port: int) -> dict[str, str]:
    """What the broker needs in its environment to use the store."""
    return {**_S3_ENV, "AWS_ENDPOINT": f"http://{BROKER_HOST}:{store_port}"}


def engine() -> str:
    return f"s3://{_BUCKET}/"


def s3rver_path() -> Path:
    """The s3rver executable: $KAPPA_S3RVER, else the one scripts/setup.sh installs beside the
    venv's Python, else on PATH."""
    configured = os.environ.get("KAPPA_S3RVER")
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(sys.prefix) / "node" / "node_modules" / ".bin" / "s3rver")
    found = shutil.which("s3rver")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ConfigError(
        "the durable log needs the S3 server s3rver (Node.js), which is not installed: run "
        f"`bash scripts/setup.sh`, or `npm install --prefix {sys.prefix}/node "
        f"s3rver@{S3RVER_VERSION}`; or `kappa dev up --memory` for a volatile log")


def start_store(dev: Path, preferred_port: Any, *, same_port: bool) -> dict[str, Any]:
    binary = s3rver_path()
    if shutil.which("node") is None:
        raise ConfigError("s3rver needs Node.js, which is not on PATH: install it (e.g. "
                          "`apt-get install nodejs`), or run `kappa dev up --memory`")
    data = dev / "log"
    data.mkdir(exist_ok=True)
    port = pick_port(preferred_port)
    if same_port and port != preferred_port:
        raise ServiceUnavailableError(
            f"the log store's port {preferred_port} is taken by another process, and the "
            "running broker knows the store only there: run `kappa dev down`, then `kappa dev "
            "up`")
    # --configure-bucket last: it takes a variable number of arguments.
    argv = [str(binary), "--directory", str(data), "--port", str(port), "--address",
            BROKER_HOST, "--silent", "--configure-bucket", _BUCKET]
    log = dev / "log-store.log"
    pid = spawn_detached(argv, os.environ, log)
    proc = psutil.Process(pid)
    if not poll(lambda: exited(proc) or listens(port), START_TIMEOUT_S) or exited(proc):
        with suppress(psutil.Error):
            proc.kill()
        poll(lambda: exited(proc), STOP_TIMEOUT_S)
        raise ServiceUnavailableError(
            f"the log store (s3rver) did not come up on {BROKER_HOST}:{port}: {_tail(log)}; "
            f"see {log}, fix it and run `kappa dev up` again")
    return {"store_pid": pid, "store_cmdline": proc.cmdline(), "store_port": port}
