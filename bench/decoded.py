"""bench/replay.py's replay from decoded segments (--source decoded): the archiver decodes the
topic's segments once (timed: the decoding rate), then a version replays them cold and one on a
warm spare, each checked against the peer; DuckDB aggregates the same decoded files, the
columnar limit of this machine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from psycopg import sql

from orchestrator.catalog.db import connect


def decoded_files(settings: Any, topic: str) -> list[str]:
    """The decoded segments of ``topic`` (every lineage, every decoding: the bench has one)."""
    from orchestrator.archive.readable import archive_root
    from orchestrator.catalog import decoded_manifest

    with connect(settings.pg_dsn, autocommit=True) as conn:
        found = [d.path for d in decoded_manifest.decoded(conn, settings.catalog_schema)
                 if d.lineage.topic == topic]
    root = Path(archive_root(settings))
    return [str(root / path) for path in found]


def duckdb_aggregate(settings: Any, files: list[str], peer_table: str) -> dict[str, Any]:
    """pageview_counts v1 over the decoded files in DuckDB, on every core; its rows must be
    the peer's."""
    try:
        import duckdb
    except ImportError as exc:
        raise RuntimeError("--source decoded needs DuckDB: bash scripts/setup.sh dev,bench") \
            from exc
    began = time.perf_counter()
    rows = duckdb.connect().execute(
        "SELECT url, count(*), sum(duration_ms) FROM read_parquet(?) WHERE NOT _dead "
        "GROUP BY url", [files]).fetchall()
    seconds = time.perf_counter() - began
    with connect(settings.pg_dsn, autocommit=True) as conn:
        theirs = conn.execute(sql.SQL("SELECT url, views, total_duration_ms FROM {}").format(
            sql.Identifier(settings.data_schema, peer_table))).fetchall()
    if sorted(rows) != sorted((u, int(v), int(d)) for u, v, d in theirs):
        raise RuntimeError("DuckDB's aggregate of the decoded files differs from the peer's")
    return {"seconds": seconds, "rows": len(rows)}


def from_decoded(settings: Any, service: Any, raw: Any, warm: Any | None, workdir: Path,
                 topic: str, version: str, peer_table: str, theirs: dict[str, Any],
                 produced: int, kafka: dict[str, Any], raw_all: float,
                 profile: Path | None, event_format: str = "json") -> dict[str, Any]:
    """Archive the topic (raw), decode it (timed), replay the decoded segments cold and on a
    warm spare, and aggregate them in DuckDB."""
    from bench.kappa_runs import checked_replay
    from bench.warm_start import warm_replay

    raw.archive([topic], once=True)  # nothing to do if --source archive ran first
    began = time.perf_counter()
    service.archive([topic], once=True)  # every segment is archived: this pass decodes
    decode_s = time.perf_counter() - began
    progress = [p for p in service.archive_decodings() if p.topic == topic]
    if len(progress) != 1 or progress[0].pending or not progress[0].decoded_segments:
        raise RuntimeError(f"the topic was meant to be decoded whole once: {progress}")
    ours = checked_replay(settings, service, workdir, topic, version, peer_table, theirs,
                          produced, profile, event_format)
    if ours["archived_offsets"] != produced:
        raise RuntimeError(f"the replay read {ours['archived_offsets']} of {produced} offsets "
                           "from the archive: it was meant to read them all there")
    duck = duckdb_aggregate(settings, decoded_files(settings, topic), peer_table)
    wall, replay_s = ours["wall_s"], ours["replay_s"]
    spare = warm_replay(settings, warm, workdir, topic, f"{version}s", peer_table, theirs,
                        produced, ours) if warm is not None else None
    if spare is not None:  # the goal: start excluded, on a warm spare
        spare["kappa_without_start_over_raw_all_cores"] = round(
            spare["kappa_records_per_s_without_start"] / raw_all, 4)
    return {
        "decode_s": round(decode_s, 2),
        "decode_records_per_s": round(produced / decode_s),
        "decode_over_kafka_replay_rate": round(kafka["replay_s"] / decode_s, 4),
        "decoded_bytes": progress[0].bytes,
        "kappa_records_per_s_with_start": round(produced / wall),
        "kappa_records_per_s_without_start": round(produced / replay_s),
        "without_start_over_kafka": round(kafka["replay_s"] / replay_s, 4),
        "kappa_without_start_over_raw_all_cores": round(produced / replay_s / raw_all, 4),
        "peer_over_kappa_with_start": round(theirs["seconds"] / wall, 4),
        "peer_over_kappa_without_start": round(theirs["seconds"] / replay_s, 4),
        "duckdb_s": round(duck["seconds"], 3),
        "kappa_without_start_over_duckdb": round(duck["seconds"] / replay_s, 4),
        "deploy_to_caught_up_s": round(wall, 2),
        "spark_up_to_caught_up_s": round(replay_s, 2),
        "deploy_to_first_batch_s": round(ours["first_batch_s"], 2),
        "driver_peak_rss_total_mb": ours["memory"]["total_mb"],
        "kappa_us_per_event_without_start": round(1e6 * replay_s / produced, 3),
        "tables_equal": True,  # checked_replay raised otherwise
        **({"warm_spare": spare} if spare else {}),
        **({"profile": ours["profile"]} if "profile" in ours else {}),
    }
