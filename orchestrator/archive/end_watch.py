"""The archiver's watch of the log ends: it notes them five times a second, beside the passes.

After a crash of a volatile broker (the embedded default's), what it acknowledged past the
archive's end is reported by offset up to the highest log end noted (`archive_log_ends`). A
pass notes the ends once, as it begins, and a pass that spends seconds writing segments would
leave everything acknowledged meanwhile unreported. The watch narrows that window to about one
interval, whatever the passes do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self

import psycopg

from orchestrator.archive_model.segments import Lineage
from orchestrator.catalog import archive_manifest as manifest
from orchestrator.kafka.admin import admin_client, log_identity
from orchestrator.kafka.clients import LogClients
from orchestrator.kafka.endpoint import Kafka

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger("kappa.archive")

# A crash of the broker loses, unreported, what it acknowledged in about this long.
NOTE_EVERY_S = 0.2


@dataclass(frozen=True)
class WatchedLog:
    root: Lineage  # whose ends are noted: the lineage a restore continues
    seen: Lineage  # the topic as the broker holds it (the root itself, or a restore of it)


class LogEndWatch:
    """A thread with its own broker clients and catalog connection. Errors (an outage, a topic
    being restored) skip a note: the passes report them."""

    def __init__(self, kafka: Kafka, conn_factory: Callable[[], psycopg.Connection],
                 schema: str, every_s: float = NOTE_EVERY_S) -> None:
        self.kafka, self.conn_factory, self.schema = kafka, conn_factory, schema
        self.every_s = every_s
        self._watched: dict[str, WatchedLog] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-end-watch", daemon=True)

    def watch(self, logs: Mapping[str, WatchedLog]) -> None:
        """The topics to watch from now on, as the last pass found them."""
        with self._lock:
            self._watched = dict(logs)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        clients = LogClients(self.kafka)
        admin = admin_client(self.kafka)
        conn: psycopg.Connection | None = None
        noted: dict[tuple[str, int], int] = {}
        last_error = ""
        try:
            while not self._stop.wait(self.every_s):
                with self._lock:
                    watched = dict(self._watched)
                if not watched:
                    continue
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = self.conn_factory()
                    self._note(conn, clients, admin, watched, noted)
                    last_error = ""
                except Exception as exc:  # the next note tries again
                    if str(exc) != last_error:  # once, not five times a second
                        log.warning("log ends not noted: %s", exc)
                    last_error = str(exc)
        finally:
            clients.close()
            if conn is not None:
                conn.close()

    def _note(self, conn: psycopg.Connection, clients: LogClients, admin: AdminClient,
              watched: dict[str, WatchedLog], noted: dict[tuple[str, int], int]) -> None:
        bounds = clients.bounds(list(watched))
        # Asked after the read: ends read from a topic recreated meanwhile are not the root's.
        identity = log_identity(self.kafka, list(watched), admin=admin)
        changed: dict[tuple[str, int], int] = {}
        with conn.transaction():
            for topic, logged in watched.items():
                if (identity.cluster_id, identity.topics.get(topic)) != (
                        logged.seen.cluster_id, logged.seen.topic_id):
                    continue
                ends = {p: end for (name, p), (_, end) in bounds.items()
                        if name == topic and noted.get((name, p)) != end}
                if ends:
                    manifest.note_log_ends(conn, self.schema, logged.root, ends)
                    changed.update({(topic, p): end for p, end in ends.items()})
        noted.update(changed)
