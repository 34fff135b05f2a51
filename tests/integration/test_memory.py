"""The driver's memory does not grow with invalid events or with output keys: rows and dead
letters are written by the executors, never collected in the driver."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.memory import job_copy, peak_rss_mb

from integration.stream_helpers import dead_letter_offsets, table
from reference_streams import Log, read_records, user_profiles, valid_pageview

pytestmark = [pytest.mark.integration, pytest.mark.spark]
COUNT = 200_000


def _replay(service, path: Path, job: str, version: str) -> dict[str, float]:
    service.deploy(path)
    status = service.wait(job, version, timeout_s=600)
    peak = peak_rss_mb(status.pid)
    service.stop(job, version)
    return peak


def test_a_flood_of_invalid_events_costs_the_driver_no_memory(service, settings,
                                                              tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    clean, flood = f"clean_{tag}", f"flood_{tag}"
    service.produce_sample(clean, COUNT, seed=71, invalid_share=0.0)
    service.produce_sample(flood, COUNT, seed=72, invalid_share=0.3)
    v2 = "jobs/pageview_counts/v2.py"
    calm = _replay(service, job_copy(tmp_path, v2, {"pageviews": clean}, "clean"),
                   "pageview_counts", "clean")
    stormy = _replay(service, job_copy(tmp_path, v2, {"pageviews": flood}, "flood"),
                     "pageview_counts", "flood")
    print(f"driver peak RSS: clean {calm}, 30 % invalid {stormy}")
    invalid = {(p, o) for p, o, *_, v in read_records(settings.kafka_bootstrap, flood)
               if valid_pageview(v) is None}
    assert 0.28 * COUNT < len(invalid) < 0.32 * COUNT
    assert dead_letter_offsets(settings, "pageview_counts__flood__dead_letters", flood) == invalid
    assert stormy["total_mb"] <= 1.2 * calm["total_mb"], (calm, stormy)


def test_many_output_keys_replay_exactly(service, settings, tmp_path: Path) -> None:
    topic = f"profiles_{uuid.uuid4().hex[:8]}"
    service.produce_sample(topic, COUNT // 2, seed=73, kind="profiles", users=COUNT // 2)
    peak = _replay(service, job_copy(tmp_path, "jobs/user_profiles/v1.py", {"profiles": topic},
                                     "many"), "user_profiles", "many")
    print(f"driver peak RSS with {COUNT // 2:,} keys: {peak}")
    reference = user_profiles(Log([], read_records(settings.kafka_bootstrap, topic)))
    assert len(reference) > 0.99 * COUNT // 2
    columns = ["plan", "country", "city", "tags", "updated_at"]
    assert table(settings, "user_profiles__many", "user_id", columns) == reference
