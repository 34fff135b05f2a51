"""The bounds of the log that a version's replay can read: the broker's, reaching down into the
archive (see ``orchestrator.archive_model.held``) wherever the version's read tasks can read it.

Deploy, resume, restart, the monitor and the switch gates all judge a version's position
against these bounds, so that retention that the archive has covered is no gap anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import psycopg

from orchestrator.archive_model.held import Position, readable_bounds
from orchestrator.archive_model.segments import ArchiveError
from orchestrator.catalog.archive_manifest import held_spans
from orchestrator.log_identity import LogIdentity
from orchestrator.settings import Settings

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def archived_spans(conn: psycopg.Connection, settings: Settings, identity: LogIdentity | None,
                   topics: Sequence[str], broker: Mapping[Position, tuple[int, int]]
                   ) -> dict[Position, tuple[int, int]]:
    """What the archive holds of the log, where replays read it. Asked only once retention has
    taken offsets from the broker (``broker``'s bounds); empty where replays read no archive (a
    plain local archive root with Spark on a cluster: see ``executor_archive_root``)."""
    if all(first == 0 for first, _ in broker.values()) or executor_archive_root(settings) is None:
        return {}
    with conn.transaction():
        return held_spans(conn, settings.catalog_schema, identity, topics)


def log_bounds_with_archive(conn: psycopg.Connection, settings: Settings,
                            identity: LogIdentity | None, topics: Sequence[str],
                            broker: Mapping[Position, tuple[int, int]]
                            ) -> dict[Position, tuple[int, int]]:
    """``broker``'s bounds, reaching into the archive."""
    return readable_bounds(broker, archived_spans(conn, settings, identity, topics, broker))


def archive_root(settings: Settings) -> str:
    """Where the archive's segments live: ``archive_root``, else ``<state_dir>/archive``."""
    return settings.archive_root or str(settings.state_dir / "archive")


def executor_archive_root(settings: Settings) -> str | None:
    """The archive root a version's read tasks read segments from, or None: Kafka serves every
    range. A plain local path is only read where executors run on this host (Spark in local
    mode, or a standalone master on loopback, which no other host's worker can join): on other
    hosts they would not find its files and fail the batch as if the segments were gone. A URI
    (``s3://``, or ``file://`` for a path that every host mounts) is read everywhere."""
    root = archive_root(settings)
    if "://" in root or executors_on_this_host(settings.spark_master):
        return root
    return None


def executors_on_this_host(master: str) -> bool:
    master = master.strip()
    if master.startswith("local"):
        return True
    host = urlsplit(master).hostname if master.startswith("spark://") else None
    return host in _LOOPBACK


def check_archive_readable(conn: psycopg.Connection, settings: Settings,
                           identity: LogIdentity | None, topics: Sequence[str]) -> None:
    """Refuses a version whose replay the archive holds but whose executors cannot read it:
    replays of archived topics stay off the brokers, or say why they cannot."""
    if executor_archive_root(settings) is not None:
        return
    with conn.transaction():
        held = held_spans(conn, settings.catalog_schema, identity, topics)
    if held:
        topic = min(held)[0]
        raise ArchiveError(
            f"the archive holds {topic} under archive_root {archive_root(settings)}, a local "
            f"path that executors on other hosts (spark_master {settings.spark_master}) cannot "
            "read: set archive_root (KAPPA_ARCHIVE_ROOT) to a URI that every host reads "
            "(s3://..., or file://... on a shared mount), then deploy again")
