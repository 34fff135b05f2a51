"""The archive of the log as the service offers it: copying, verifying, status and restore."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.archive_model.deletion import Deletion
from orchestrator.catalog.access import CatalogAccess
from orchestrator.catalog.db import open_connection


def archive(catalog: CatalogAccess, topics: Sequence[str] = (), *, once: bool = False,
            interval_s: float = 5.0, on_segment: Callable[[Any], None] = lambda _: None,
            stop: Callable[[], bool] = lambda: False, all_topics: bool = False) -> int:
    """Copy the topics (default: those deployed jobs read; ``all_topics``: every topic) into
    the archive's segments, once or every ``interval_s`` until ``stop()``; returns the
    segments written."""
    from orchestrator.archive.archiver import run_archiver

    settings = catalog.settings
    dsn, bootstrap = settings.require_services()
    with catalog.connection():  # applies the catalog's migrations (the manifest) first
        pass
    return run_archiver(settings, lambda: open_connection(dsn, autocommit=True), bootstrap,
                        topics, once=once, interval_s=interval_s, on_segment=on_segment,
                        stop=stop, all_topics=all_topics)


def verify(catalog: CatalogAccess, topics: Sequence[str] = (),
           redecode_sample: int | None = None) -> Any:
    """Read every segment back against its checksum, and against the log where the broker
    still holds it; an ArchiveError names the first segment that differs. With
    ``redecode_sample`` (0: all), decoded segments are decoded again and compared too."""
    from orchestrator.archive.archiver import Archiver
    from orchestrator.archive.verify import verify as verify_segments

    with catalog.connection() as conn:
        return verify_segments(Archiver(catalog.settings, conn,
                                        catalog.settings.require_services()[1]), topics,
                               redecode_sample)


def status(catalog: CatalogAccess, topics: Sequence[str] = ()) -> list[Any]:
    """Per partition and lineage: the archived range, the log's range, records behind."""
    from orchestrator.archive.archiver import Archiver

    with catalog.connection() as conn:
        return Archiver(catalog.settings, conn, catalog.settings.require_services()[1]).status(
            topics)


def decodings(catalog: CatalogAccess, *, prune: bool = False, dry_run: bool = False
              ) -> list[Any]:
    """Per decoding and lineage: raw segments against decoded ones, and whether a version that
    is not retired reads it. With ``prune``: remove (``dry_run``: only list) those that no
    version reads any more, and return them."""
    from orchestrator.archive.decode_pass import progress, prune_unused
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.archive.readable import archive_root

    with catalog.connection() as conn:
        schema = catalog.settings.catalog_schema
        if not prune:
            return progress(conn, schema)
        return prune_unused(conn, schema, ParquetStore(archive_root(catalog.settings)),
                            dry_run=dry_run)


def restore(catalog: CatalogAccess, topics: Sequence[str],
            acknowledged: Mapping[str, Mapping[int, int]] | None,
            restart: Callable[[str, str], object],
            deleted: Mapping[str, Deletion] | None = None) -> Any:
    """Write archived topics that the broker does not hold back into it, offset for offset,
    checked against the manifest; report what a crash lost before the archive
    (``acknowledged``: the lost broker's acknowledged ends, ``deleted``: the topics its
    clients deleted, when and which ids, from the stack's ack ledger)."""
    from orchestrator.archive.restore import Restorer

    with catalog.connection() as conn:
        report = Restorer(catalog.settings, conn, catalog.settings.require_services()[1]
                          ).restore(topics, acknowledged or {}, deleted)
    # A driver that read the lost topic would fail on its new id: it starts again on it.
    for job, version in report.continuing:
        restart(job, version)
    return report
