"""A broker that is down while drivers start (a host's reboot where the broker comes up last):
the drivers that `kappa restart` and the agent start wait for it, however long, and the
versions resume by themselves when it is back. None is recorded failed. The agent's archiver
waits too, and goes on with no hole or overlap in its segments."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from orchestrator.archive_model.segments import check_contiguous

from conftest import job_file, wait_until
from integration.helpers import output, own_stack
from integration.observability import agent
from integration.test_archive import _manifest
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
OUTAGE_S = 90


def _runs(settings) -> dict[str, tuple[str, int, str | None]]:
    """version -> (state, attempt, reason), from the catalog alone (the broker is away)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT v.version, r.state, r.attempt, r.reason FROM {}.runs r JOIN {}.job_versions "
            "v ON v.id = r.version_id").format(sql.Identifier(settings.catalog_schema),
                                               sql.Identifier(settings.catalog_schema))
        ).fetchall()
    return {version: (state, attempt, reason) for version, state, attempt, reason in rows}


def test_drivers_started_while_the_broker_is_down_wait_for_it(tmp_path: Path) -> None:
    # A stack of its own: the test takes its broker away. Suspended, not killed, so that its
    # log (in memory) is there when it comes back.
    with own_stack("kappa-start-outage-") as stack:
        settings, service, broker = stack.settings, stack.service, stack.broker
        topic = "pageviews"
        service.produce_sample(topic, 4_000, seed=95)
        for version in ("v1", "v2"):
            service.deploy(job_file(tmp_path, version, topic))
        for version in ("v1", "v2"):
            service.wait(JOB, version, timeout_s=240)
        service.stop(JOB, "v1")
        # The agent's archiver as well: it waits the outage out and goes on where it was.
        with agent(settings, tmp_path, "--interval", "1", archive=True):
            broker.suspend()
            began = time.monotonic()
            try:
                service.restart(JOB, "v1")  # `kappa restart` while the broker is down
                driver = service.version_status(JOB, "v2").pid
                assert driver
                os.killpg(driver, signal.SIGKILL)  # the agent restarts it, broker still down
                wait_until(lambda: _runs(settings)["v2"][1] == 2, 120,
                           "the agent to restart v2's driver")

                def outage_over() -> bool:
                    runs = _runs(settings)
                    for version in ("v1", "v2"):
                        run_state, _, reason = runs[version]
                        assert run_state in ("starting", "replaying", "caught_up", "live"), \
                            f"{version} is {run_state}: {reason}"
                    return time.monotonic() - began >= OUTAGE_S

                wait_until(outage_over, OUTAGE_S + 60, "the end of the broker outage",
                           poll_s=1.0)
                # Both drivers say why they wait (a loaded machine may take its time to start
                # a driver's Spark before it first asks the broker).
                wait_until(lambda: all("unreachable service" in (_runs(settings)[v][2] or "")
                                       for v in ("v1", "v2")) or print(_runs(settings)),
                           120, "both drivers to report the outage", poll_s=1.0)
                assert all(r[0] != "failed" for r in _runs(settings).values())
            finally:
                broker.resume()
            ref = compute(settings.kafka_bootstrap, topic)
            for version, table, expected in (("v1", f"{JOB}__v1", ref.v1),
                                             ("v2", f"{JOB}__v2", ref.v2)):
                assert service.wait(JOB, version, timeout_s=240).attempt == 2
                assert output(settings, table) == expected
            service.produce_sample(topic, 1_000, seed=96)
            wait_until(lambda: all(r.current and r.behind == 0
                                   for r in service.archive_status([topic])), 120,
                       "the agent's archiver to go on after the outage")
            said = (tmp_path / "agent.out").read_text()
            assert "archive pass stopped by an unreachable service" in said, said[-2000:]
            segments = _manifest(settings, topic)
            for partition in range(4):
                mine = [s for s in segments if s.partition == partition]
                check_contiguous(mine)  # no hole, no overlap
                assert mine[0].first_offset == 0
            assert sum(s.records for s in segments) == 5_000
