"""32 readers, some holding transactions open for seconds, while 50 switches run."""

from __future__ import annotations

import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, job_file

sys.path.insert(0, str(ROOT))
from bench.switch import prepare, run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_readers_never_fail_stall_or_see_a_key_twice(service, settings, topic, tmp_path: Path
                                                     ) -> None:
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 20_000, seed=121)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp_path, version, topic))
    prepare(service, "pageview_counts")
    outcome = run_scenario(service, settings, "pageview_counts", switches=50, readers=32)
    summary = outcome.summary()
    print(summary)
    assert outcome.reader_errors == []
    assert outcome.duplicate_keys == 0
    assert outcome.stale_after_switch == []
    assert summary["switches"] == 50 and summary["reader_statements"] > 32
    assert len(service.history("pageview_counts")) == 51  # the first promote and 50 switches


def test_kill_9_mid_switch_leaves_alias_and_history_consistent(service, settings, topic,
                                                               tmp_path: Path) -> None:
    import os
    import signal
    import subprocess

    import psycopg
    from psycopg import sql

    from orchestrator.service import Orchestrator

    from conftest import kappa_cli, wait_until

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 5_000, seed=131)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp_path, version, topic))
    prepare(service, "pageview_counts")
    aliases = sql.SQL("{}.aliases").format(sql.Identifier(settings.catalog_schema))

    def routing() -> tuple:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            return conn.execute(sql.SQL(
                "SELECT primary_version, candidate_version, percent FROM {} WHERE name = %s")
                .format(aliases), ("pageview_counts",)).fetchone()

    env = dict(os.environ, **settings.driver_environment())
    exe = str(Path(sys.executable).with_name("kappa"))
    # Hold the routing row so that the CLI's switch stops inside its transaction, then kill it.
    with psycopg.connect(settings.pg_dsn) as holder, \
            psycopg.connect(settings.pg_dsn, autocommit=True) as watcher:
        holder.execute(sql.SQL("SELECT 1 FROM {} WHERE name = %s FOR UPDATE").format(aliases),
                       ("pageview_counts",))
        cli = subprocess.Popen([exe, "promote", "pageview_counts", "v2"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # (A separate autocommit connection: pg_stat_activity is frozen within a transaction.)
            wait_until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'kappa' "
                "AND wait_event_type = 'Lock'").fetchone()[0] == 1, 60,
                "the CLI's switch to wait inside its transaction")
        finally:
            os.kill(cli.pid, signal.SIGKILL)
            cli.wait()
        holder.rollback()
    assert routing() == ("v1", None, 0)
    assert [h["action"] for h in service.history("pageview_counts")] == ["promote"]

    # Two promotes at once: one switches, the other finds it done; history tells exactly that.
    both = [subprocess.Popen([exe, "promote", "pageview_counts", "v2"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in both]
    for p in both:
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()
    assert sorted(code for code, _ in results) == [0, 1]
    assert any("already serves v2" in err for _, err in results)
    assert routing() == ("v2", None, 0)
    assert [h["to"] for h in service.history("pageview_counts")] == ["v1", "v2"]
    assert kappa_cli(settings, "history", "pageview_counts").returncode == 0
