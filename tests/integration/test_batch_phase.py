"""A batch job's catch-up over decoded segments runs as Spark batch jobs, tile by tile, then
hands over to the streaming query (#60): crashed in each of the phase's windows by its fail
points, and paused by live first mid-tile, it ends with output and dead letters equal to a
reference computed from the log, each batch id applied once, the batches tiling the log, and
every tile's offsets read from decoded segments."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, wait_until
from integration.helpers import assert_exact, batches, live_lag, query
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


def _held(log_path: Path, attempt: int, point: str) -> None:
    wait_until(lambda: f"fail point {point}: paused" in log_path.read_text(
        errors="replace").rsplit(f"=== attempt {attempt} starting", 1)[-1], 300,
        f"attempt {attempt} to hold at {point}")


def _crashed(service, attempt: int, points: str) -> None:
    wait_until(lambda: service.version_status(JOB, "v2").state.value == "failed", 300,
               f"v2's driver to exit at {points}")
    st = service.version_status(JOB, "v2")
    assert st.attempt == attempt and "is gone" in (st.reason or ""), st


def test_a_decoded_catch_up_runs_tile_by_tile_and_resumes_exactly_after_crashes_in_each_window(
        settings, tmp_path: Path, monkeypatch) -> None:
    from orchestrator import failpoints
    from orchestrator.service import Orchestrator
    from orchestrator.spark.launch.driver_process import is_alive

    settings = replace(settings, archive_segment_records=2_000, decoded_batch_records=TILE,
                       max_batch_records=TILE, chunk_records=1_500, live_lag_protect_s=60.0)
    service = Orchestrator(settings)
    topic = f"pageviews_{uuid.uuid4().hex[:8]}"
    service.produce_sample(topic, 12_000, seed=601)
    release = tmp_path / "release"
    release.mkdir()
    try:
        # Live first holds the queue (a live version far behind), so v2 waits in it while the
        # archiver copies the log and decodes it for v2's decoding: once the queue starts v2,
        # its catch-up is a batch phase.
        limit = settings.live_lag_limit_s
        assert service.replays.protect_live([live_lag(JOB, limit)], 60.0)  # held for 600 s
        queued = service.deploy(job_file(tmp_path, "v2", topic)).status
        assert queued.state.value == "queued" and "held by live first" in (queued.reason or "")
        service.archive([topic], once=True)
        decoded = [p for p in service.archive_decodings() if p.topic == topic]
        assert decoded and all(p.decoded_segments == p.raw_segments > 0 for p in decoded)

        # 1: the second tile's plan is recorded, nothing of it read: the next attempt runs
        # that plan, not another.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "tile.planned=1*off->1*exit")
        assert not service.replays.protect_live([live_lag(JOB, 0.0)], 1.0)
        assert service.replays.schedule() == [(JOB, "v2")]
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
        # 3 (attempts 3 and 4): live first pauses v2 mid-tile, with tile 2's rows and read
        # counts staged and none committed: an ordinary stop, and v2 goes back to the queue.
        # Once the hold ends the queue starts it again, and it runs tile 2's recorded plan,
        # counting no read twice; every tile is applied, and the driver dies before it seeds
        # the streaming checkpoint.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.staged=1*pause")
        monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(release))
        service.restart(JOB, "v2")
        log_path = Path(service.version_status(JOB, "v2").log_path or "")
        _held(log_path, 3, "batch.staged")
        staged = _plan(settings, "v2")
        assert staged is not None and staged[0] == 2, staged
        # Meanwhile its status is a catch-up's, its progress the tiles committed.
        (lag,) = service.lag(JOB, "v2")
        held = service.version_status(JOB, "v2")
        assert (held.state.value, lag.lag_records) == ("replaying", 12_000 - 2 * TILE), lag
        held_pid = held.pid
        assert service.replays.protect_live([live_lag(JOB, limit)], 1.0)
        paused = service.version_status(JOB, "v2")
        assert paused.state.value == "queued" and not is_alive(held_pid, None), paused
        assert "paused by live first: live version pageview_counts v1" in (paused.reason or "")
        assert [r[0] for r in batches(settings, JOB, "v2")] == [0, 1]
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "handover.before_seed=1*exit")
        assert not service.replays.protect_live([live_lag(JOB, 0.0)], 1.0)
        assert service.replays.schedule() == [(JOB, "v2")]
        _crashed(service, 4, "handover.before_seed")
        rows = batches(settings, JOB, "v2")
        assert (rows[2][0], rows[2][2], rows[2][3]) == staged, rows  # the plan, run again
        assert sum(r[4] for r in rows) == 12_000
        # 4 (attempt 5): the phase finds nothing more to tile and seeds the checkpoint;
        # records written meanwhile reach the streaming query, whose first batch the driver
        # dies on.
        monkeypatch.setenv("KAPPA_FAIL_POINTS",
                           "handover.before_seed=1*pause;handover.before_live_batch=1*exit")
        service.restart(JOB, "v2")
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        monkeypatch.delenv("KAPPA_FAIL_POINTS_RELEASE")
        _held(log_path, 5, "handover.before_seed")
        service.produce_sample(topic, 2_000, seed=602)
        failpoints.release(release, "handover.before_seed")
        _crashed(service, 5, "handover.before_live_batch")
        # 5 (attempt 6): clean, to the log end and live.
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
        # A restart mid-phase is no lost checkpoint (the tiles keep none), and says so.
        assert "after a batch phase's tiles" in text and "no checkpoint at" not in text
    finally:
        for point in ("batch.staged", "handover.before_seed"):
            failpoints.release(release, point)
        service.stop_all()
