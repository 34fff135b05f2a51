"""While `kappa dev up` restores a lost broker's log, only the restore reaches the new broker.

A client that keeps retrying across a broker's crash (an application's producer, a driver, a
consumer) would otherwise get there first: Tansu creates a topic on any Metadata request that
names it, so the topic would come back empty before the restore got to it, and the restore
would keep it; or the client would write into a topic half-restored. Until the restore is done,
the ack proxy passes on only the connections whose first request carries the restore's client
id, written here (mode 0600) by `kappa dev up`; the others are closed, and their clients retry.
The file stays until a restore succeeds, so a failed one holds clients off until the next
`kappa dev up` restores again.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from orchestrator.kafka.endpoint import RESTORE_CLIENT_ID_PREFIX

HELD_FILE = "clients-held"
CLIENT_ID_PREFIX = RESTORE_CLIENT_ID_PREFIX


def held_path(dev: Path) -> Path:
    return dev / HELD_FILE


def hold(dev: Path) -> str:
    """Hold clients off (again, if a restore failed); the client id that gets through."""
    path = held_path(dev)
    found = held_client_id(path)
    if found is not None:
        return found
    token = secrets.token_hex(8)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return CLIENT_ID_PREFIX + token


def held_client_id(path: Path) -> str | None:
    """The client id that gets through while clients are held, or None: all get through."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        return None
    return CLIENT_ID_PREFIX + token if token else None


def release(dev: Path) -> None:
    held_path(dev).unlink(missing_ok=True)
