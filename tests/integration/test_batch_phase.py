"""A batch job's catch-up over decoded segments runs as Spark batch jobs, tile by tile, then
hands over to the streaming query (#60): crashed in each of the phase's windows by its fail
points, it ends with output and dead letters equal to a reference computed from the log, each
batch id applied once, the batches tiling the log, and every tile's offsets read from decoded
segments."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, wait_until
from integration.helpers import assert_exact, batches, query
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
TILE = 3_000


def _plan(settings, version: str) -> tuple[int, dict, dict] | None:
    rows = query(settings, f"SELECT p.batch_id, p.start_offsets, p.end_offsets FROM "
                 f"{settings.catalog_schema}.tile_plans p JOIN {settings.catalog_schema}."
                 "job_versions v ON v.id = p.version_id WHERE v.job = %s AND v.version = %s",
                 JOB, version)
    return rows[0] if rows else None


def _decoded_offsets(settings, version: str) -> list[tuple[int, int, int | None]]:
    """(batch id, records, offsets read from decoded segments) of each batch."""
    return query(settings, f"SELECT b.batch_id, b.records, b.decoded_offsets FROM "
                 f"{settings.catalog_schema}.batches b JOIN {settings.catalog_schema}."
                 "job_versions v ON v.id = b.version_id WHERE v.job = %s AND v.version = %s "
                 "ORDER BY b.batch_id", JOB, version)


def _crashed(service, attempt: int, points: str) -> None:
    wait_until(lambda: service.version_status(JOB, "v2").state.value == "failed", 300,
               f"v2's driver to exit at {points}")
    st = service.version_status(JOB, "v2")
    assert st.attempt == attempt and "is gone" in (st.reason or ""), st


def test_a_decoded_catch_up_runs_tile_by_tile_and_resumes_exactly_after_crashes_in_each_window(
        settings, tmp_path: Path, monkeypatch) -> None:
    from orchestrator import failpoints
    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=2_000, decoded_batch_records=TILE,
                       max_batch_records=TILE, chunk_records=1_500)
    service = Orchestrator(settings)
    topic = f"pageviews_{uuid.uuid4().hex[:8]}"
    service.produce_sample(topic, 12_000, seed=601)
    release = tmp_path / "release"
    release.mkdir()
    try:
        # v1 replays from Kafka; the archiver then decodes the log for its decoding, which v2
        # shares: v2's catch-up is a batch phase.
        service.deploy(job_file(tmp_path, "v1", topic))
        service.wait(JOB, "v1", timeout_s=600)
        service.archive([topic], once=True)
        assert all(p.decoded_segments == p.raw_segments > 0
                   for p in service.archive_decodings() if p.topic == topic)

        # 1: the second tile's plan is recorded, nothing of it read: the next attempt runs
        # that plan, not another.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "tile.planned=1*off->1*exit")
        service.deploy(job_file(tmp_path, "v2", topic))
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        _crashed(service, 1, "tile.planned")
        assert [r[0] for r in batches(settings, JOB, "v2")] == [0]
        planned = _plan(settings, "v2")
        assert planned is not None and planned[0] == 1, planned
        # 2: that tile is applied to PostgreSQL, and the driver dies before the next plan.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "tile.after_pg_commit=1*exit")
        service.restart(JOB, "v2")
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        _crashed(service, 2, "tile.after_pg_commit")
        rows = batches(settings, JOB, "v2")
        assert [r[0] for r in rows] == [0, 1], rows
        assert (rows[1][2], rows[1][3]) == (planned[1], planned[2])  # the plan, run again
        # 3: every tile is applied; the driver dies before it seeds the streaming checkpoint.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "handover.before_seed=1*exit")
        service.restart(JOB, "v2")
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        _crashed(service, 3, "handover.before_seed")
        assert sum(r[4] for r in batches(settings, JOB, "v2")) == 12_000
        # 4: the phase finds nothing more to tile and seeds the checkpoint; records written
        # meanwhile reach the streaming query, whose first batch the driver dies on.
        monkeypatch.setenv("KAPPA_FAIL_POINTS",
                           "handover.before_seed=1*pause;handover.before_live_batch=1*exit")
        monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(release))
        service.restart(JOB, "v2")
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        monkeypatch.delenv("KAPPA_FAIL_POINTS_RELEASE")
        log_path = Path(service.version_status(JOB, "v2").log_path or "")
        wait_until(lambda: "fail point handover.before_seed" in log_path.read_text(
            errors="replace").rsplit("=== attempt 4 starting", 1)[-1], 300,
            "attempt 4 to hold before the seed")
        service.produce_sample(topic, 2_000, seed=602)
        failpoints.release(release, "handover.before_seed")
        _crashed(service, 4, "handover.before_live_batch")
        # 5: clean, to the log end and live.
        service.restart(JOB, "v2")
        service.wait(JOB, "v2", timeout_s=600)

        reference = compute(settings.kafka_bootstrap, topic)
        assert_exact(settings, JOB, "v2", topic, reference, reference.v2)
        tiles = [(b, n, d) for b, n, d in _decoded_offsets(settings, "v2") if n]
        # The first 12,000 offsets went by tiles of TILE, each read from decoded segments.
        assert [n for _, n, _ in tiles[:4]] == [TILE] * 4, tiles
        assert all(d == n for _, n, d in tiles[:4]), tiles
        text = log_path.read_text(errors="replace")
        assert "running its recorded plan again" in text
        assert "the batch phase ended before batch" in text, text[-3000:]
    finally:
        failpoints.release(release, "handover.before_seed")
        service.stop_all()
