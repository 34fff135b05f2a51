"""A benchmark's own world: the embedded stack in a temporary directory (or the services that
KAPPA_PG_DSN and KAPPA_KAFKA_BOOTSTRAP name), uuid-tagged schemas, and a clean-up that stops
every driver, drops the schemas and the stack it started."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from psycopg import sql

from orchestrator.catalog.db import connect
from orchestrator.service import Orchestrator
from orchestrator.settings import load_settings
from orchestrator.spark.launch import spares as spare_pool


@contextmanager
def bench_stack(name: str, serving: bool = False, *, durable: bool = False,
                spares: bool = False) -> Iterator[tuple[Any, Orchestrator, Path, str]]:
    """Yields (settings, service, work directory, tag). The embedded broker keeps its log in
    memory unless ``durable``: what a benchmark measures is not the log's storage. Drivers
    start cold unless ``spares``: warm spare drivers are measured where a benchmark says so."""
    workdir = Path(tempfile.mkdtemp(prefix=f"kappa-bench-{name}-"))
    settings = load_settings({"state_dir": str(workdir / "state")}, cwd=workdir)
    own_stack = not (settings.pg_dsn and settings.kafka_bootstrap)
    if own_stack:
        from orchestrator.dev import stack

        up = stack.up(settings.state_dir, storage=stack.S3 if durable else stack.MEMORY)
        settings = replace(settings, pg_dsn=up.pg_dsn, kafka_bootstrap=up.kafka_bootstrap)
    tag = uuid.uuid4().hex[:8]
    # Its own warm spares (bench/warm_start.py), withdrawn at the end.
    settings = replace(settings, spare_dir=settings.spare_dir or workdir / "spares",
                       warm_spares=settings.warm_spares if spares else 0)
    settings = replace(settings, catalog_schema=f"kappa_bench_{tag}",
                       data_schema=f"kappa_bench_data_{tag}",
                       **({"serving_schema": f"serving_bench_{tag}"} if serving else {}))
    service = Orchestrator(settings)
    try:
        yield settings, service, workdir, tag
    finally:
        for st in service.status():
            if st.pid:
                service.stop(st.job, st.version)
        spare_pool.withdraw_all(settings, state_dir=settings.state_dir)
        with connect(settings.pg_dsn or "", autocommit=True) as conn:
            schemas = [settings.catalog_schema, settings.data_schema]
            for schema in schemas + ([settings.serving_schema] if serving else []):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(schema)))
        if own_stack:
            stack.down(settings.state_dir)
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: dict[str, Any], as_json: bool, width: int = 24) -> None:
    """A benchmark's results: JSON for scripts, else one ``key value`` line each."""
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key:{width}} {value}")
