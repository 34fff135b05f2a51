"""The embedded stack as a user drives it, through the `kappa` console script in a state
directory of its own (test_archived_stack.py); what the waits poll is read in this process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from conftest import env_of_a_user, wait_until

TOPIC = "pageviews"


def cli(state_dir: Path, *args: str, fail_points: str | None = None,
        release: Path | None = None, traceback_ok: bool = False, spares: bool = True
        ) -> subprocess.CompletedProcess[str]:
    """``release``: the directory where a test releases the fail points it set to pause.
    ``spares=False``: `kappa dev up` keeps no warm spare driver (a JVM that only a deploy soon
    after would use)."""
    exe = Path(sys.executable).with_name("kappa")
    env = env_of_a_user()
    env.update({"KAPPA_SPARK_DRIVER_MEMORY": "768m", "KAPPA_HEARTBEAT_INTERVAL_S": "1"})
    if not spares:
        env["KAPPA_WARM_SPARES"] = "0"
    if fail_points:
        env["KAPPA_FAIL_POINTS"] = fail_points
    if release is not None:
        env["KAPPA_FAIL_POINTS_RELEASE"] = str(release)
    done = subprocess.run([str(exe), "--state-dir", str(state_dir), *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert traceback_ok or "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def ok(state_dir: Path, *args: str, spares: bool = True) -> str:
    done = cli(state_dir, *args, spares=spares)
    assert done.returncode == 0, f"kappa {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def stack_json(state_dir: Path) -> dict:
    return json.loads(ok(state_dir, "dev", "status", "--json"))


def pid_of(state_dir: Path, name: str) -> int:
    return next(s["pid"] for s in stack_json(state_dir)["services"] if s["name"] == name)


def archive_rows(state_dir: Path, topic: str = TOPIC) -> list[dict[str, Any]]:
    """What `kappa archive status TOPIC --json` prints, read in this process: the waits poll it,
    and a `kappa` process every half second cost the module more CPU than its stacks."""
    from orchestrator.cli.archive import _row_json
    from orchestrator.service import Orchestrator
    from orchestrator.settings import load_settings

    service = Orchestrator(load_settings({"state_dir": str(state_dir)}, env={}, cwd=state_dir))
    try:
        return [_row_json(r) for r in service.archive_status([topic])]
    finally:
        service.close()


def archived(state_dir: Path) -> bool:
    """Whether every topic the broker holds is archived to its end (a deleted topic's
    archive stays, in a lineage that is no longer current)."""
    rows = archive_rows(state_dir)
    held = {r["topic"] for r in rows if r["current"]}
    return bool(held) and all(r["current"] and r["behind"] == 0 for r in rows
                              if r["topic"] in held)


def archived_records(state_dir: Path, topic: str) -> int:
    return sum(r["archived_end"] or 0 for r in archive_rows(state_dir, topic) if r["current"])


def spare_ready(state_dir: Path, pid: int) -> bool:
    """Whether `kappa dev status --json` lists the warm spare ``pid`` as ready, read in process."""
    from orchestrator.settings import load_settings
    from orchestrator.spark.launch import launcher

    settings = load_settings({"state_dir": str(state_dir)}, env={}, cwd=state_dir)
    return any(w.pid == pid and w.ready for w in launcher.waiting_spares(settings))


def wait_archived(state_dir: Path, what: str, done: Any = None, topic: str = TOPIC) -> None:
    # 240 s: CI took over 120 s here on a loaded machine (twice for a new topic's first 500
    # records); what the archive and its archiver were doing is printed if it takes longer.
    try:
        wait_until(done or (lambda: archived(state_dir)), 240, what)
    except AssertionError:
        print(ok(state_dir, "archive", "status", topic))
        log = state_dir / "dev" / "archiver.log"
        print(log.read_text(errors="replace")[-6000:] if log.is_file() else f"no {log}")
        raise


def kill(pid: int) -> None:
    proc = psutil.Process(pid)
    proc.kill()
    proc.wait(30)


def exact(state: Path) -> bool:
    from orchestrator.settings import load_settings

    from integration.helpers import output
    from reference import compute

    settings = load_settings({"state_dir": str(state)}, env={}, cwd=state)
    return output(settings, "pageview_counts__v1") == compute(settings.kafka_bootstrap,
                                                              TOPIC).v1


def tear_down(state: Path) -> None:
    cli(state, "dev", "down")
    for proc in psutil.process_iter(["cmdline"]):
        if str(state) in " ".join(proc.info["cmdline"] or []):
            proc.kill()
    shutil.rmtree(state, ignore_errors=True)
