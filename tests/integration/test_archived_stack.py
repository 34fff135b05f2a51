"""The embedded default as a user runs it: the broker keeps the log in memory and the stack's
archiver keeps its durable copy. A crash of the broker is answered by `kappa dev up` with the
same log, offset for offset; a crash of the archiver by a new one; and records that only the
broker held when it died are reported by offset, and the version that read them fails, saying
so, rather than going on over offsets that will hold other records."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from conftest import job_file, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.broker_storage("archive")]
TOPIC = "pageviews"


def _cli(state_dir: Path, *args: str, fail_points: str | None = None,
         traceback_ok: bool = False) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("kappa")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    env.update({"KAPPA_SPARK_DRIVER_MEMORY": "768m", "KAPPA_HEARTBEAT_INTERVAL_S": "1"})
    if fail_points:
        env["KAPPA_FAIL_POINTS"] = fail_points
    done = subprocess.run([str(exe), "--state-dir", str(state_dir), *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert traceback_ok or "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def _ok(state_dir: Path, *args: str) -> str:
    done = _cli(state_dir, *args)
    assert done.returncode == 0, f"kappa {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _stack(state_dir: Path) -> dict:
    return json.loads(_ok(state_dir, "dev", "status", "--json"))


def _pid(state_dir: Path, name: str) -> int:
    return next(s["pid"] for s in _stack(state_dir)["services"] if s["name"] == name)


def _archived(state_dir: Path) -> bool:
    rows = json.loads(_ok(state_dir, "archive", "status", TOPIC, "--json"))
    return bool(rows) and all(r["current"] and r["behind"] == 0 for r in rows)


def _kill(pid: int) -> None:
    proc = psutil.Process(pid)
    proc.kill()
    proc.wait(30)


def test_the_archived_log_outlives_crashes_and_reports_what_only_the_broker_held(
        tmp_path: Path) -> None:
    from reference import read_records

    # mkdtemp, not tmp_path: the embedded server runs as another user (see conftest.stack).
    state = Path(tempfile.mkdtemp(prefix="kappa-archived-"))
    try:
        up = json.loads(_ok(state, "dev", "up", "--json"))
        assert up["storage"] == "archive"
        assert [s["name"] for s in up["services"]] == ["postgres", "broker", "archiver"]
        bootstrap = up["kafka_bootstrap"]
        _ok(state, "produce-sample", "--topic", TOPIC, "--count", "3000", "--seed", "151")
        # Transaction markers: offsets with no record, which the restore must put back too.
        _ok(state, "produce-sample", "--topic", TOPIC, "--count", "3000", "--seed", "152",
            "--transactional")
        wait_until(lambda: _archived(state), 60, "the stack's archiver to reach the log end")
        before = read_records(bootstrap, TOPIC)

        # A crash of the broker: `kappa dev up` starts another and restores the log into it.
        _kill(_pid(state, "broker"))
        again = _ok(state, "dev", "up")
        assert "restored pageviews: 6,000 records" in again, again
        assert _stack(state)["cluster_id"] == up["cluster_id"]
        assert read_records(bootstrap, TOPIC) == before  # offsets, timestamps, keys, values

        # A crash of the archiver: the next `kappa dev up` starts one; the broker lives on.
        broker = _pid(state, "broker")
        _kill(_pid(state, "archiver"))
        assert not _stack(state)["running"]
        _ok(state, "produce-sample", "--topic", TOPIC, "--count", "400", "--seed", "153")
        assert "restored pageviews" not in _ok(state, "dev", "up")
        assert _pid(state, "broker") == broker
        wait_until(lambda: _archived(state), 60, "the new archiver to catch up")

        # A version reads the log, including records that only the broker holds: the archiver
        # is held, and a pass that sees the new log end dies before its segment is in place.
        path = job_file(tmp_path, "v1", TOPIC)
        _ok(state, "deploy", str(path), "--wait", "--timeout", "300")
        archiver = psutil.Process(_pid(state, "archiver"))
        archiver.send_signal(signal.SIGSTOP)
        archived_end = {(r["partition"]): r["archived_end"] for r in json.loads(
            _ok(state, "archive", "status", TOPIC, "--json"))}
        _ok(state, "produce-sample", "--topic", TOPIC, "--count", "800", "--seed", "154")
        _ok(state, "wait", "pageview_counts", "v1", "--timeout", "300")
        died = _cli(state, "archive", "run", "--once", TOPIC,
                    fail_points="archive.before_rename=1*exit")
        assert died.returncode != 0
        seen_end = {(r["partition"]): r["log_end"] for r in json.loads(
            _ok(state, "archive", "status", TOPIC, "--json"))}
        _kill(_pid(state, "broker"))
        archiver.kill()

        crashed = json.loads(_ok(state, "dev", "up", "--json"))["restore"]
        lost = {r["partition"]: (r["first_offset"], r["end_offset"]) for r in crashed["lost"]}
        assert lost == {p: (archived_end[p], seen_end[p]) for p in seen_end
                        if seen_end[p] > archived_end[p]} != {}
        [failed] = crashed["failed_versions"]
        assert failed.startswith("pageview_counts/v1: the log this version read is gone")
        v1 = next(v for v in json.loads(_cli(state, "status", "--json", traceback_ok=True)
                                        .stdout) if v["version"] == "v1")
        assert v1["state"] == "failed" and "lost with the broker" in v1["reason"]
        assert v1["log_gone"]
        refused = _cli(state, "restart", "pageview_counts", "v1")
        assert refused.returncode != 0 and "new VERSION" in refused.stderr
    finally:
        _cli(state, "dev", "down")
        for proc in psutil.process_iter(["cmdline"]):
            if str(state) in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        shutil.rmtree(state, ignore_errors=True)
