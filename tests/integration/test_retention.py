"""Kreps's first step, "retain the full log", after the broker's retention ran: a version
deployed then replays from offset 0 out of the archive, without --allow-gap, and its output is
the one computed from the whole log. Retention is real here: on the S3-backed stack, a
partition's oldest batch objects are removed while the broker is down, which moves its log
start up (../shared/ENVIRONMENT.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import env_of_a_user, job_file, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.broker_storage("s3")]
KEPT, SHORT = "pageviews", "clicks"


def _cli(state: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = env_of_a_user()
    env.update({"KAPPA_SPARK_DRIVER_MEMORY": "768m", "KAPPA_HEARTBEAT_INTERVAL_S": "1", **extra})
    done = subprocess.run([str(Path(sys.executable).with_name("kappa")), "--state-dir",
                           str(state), *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def _ok(state: Path, *args: str) -> str:
    done = _cli(state, *args)
    assert done.returncode == 0, f"kappa {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _retain(state: Path, topic: str, keep: int) -> None:
    """Retention as the broker would apply it: each partition's oldest batch objects go, all
    but the newest ``keep`` (the broker is down meanwhile)."""
    partitions = sorted(state.glob(f"**/topics/{topic}/partitions/*"))
    assert partitions, f"no objects of {topic} under {state}"
    for partition in partitions:
        # An object is a few files in the store's directory (data, checksum, metadata).
        objects: dict[int, list[Path]] = {}
        for part in partition.glob("records/*.batch*"):
            objects.setdefault(int(part.name.split(".")[0]), []).append(part)
        assert len(objects) > keep, f"{partition}: {sorted(objects)}"
        for first in sorted(objects)[:-keep]:
            for part in objects[first]:
                part.unlink()


def _settings(state: Path) -> Any:
    from orchestrator.settings import load_settings

    return load_settings({"state_dir": str(state)}, env={}, cwd=state)


def test_a_version_deployed_after_retention_replays_from_zero_out_of_the_archive(
        tmp_path: Path) -> None:
    from orchestrator.kafka.offsets import log_bounds

    from integration.helpers import assert_batches_tile_the_log, batches, dead_letters, output
    from reference import compute

    state = tmp_path / "state"
    _ok(state, "dev", "up", "--s3")
    try:
        settings = _settings(state)
        bootstrap = settings.kafka_bootstrap
        # Each produce run leaves one batch object per partition, for retention to take.
        for seed in range(3):
            _ok(state, "produce-sample", "--topic", KEPT, "--count", "1000", "--seed", str(seed))
        _ok(state, "produce-sample", "--topic", SHORT, "--count", "1000", "--seed", "9")
        _ok(state, "archive", "run", KEPT, SHORT, "--once")
        # Written after the archive's pass: only the broker holds these.
        for seed in (10, 11):
            for topic in (KEPT, SHORT):
                _ok(state, "produce-sample", "--topic", topic, "--count", "1000", "--seed",
                    str(seed))
        whole = compute(bootstrap, KEPT)
        archive_ends = {(r["topic"], r["partition"]): r["archived_end"] for r in json.loads(
            _ok(state, "archive", "status", KEPT, SHORT, "--json"))}

        _ok(state, "dev", "down")
        _retain(state, KEPT, keep=3)  # the broker's start falls inside what the archive holds
        _retain(state, SHORT, keep=1)  # ... and above it
        _ok(state, "dev", "up")
        kept = log_bounds(bootstrap, [KEPT])
        assert all(0 < first < archive_ends[key] < end for key, (first, end) in kept.items()), \
            (kept, archive_ends)
        short = log_bounds(bootstrap, [SHORT])
        assert all(first > archive_ends[key] for key, (first, _) in short.items()), \
            (short, archive_ends)
        # The retention-risk signal calls it what it is.
        risks = {r["topic"]: r["retention"] for r in json.loads(
            _ok(state, "archive", "status", KEPT, SHORT, "--json")) if r["current"]}
        assert risks == {KEPT: "ok", SHORT: "lost"}, risks
        # Retention first: a pass of the archiver stops on SHORT, naming the offsets it lost
        # (never a silent hole), and archives nothing of it.
        stopped = _cli(state, "archive", "run", SHORT, "--once")
        assert stopped.returncode != 0, stopped.stdout
        (line,) = stopped.stderr.strip().splitlines()
        assert "left the log before they were archived" in line, line
        assert any(f"offsets [{archive_ends[(SHORT, p)]}, {start}) of {SHORT}/{p} " in line
                   for (_, p), (start, _) in short.items()), line
        assert {(r["partition"]): r["archived_end"] for r in json.loads(_ok(
            state, "archive", "status", SHORT, "--json")) if r["current"] and r["topic"] == SHORT
                } == {p: archive_ends[(SHORT, p)] for (_, p) in short}

        # The archive holds everything retention took from KEPT: offset 0, no --allow-gap.
        _ok(state, "deploy", str(job_file(tmp_path, "v1", KEPT)), "--wait", "--timeout", "300")
        assert output(settings, "pageview_counts__v1") == whole.v1
        assert dead_letters(settings, "pageview_counts__v1__dead_letters") == \
            whole.invalid_offsets
        assert_batches_tile_the_log(settings, "pageview_counts", "v1", KEPT, whole.log_end)
        assert _state(state, "v1") in ("caught_up", "live")
        (lag,) = json.loads(_ok(state, "lag", "pageview_counts", "--json"))
        assert lag["lag_records"] == 0 and lag["lag_seconds"] == 0, lag
        # One batch, one read task per partition, from offset 0 to the log end: the archive
        # served up to its end, Kafka the rest.
        assert len(batches(settings, "pageview_counts", "v1")) == 1
        assert _archived_offsets(settings) == sum(
            end for (topic, _), end in archive_ends.items() if topic == KEPT)

        # A version that stopped below the broker's start: its time lag is unknown (the
        # broker's first record is younger than the one it waits for), and a restart goes on
        # reading the archive.
        crashed = _cli(state, "deploy", str(job_file(tmp_path, "v2", KEPT)),
                       KAPPA_MAX_BATCH_RECORDS="600",
                       KAPPA_FAIL_POINTS="batch.after_pg_commit=1*off->1*exit")
        assert crashed.returncode == 0, crashed.stderr
        wait_until(lambda: _state(state, "v2") == "failed", 120, "the driver to exit at the "
                   "fail point after its second batch", poll_s=0.5)
        (v2,) = [v for v in json.loads(_ok(state, "status", "--json")) if v["version"] == "v2"]
        assert all(int(at) < kept[(KEPT, int(p))][0]
                   for p, at in v2["processed_offsets"][KEPT].items()), (v2, kept)
        (lag,) = json.loads(_ok(state, "lag", "pageview_counts", "--version", "v2", "--json"))
        assert 0 < lag["lag_records"] < whole.records and lag["lag_seconds"] is None, lag
        _ok(state, "restart", "pageview_counts", "v2")
        _ok(state, "wait", "pageview_counts", "v2", "--timeout", "300")
        assert output(settings, "pageview_counts__v2") == whole.v2
        assert_batches_tile_the_log(settings, "pageview_counts", "v2", KEPT, whole.log_end)

        # The archive of SHORT ends below its log start: refused as before, saying where.
        refused = _cli(state, "deploy", str(job_file(tmp_path, "v1", SHORT, name="clicks")))
        assert refused.returncode != 0
        for (_, p), (first, _) in sorted(short.items()):
            assert f"{SHORT}/{p}: {first}" in refused.stderr, refused.stderr
            assert f"{SHORT}/{p} ends at {archive_ends[(SHORT, p)]} below the log start " \
                f"{first}" in refused.stderr, refused.stderr
    finally:
        for version in ("v1", "v2"):
            _cli(state, "stop", "pageview_counts", version)
        _cli(state, "dev", "down")


def _state(state: Path, version: str) -> str:
    """The state `kappa status` shows, read in this process: a wait polls it."""
    from orchestrator.service import Orchestrator

    service = Orchestrator(_settings(state))
    try:
        return service.version_status("pageview_counts", version).state.value
    finally:
        service.close()


def _archived_offsets(settings: Any) -> int:
    import psycopg
    from psycopg import sql

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT coalesce(sum(archived_offsets), 0) FROM {}")
                           .format(sql.Identifier(settings.catalog_schema, "batches"))
                           ).fetchone()
    return int(row[0]) if row else 0
