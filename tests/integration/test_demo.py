"""`kappa demo` and `kappa dev` as a user runs them, in a fresh directory."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, env_of_a_user, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.broker_storage("archive")]


def _kappa(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = env_of_a_user()
    exe = Path(sys.executable).with_name("kappa")
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False,
                          timeout=900)


def test_demo_tells_the_story_on_the_embedded_default() -> None:
    # mkdtemp, not tmp_path: the embedded server runs as another user (see conftest.stack).
    cwd = Path(tempfile.mkdtemp(prefix="kappa-demo-"))
    try:
        demo = _kappa(cwd, "demo", "--count", "20000")
        assert demo.returncode == 0, demo.stdout + demo.stderr
        out = demo.stdout
        for needle in ("Producing 20,000 sample page views", "pageview_counts v1",
                       "pageview_counts v2", "Top URLs in v1:", "Top URLs in v2:", "live",
                       "Their lag has gone to zero", "caught_up", "A/B: 10 %", "roll back to v1",
                       "promote v2 again", "retire v1", "rollback"):
            assert needle in out, out
        env_lines = _kappa(cwd, "dev", "env").stdout.splitlines()
        assert [line.split("=")[0] for line in env_lines] == [
            "export KAPPA_PG_DSN", "export KAPPA_KAFKA_BOOTSTRAP"]
        again = _kappa(cwd, "demo", "--count", "20000", "--json")  # idempotent second run
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)  # --json prints only JSON
        states = {v["version"]: v["state"] for v in report["versions"]}
        assert states["v1"] == "retired" and states["v2"] == "live"
        assert report["top_urls"]["v1"] and report["top_urls"]["v2"]
        # The alias serves v2 already: a cutover says so and changes nothing.
        switches = len(json.loads(_kappa(cwd, "history", "pageview_counts", "--json").stdout))
        cutover = _kappa(cwd, "cutover", "pageview_counts", "v2", "--soak", "0")
        assert cutover.returncode == 0, cutover.stdout + cutover.stderr
        assert "already serves v2 entirely" in cutover.stdout
        assert "roll" not in (cutover.stdout + cutover.stderr).lower()
        history = json.loads(_kappa(cwd, "history", "pageview_counts", "--json").stdout)
        assert len(history) == switches

        before = _durable_cycle(cwd)
        _v2_goes_on_after_a_restart(cwd, before)
    finally:
        _kappa(cwd, "dev", "down")
        shutil.rmtree(cwd, ignore_errors=True)


def _settings(cwd: Path) -> object:
    from orchestrator.settings import load_settings

    return load_settings(flags={"state_dir": str(cwd / ".kappa")}, env={}, cwd=cwd)


def _pending(pid: int, sig: signal.Signals) -> bool:
    """Whether ``sig`` waits to be delivered to the (stopped) process."""
    status = Path(f"/proc/{pid}/status").read_text()
    masks = [int(line.split()[1], 16) for line in status.splitlines()
             if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (sig - 1)) for mask in masks)


def _durable_cycle(cwd: Path) -> list[object]:
    """`kappa dev down`, `kappa dev up`: the log is the same, record for record."""
    from reference import read_records

    settings = _settings(cwd)
    before = read_records(settings.kafka_bootstrap, "pageviews")  # type: ignore[attr-defined]
    assert len(before) == 20_000
    status = json.loads(_kappa(cwd, "dev", "status", "--json").stdout)
    assert status["storage"] == "archive" and [s["name"] for s in status["services"]] == [
        "postgres", "broker", "ack proxy", "archiver", "queue keeper"]
    # Records the archiver has not seen when `kappa dev down` starts (it was stopped while they
    # were written, and goes on only once down has sent it SIGTERM, so no ordinary pass can
    # take them first): down stops the archiver first, whose last pass archives them while the
    # broker still runs, so they come back.
    archiver = psutil.Process(next(s["pid"] for s in status["services"]
                                   if s["name"] == "archiver"))
    archiver.suspend()
    try:
        tail = _kappa(cwd, "produce-sample", "--topic", "tail", "--count", "1000", "--seed", "78")
        assert tail.returncode == 0, tail.stderr
        tail_before = read_records(settings.kafka_bootstrap, "tail")  # type: ignore[attr-defined]
        env = env_of_a_user()
        with subprocess.Popen([str(Path(sys.executable).with_name("kappa")), "dev", "down"],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as going_down:
            try:
                wait_until(lambda: _pending(archiver.pid, signal.SIGTERM), 120,
                           "`kappa dev down` to send the archiver SIGTERM", poll_s=0.1)
            finally:
                archiver.resume()
            out, err = going_down.communicate(timeout=900)
    finally:
        if archiver.is_running():
            archiver.resume()
    down = subprocess.CompletedProcess(going_down.args, going_down.returncode, out, err)
    assert down.returncode == 0, down.stderr
    assert "stopped pageview_counts v2" in down.stdout  # v1 was retired by the story
    stopped = json.loads(_kappa(cwd, "dev", "status", "--json").stdout)
    assert not stopped["running"] and not any(s["running"] for s in stopped["services"])
    up = _kappa(cwd, "dev", "up")
    assert up.returncode == 0, up.stderr
    assert "durable" in up.stdout
    settings = _settings(cwd)
    after = read_records(settings.kafka_bootstrap, "pageviews")  # type: ignore[attr-defined]
    assert after == before  # same partitions, offsets, timestamps, keys and values
    assert read_records(settings.kafka_bootstrap, "tail") == tail_before  # type: ignore
    return before


def _v2_goes_on_after_a_restart(cwd: Path, before: list[object]) -> None:
    from integration.helpers import assert_batches_tile_the_log, output
    from reference import compute

    settings = _settings(cwd)
    status = json.loads(_kappa(cwd, "status", "--json").stdout)
    v2 = next(v for v in status if v["version"] == "v2")
    assert v2["state"] == "stopped" and not v2["log_gone"], v2
    # Deploying what is deployed and stopped says what to run, in one line.
    again = _kappa(cwd, "deploy", str(ROOT / "jobs" / "pageview_counts" / "v2.py"), "--wait")
    assert again.returncode == 1
    error = again.stderr.strip()
    assert "\n" not in error and "kappa restart pageview_counts v2" in error, error
    # More of the log, then v2 goes on from its offsets: its batches tile the log from 0.
    produced = _kappa(cwd, "produce-sample", "--count", "3000", "--seed", "77")
    assert produced.returncode == 0, produced.stderr
    assert _kappa(cwd, "restart", "pageview_counts", "v2").returncode == 0
    waited = _kappa(cwd, "wait", "pageview_counts", "v2", "--timeout", "300")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    ref = compute(settings.kafka_bootstrap, "pageviews")  # type: ignore[attr-defined]
    assert ref.records == len(before) + 3000
    assert output(settings, "pageview_counts__v2") == ref.v2
    rows = assert_batches_tile_the_log(settings, "pageview_counts", "v2", "pageviews",
                                       ref.log_end)
    assert {attempt for _, attempt, *_ in rows} == {1, 2}  # the restart went on, no replay
