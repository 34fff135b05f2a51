"""The bounds of the log that a version's replay can read: the broker's, reaching down into the
archive (see ``orchestrator.archive.held``) wherever the version's read tasks can read it.

Deploy, resume, restart, the monitor and the switch gates all judge a version's position
against these bounds, so that retention that the archive has covered is no gap anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg

from orchestrator.archive.held import Position, readable_bounds
from orchestrator.catalog.archive_manifest import held_spans
from orchestrator.log_identity import LogIdentity
from orchestrator.settings import Settings


def archived_spans(conn: psycopg.Connection, settings: Settings, identity: LogIdentity | None,
                   topics: Sequence[str], broker: Mapping[Position, tuple[int, int]]
                   ) -> dict[Position, tuple[int, int]]:
    """What the archive holds of the log, where replays read it. Asked only once retention has
    taken offsets from the broker (``broker``'s bounds); empty where replays read no archive (a
    plain local archive root with Spark on a cluster: see ``executor_archive_root``)."""
    from orchestrator.archive.archiver import executor_archive_root

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
