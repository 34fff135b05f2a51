"""The driver's memory does not grow with invalid events or with output keys: rows and dead
letters are written by the executors, never collected in the driver.

What a regression costs, measured by hoarding them in the driver process (a fetch of the dead
letters and output rows kept on the batch commit): +50 MB of the Python driver's peak with 60,000
dead letters, +72 MB with 100,000 output keys, and +27 MB and +38 MB at this test's 30,000
and 50,000, while the whole driver (Python and JVM, 630 MB) grew by less than 8 %. Between
clean runs the Python driver's peak varies by 2 MB and the JVM's by 1 %. So the bounds are
on the Python driver, which sees no record unless something collects it, with the JVM's on the
side."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from bench.memory import job_copy, peak_rss_mb
from orchestrator.service import Orchestrator

from integration.stream_helpers import dead_letter_offsets, table
from reference_streams import Log, read_records, user_profiles, valid_pageview

pytestmark = [pytest.mark.integration, pytest.mark.spark]
COUNT = 100_000
# Well below what 30,000 dead letters or 50,000 rows in the driver cost; far above the noise.
PYTHON_GROWTH_MB = 10.0
JVM_GROWTH = 1.10  # the same job over the same number of records


def _replay(service, path: Path, job: str, version: str) -> dict[str, float]:
    service.deploy(path)
    status = service.wait(job, version, timeout_s=600)
    peak = peak_rss_mb(status.pid)
    service.stop(job, version)
    return peak


def test_neither_invalid_events_nor_output_keys_cost_the_driver_memory(
        service, settings, tmp_path: Path) -> None:
    # Every driver cold: a spare's JVM ran a warm-up query before the job, a cold one did not.
    service = Orchestrator(replace(settings, warm_spares=0))
    tag = uuid.uuid4().hex[:8]
    clean, flood, profiles = f"clean_{tag}", f"flood_{tag}", f"profiles_{tag}"
    service.produce_sample(clean, COUNT, seed=71, invalid_share=0.0)
    service.produce_sample(flood, COUNT, seed=72, invalid_share=0.3)
    service.produce_sample(profiles, COUNT // 2, seed=73, kind="profiles", users=COUNT // 2)
    v2 = "jobs/pageview_counts/v2.py"
    calm = _replay(service, job_copy(tmp_path, v2, {"pageviews": clean}, "clean"),
                   "pageview_counts", "clean")
    stormy = _replay(service, job_copy(tmp_path, v2, {"pageviews": flood}, "flood"),
                     "pageview_counts", "flood")
    keyed = _replay(service, job_copy(tmp_path, "jobs/user_profiles/v1.py",
                                      {"profiles": profiles}, "many"), "user_profiles", "many")
    print(f"driver peak RSS: clean {calm}, 30 % invalid {stormy}, {COUNT // 2:,} keys {keyed}")

    invalid = {(p, o) for p, o, *_, v in read_records(settings.kafka_bootstrap, flood)
               if valid_pageview(v) is None}
    assert 0.28 * COUNT < len(invalid) < 0.32 * COUNT
    assert dead_letter_offsets(settings, "pageview_counts__flood__dead_letters", flood) == invalid
    reference = user_profiles(Log([], read_records(settings.kafka_bootstrap, profiles)))
    assert len(reference) > 0.99 * COUNT // 2
    columns = ["plan", "country", "city", "tags", "updated_at"]
    assert table(settings, "user_profiles__many", "user_id", columns) == reference

    assert stormy["python_mb"] <= calm["python_mb"] + PYTHON_GROWTH_MB, (calm, stormy)
    assert stormy["jvm_mb"] <= JVM_GROWTH * calm["jvm_mb"], (calm, stormy)
    assert keyed["python_mb"] <= calm["python_mb"] + PYTHON_GROWTH_MB, (calm, keyed)
