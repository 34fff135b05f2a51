"""Small queries behind `kappa demo`."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from orchestrator.catalog.db import connect
from orchestrator.kafka.endpoint import Kafka
from orchestrator.settings import Settings


def topic_size(bootstrap: Kafka, topic: str) -> int:
    from orchestrator.errors import KappaError
    from orchestrator.kafka.offsets import log_bounds

    try:
        return sum(end - start for start, end in log_bounds(bootstrap, [topic]).values())
    except KappaError:
        return 0


def top_urls(settings: Settings, qualified_table: str, limit: int = 10) -> list[list[Any]]:
    schema, table = qualified_table.split(".", 1)
    dsn, _ = settings.require_services()
    with connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT url, views, total_duration_ms FROM {}.{} "
                    "ORDER BY views DESC, url LIMIT %s").format(
                sql.Identifier(schema), sql.Identifier(table)), (limit,)).fetchall()
    return [list(r) for r in rows]
