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
