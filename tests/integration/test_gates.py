"""Honest gates: promote and A/B check the *measured* lag and a validation that is current.

The lag is the latest sample of the current run when it is fresh (as the agent keeps it), else
the broker's answer: a switch with fresh samples needs no broker at all."""

from __future__ import annotations

import os
import signal
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file
from integration.helpers import query, stop_drivers

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def test_promote_is_refused_when_behind_or_validated_before_a_restart(
    settings, topic, tmp_path: Path
) -> None:
    from orchestrator.errors import StateError
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 10_000, seed=71)
    try:
        for version in ("v1", "v2"):
            service.deploy(job_file(tmp_path, version, topic))
        for version in ("v1", "v2"):
            service.wait(JOB, version, timeout_s=240)
        service.promote(JOB, "v1", force=True, reason="first version")
        assert service.diff(JOB, "v1", "v2").passed

        # Live, but 10,000 records behind: its state says live, its measured lag says no.
        driver = service.version_status(JOB, "v2").pid
        os.kill(driver, signal.SIGSTOP)
        try:
            service.produce_sample(topic, 10_000, seed=72)
            assert service.version_status(JOB, "v2").state.value == "live"
            # What the agent does every few seconds: the fresh sample is what the gate reads.
            (sampled,) = service.lag(JOB, "v2")
            assert sampled.lag_records == 10_000
            for switch in (lambda: service.promote(JOB, "v2"),
                           lambda: service.ab(JOB, "v2", 10)):
                with pytest.raises(StateError, match="it is 10000 records behind the log end"):
                    switch()
        finally:
            os.kill(driver, signal.SIGCONT)
        service.wait(JOB, "v2", timeout_s=120)

        # A validation made before the version's restart no longer counts.
        service.restart(JOB, "v2")
        service.wait(JOB, "v2", timeout_s=240)
        with pytest.raises(StateError, match="validation predates the latest deploy or restart "
                                             "of v2"):
            service.promote(JOB, "v2")
        service.wait(JOB, "v1", timeout_s=240)
        assert service.diff(JOB, "v1", "v2").passed
        assert service.promote(JOB, "v2")["primary"] == "v2"
        (last,) = service.history(JOB)[-1:]
        assert (last["action"], last["to"]) == ("promote", "v2") and not last["forced"]

        # The broker unreachable: switches judge by the fresh samples, and never wait for it.
        # The samples stay fresh for as long as this part takes: with the default 15 s, a loaded
        # machine could spend their age on the unreachable address's timeouts (`stale` below)
        # before the last switch, which would then ask the broker after all.
        offline = Orchestrator(replace(settings, kafka_bootstrap="127.0.0.1:9",
                                       lag_sample_max_age_s=3600.0))
        stale = Orchestrator(replace(offline.settings, lag_sample_max_age_s=0))
        service.lag(JOB)
        assert offline.rollback(JOB, reason="broker away")["primary"] == "v1"
        # Without a fresh sample a promote must ask the broker, and cannot.
        with pytest.raises(StateError, match="its lag cannot be measured against the log now"):
            stale.promote(JOB, "v2")
        assert offline.promote(JOB, "v2")["primary"] == "v2"
        assert stale.rollback(JOB)["primary"] == "v1"  # a rollback never needs the broker
        lag_from = query(settings, f"SELECT kind, detail->'lag_from' FROM "
                                   f"{settings.catalog_schema}.events "
                                   "WHERE kind IN ('alias_promote', 'alias_rollback') "
                                   "ORDER BY id DESC LIMIT 3")
        assert lag_from == [("alias_rollback", {"v1": "none", "v2": "none"}),
                            ("alias_promote", {"v1": "sample", "v2": "sample"}),
                            ("alias_rollback", {"v1": "sample", "v2": "sample"})]
        for each in (offline, stale):
            each.close()
    finally:
        stop_drivers(service)
