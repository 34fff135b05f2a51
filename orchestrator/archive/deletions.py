"""A topic deleted on its broker ends its archive's lineage, so that no restore brings it back.

Each archiver pass asks the broker for every topic whose lineage it knows live in that cluster:
one that is gone, or that has another topic id (deleted and created again), is ended in the
catalog. A topic created again under the name starts a lineage of its own when it is archived.
A volatile broker that lost its log is no deletion: `kappa dev up` lets no client but its restore
reach the new broker until the restore is done (dev/held_clients.py), and stops the old archiver
first.
"""

from __future__ import annotations

import logging

import psycopg

from orchestrator.catalog import archive_manifest as manifest
from orchestrator.kafka.admin import log_identity
from orchestrator.kafka.endpoint import Kafka

log = logging.getLogger("kappa.archive")


def end_deleted_lineages(conn: psycopg.Connection, schema: str, kafka: Kafka) -> list[str]:
    """End the lineages whose topics their broker no longer holds; the topics."""
    with conn.transaction():
        live = [k.identity for k in manifest.known_logs(conn, schema)
                if not k.restoring and not k.ended]
    if not live:
        return []
    identity = log_identity(kafka, sorted({k.topic for k in live}))
    if not identity.cluster_id:
        return []
    gone = [k for k in live if k.cluster_id == identity.cluster_id
            and identity.topics.get(k.topic) != k.topic_id]
    if gone:
        with conn.transaction():
            manifest.end_lineages(conn, schema, gone)
        for k in gone:
            log.warning("%s (topic id %s) is gone from the broker: deleted, or created again; "
                        "its archive's lineage ends, and no restore brings it back", k.topic,
                        k.topic_id)
    return [k.topic for k in gone]
