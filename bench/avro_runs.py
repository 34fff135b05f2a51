"""The Avro side of the replay benchmark (`bench/replay.py --format avro`, #62): the page-view
sample written as Avro under two schema versions (the same events as the JSON topic of the same
run: same seed), replayed by pageview_counts v1 read with the second version, from Kafka and
from decoded segments, each checked row for row against the peer's table of the JSON topic.
Its figures are ratios to the JSON replays of the same run.

The schema registry is the suite's stand-in (tests/registry_standin.py, in this process): no
registry server installs here (docs/formats.md). Executors ask it for each writer schema once."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def avro_figures(settings: Any, workdir: Path, name: str, count: int, peer_table: str,
                 theirs: dict[str, Any], kafka_json: dict[str, Any],
                 decoded_json: dict[str, Any] | None, raw_all: float) -> dict[str, Any]:
    """Every Avro figure for one N; ``kafka_json`` and ``decoded_json`` are the JSON replays'
    (kappa_replay's dict, from_decoded's figures), ``raw_all`` the all-cores raw read rate."""
    from bench.decoded import from_decoded
    from bench.kappa_runs import checked_replay
    from orchestrator.service import Orchestrator

    sys.path.insert(0, str(ROOT / "tests"))
    from registry_standin import RegistryStandIn

    registry = RegistryStandIn()
    try:
        on_registry = replace(settings, schema_registry_url=registry.url)
        service = Orchestrator(on_registry)
        topic, version = f"bench_{name}_avro", f"b{name}v"
        began = time.perf_counter()
        produced = service.produce_sample(topic, count, seed=1, event_format="avro")
        produce_s = time.perf_counter() - began
        kafka = checked_replay(on_registry, service, workdir, topic, version, peer_table,
                               theirs, produced, None, "avro")
        figures: dict[str, Any] = {
            "events": produced,
            "produce_s": round(produce_s, 2),
            "kafka_records_per_s_without_start": round(produced / kafka["replay_s"]),
            "spark_up_to_caught_up_s": round(kafka["replay_s"], 2),
            "json_over_avro_without_start_kafka": round(
                kafka_json["replay_s"] / kafka["replay_s"], 4),
            "dead_letters": kafka["dead_letters"],
            "tables_equal": True,  # checked_replay raised otherwise
        }
        if decoded_json is not None:
            raw = Orchestrator(replace(on_registry, decoded_segments=False))
            decoded = from_decoded(on_registry, service, raw, None, workdir, topic,
                                   f"{version}d", peer_table, theirs, produced, kafka, raw_all,
                                   None, "avro")
            figures["from_decoded"] = decoded
            # The limit: a decoded Avro replay within 1.2x of a decoded JSON one.
            figures["decoded_avro_over_json_replay_s"] = round(
                decoded["spark_up_to_caught_up_s"] / decoded_json["spark_up_to_caught_up_s"], 4)
        figures["registry_requests"] = dict(registry.requests)
        return figures
    finally:
        registry.close()
