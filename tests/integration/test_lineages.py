"""The archive's lineages in a real PostgreSQL catalog, as docs/archive.md promises them: a
topic whose lineage a pass ended (a listing that missed it) is live again once it is found
with the same topic id, while a topic created again under the name has a lineage of its own
and leaves the old one ended."""

from __future__ import annotations

import uuid

import pytest

pytestmark = [pytest.mark.integration]


def test_a_topic_found_again_with_the_same_id_is_live_again(settings) -> None:
    from orchestrator.archive_model.segments import Lineage
    from orchestrator.catalog import archive_manifest as manifest
    from orchestrator.catalog.db import connect
    from orchestrator.catalog.migrations import migrate

    topic, schema = f"lineage-{uuid.uuid4().hex[:8]}", settings.catalog_schema
    first, recreated = Lineage("cluster-a", topic, "id-1"), Lineage("cluster-a", topic, "id-2")

    def ended(conn: object) -> dict[str, bool]:
        return {k.identity.topic_id: k.ended for k in manifest.known_logs(conn, schema)
                if k.identity.topic == topic}

    with connect(settings.pg_dsn, autocommit=True) as conn:
        migrate(conn, schema)
        manifest.root_of(conn, schema, first, 2)
        manifest.end_lineages(conn, schema, [first])  # a pass's listing missed it
        assert ended(conn) == {"id-1": True}
        again = manifest.root_of(conn, schema, first, 2)  # the next pass finds it: same id
        assert not again.ended and again.root == first
        assert ended(conn) == {"id-1": False}

        manifest.end_lineages(conn, schema, [first])  # deleted, and created again
        new = manifest.root_of(conn, schema, recreated, 2)
        assert new.root == recreated, new
        assert ended(conn) == {"id-1": True, "id-2": False}
