"""kappa's side of the replay benchmark (bench/replay.py, bench/warm_start.py,
bench/decoded.py): deploy a version, wait until it has caught up, read its figures from the
catalog, and check its table against the peer's."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import sql

from orchestrator.catalog.db import connect

ROOT = Path(__file__).resolve().parents[1]
JOB = "pageview_counts"


def job_file(directory: Path, topic: str, version: str, *, shipped: str = "v1",
             name: str = JOB, event_format: str = "json") -> Path:
    """The shipped job ``shipped`` (by default v1: the peer reproduces v1's semantics, the URL
    as it is, so the tables must be equal) on ``topic``, as job ``name`` at ``version``. With
    ``event_format`` "avro", a job directory whose events are the Avro sample's, read with its
    second schema version (the same events as the JSON sample's for the same seed)."""
    source = (ROOT / "jobs" / JOB / f"{shipped}.py").read_text()
    source = re.sub(r"^TOPICS = .*$", f'TOPICS = ["{topic}"]', source, flags=re.M)
    source = re.sub(r"^VERSION = .*$", f'VERSION = "{version}"', source, flags=re.M)
    source = re.sub(r"^NAME = .*$", f'NAME = "{name}"', source, flags=re.M)
    if event_format == "json":
        path = directory / f"bench_{name}_{version}.py"
        path.write_text(source)
        return path
    import json

    from orchestrator.samples.sample_avro import PAGE_VIEW_V2

    source = re.sub(r"^EVENT_SCHEMA = .*$", 'EVENT_FORMAT = "avro"\nEVENT_SCHEMA = '
                    '"page_view.avsc"', source, flags=re.M)
    folder = directory / f"bench_{name}_{version}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.py").write_text(source)
    (folder / "page_view.avsc").write_text(json.dumps(PAGE_VIEW_V2))
    return folder


def state_times(settings: Any, version: str, job: str = JOB) -> dict[str, datetime]:
    """When the version first entered each state (the catalog's state events)."""
    with connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT detail->>'to', at FROM {}.events WHERE job = %s AND version = %s "
            "AND kind = 'state' ORDER BY id").format(sql.Identifier(settings.catalog_schema)),
            (job, version)).fetchall()
    at: dict[str, datetime] = {}
    for to, when in rows:
        at.setdefault(to, when)
    return at


def first_batch_at(settings: Any, version: str) -> datetime:
    """When the version's first batch committed: `applied_at` of its lowest catalog batch.
    That is now() of the commit transaction, i.e. when it began, milliseconds before its
    COMMIT. Batch records are folded into a summary only beyond `batches_kept` (1,000), so the
    first one is still there for any replay this bench runs."""
    with connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT b.applied_at FROM {s}.batches b JOIN {s}.job_versions v "
            "ON v.id = b.version_id WHERE v.job = %s AND v.version = %s "
            "ORDER BY b.batch_id LIMIT 1").format(s=sql.Identifier(settings.catalog_schema)),
            (JOB, version)).fetchone()
    if row is None:
        raise RuntimeError(f"no committed batch of {JOB} {version} in the catalog")
    at: datetime = row[0]
    return at


def table_difference(settings: Any, table_a: str, table_b: str) -> int:
    """Rows in one table and not in the other, both ways (0: equal row for row)."""
    cols = sql.SQL("url, views, total_duration_ms")
    a = sql.Identifier(settings.data_schema, table_a)
    b = sql.Identifier(settings.data_schema, table_b)
    with connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM ((SELECT {c} FROM {a} EXCEPT SELECT {c} FROM {b}) UNION ALL "
            "(SELECT {c} FROM {b} EXCEPT SELECT {c} FROM {a})) d").format(c=cols, a=a, b=b)
        ).fetchone()
    return int(row[0]) if row else -1


def kappa_replay(settings: Any, service: Any, workdir: Path, topic: str, version: str,
                 profile: Path | None = None, event_format: str = "json") -> dict[str, Any]:
    """Deploy v1 on the topic, wait until caught up, measure; the version is left running.
    With ``profile``, CPU by process role and the Python processes' stacks are sampled from
    deploy to caught up, and summarised under "profile"."""
    from bench.memory import peak_rss_mb
    from bench.profile import profiled

    deployed_at = datetime.now(UTC)
    began = time.perf_counter()
    pid = service.deploy(job_file(workdir, topic, version,
                                  event_format=event_format)).status.pid
    with profiled(pid, profile, version) as found:
        status = service.wait(JOB, version, timeout_s=1800, poll_s=0.5)
        wall = time.perf_counter() - began
    memory = peak_rss_mb(status.pid)  # read while the driver runs: the kernel's high-water mark
    at = state_times(settings, version)
    # Up to the instant the driver recorded caught_up (the catalog's clock, this host's), as the
    # peer's time ends when its COPY does: `wait` polls every 0.5 s, which is not the replay's.
    return {**found, "wall_s": (at["caught_up"] - deployed_at).total_seconds(),
            "waited_s": wall, "pid": pid, "deployed_at": deployed_at,
            "log_path": status.log_path,
            "replay_s": (at["caught_up"] - at["replaying"]).total_seconds(),
            "session_s": (at["replaying"] - deployed_at).total_seconds(),
            "first_batch_s": (first_batch_at(settings, version) - deployed_at).total_seconds(),
            "dead_letters": status.dead_letters, "rows": status.rows, "memory": memory,
            "processed": sum(o for ps in status.processed_offsets.values() for o in ps.values())}


def cluster_replay(settings: Any, workdir: Path, topic: str, version: str, workers: int,
                   cores: int, peer_table: str, produced: int, invalid: int) -> dict[str, Any]:
    """kappa's replay of ``topic`` on a fresh standalone cluster of ``workers`` workers,
    checked against the peer's table."""
    from orchestrator.dev.spark_cluster import standalone_cluster
    from orchestrator.naming import output_table
    from orchestrator.service import Orchestrator

    with standalone_cluster(workdir / f"cluster-{version}", workers=workers, cores=cores,
                            memory="1200m") as master:
        on_cluster = replace(settings, spark_master=master, spark_executor_cores=cores,
                             spark_executor_memory="1g")
        service = Orchestrator(on_cluster)
        try:
            ours = kappa_replay(on_cluster, service, workdir, topic, version)
            differing = table_difference(settings, output_table(JOB, version), peer_table)
        finally:
            service.stop(JOB, version)
            service.close()
    if differing or ours["dead_letters"] != invalid:
        raise RuntimeError(f"kappa on {workers} workers and the peer disagree on {topic}: "
                           f"{differing} rows differ, dead letters {ours['dead_letters']} "
                           f"against the peer's {invalid}")
    return {"workers": workers, "cores_per_worker": cores,
            "kappa_records_per_s_with_start": round(produced / ours["wall_s"]),
            "kappa_records_per_s_without_start": round(produced / ours["replay_s"]),
            "deploy_to_caught_up_s": round(ours["wall_s"], 2),
            "spark_up_to_caught_up_s": round(ours["replay_s"], 2),
            "deploy_to_first_batch_s": round(ours["first_batch_s"], 2),
            "tables_equal": True}


def archived_offsets(settings: Any, version: str) -> int:
    """Offsets the version's batches read from the archive (the batch records' own count)."""
    with connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL(
            "SELECT coalesce(sum(b.archived_offsets), 0) FROM {s}.batches b JOIN "
            "{s}.job_versions v ON v.id = b.version_id WHERE v.job = %s AND v.version = %s")
            .format(s=sql.Identifier(settings.catalog_schema)), (JOB, version)).fetchone()
    return int(row[0]) if row else 0


def checked_replay(settings: Any, service: Any, workdir: Path, topic: str, version: str,
                   peer_table: str, theirs: dict[str, Any], produced: int,
                   profile: Path | None, event_format: str = "json") -> dict[str, Any]:
    """kappa's replay, its output checked against the peer's; the version is stopped after."""
    from orchestrator.naming import output_table

    ours = kappa_replay(settings, service, workdir, topic, version, profile, event_format)
    try:
        differing = table_difference(settings, output_table(JOB, version), peer_table)
        ours["archived_offsets"] = archived_offsets(settings, version)
    finally:
        service.stop(JOB, version)  # frees the driver's memory before the next replay
    if differing or theirs["records"] != produced or theirs["invalid"] != ours["dead_letters"]:
        raise RuntimeError(
            f"kappa and the peer disagree on {topic}: {differing} rows differ; the peer read "
            f"{theirs['records']} of {produced} records and rejected {theirs['invalid']}; "
            f"kappa processed offsets up to {ours['processed']} in all and dead-lettered "
            f"{ours['dead_letters']}")
    return ours
