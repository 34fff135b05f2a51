"""Replay benchmark: kappa's replay against the raw read rate and a hand-written peer.

    .venv/bin/python bench/replay.py [--events N [N ...]] [--source kafka [archive] [decoded]]
                                     [--workers W [W ...]] [--unpruned] [--cold-only]
                                     [--format avro] [--json]

Starts its own embedded stack in a temporary directory (or uses KAPPA_PG_DSN and
KAPPA_KAFKA_BOOTSTRAP). For each N (default 1,000,000) it produces N sample events into a new
4-partition topic, then measures, one after the other so that each has the machine to itself:
1. the raw read rate (confluent-kafka, no decoding) of one process, and of one process per core
   over disjoint partitions (spawned, timed from a common start barrier to the last to finish);
2. bench/peer.py: one process that parses, validates and aggregates like pageview_counts v1
   and COPYs the result into PostgreSQL;
3. kappa: deploy pageview_counts v1 on the topic and wait until it has caught up: records/s from
   the deploy call (Spark start included) and from the driver's `replaying` state (Spark session
   up) to `caught_up` (start excluded), both up to the instant the driver recorded `caught_up`
   in the catalog (not when a poll of it returned); deploy to the first committed batch (the
   first catalog `batches` row's `applied_at`, the now() of that batch's commit transaction);
   the driver's
   peak resident memory (Python and JVM); µs per event with start excluded.
4. with --source kafka archive: `kappa archive run --once` on the topic, then the same replay by
   a second version, which now reads every range from the archive's segments (checked by the
   batch records' archived offsets): the same figures, and the ratios to the replay from Kafka.
5. with --unpruned: each replay again by a version that reads every source column
   (prune_columns false), and the pruned replay's speed over it.
6. unless --cold-only: every replay above starts its driver cold (warm_spares 0); then one
   more version is deployed once a warm spare driver is ready, and adopts it
   (bench/warm_start.py): deploy to the first batch and to caught up, warm against cold.
7. with --format avro: the same events written as Avro under two schema versions, replayed
   from Kafka and (with --source decoded) from decoded segments, with the ratios to the JSON
   replays: bench/avro_runs.py.
It checks that kappa's output table equals the peer's row for row and that both rejected the
same number of records (raises if not), prints the rates and ratios, and with several N the
"flat cost" figure: µs per event at the largest N over µs per event at the smallest (1.0: the
per-event cost does not grow with the log). It asserts nothing about speed.

With --workers, the smallest N is also replayed on a Spark standalone cluster on loopback, once
per worker count W (a master and W workers of --worker-cores cores each, started for that run):
the same rates, the same check against the peer's table, and the rate's scaling over the
smallest W's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: bench/ is not a package on the path
    sys.path.insert(0, str(ROOT))

from bench.kappa_runs import checked_replay, cluster_replay  # noqa: E402


def pruning_worth(settings: Any, unpruned: Any | None, workdir: Path, topic: str,
                  version: str, peer_table: str, theirs: dict[str, Any], produced: int,
                  pruned: dict[str, Any]) -> dict[str, Any]:
    """With --unpruned: the same replay by a version that reads every source column
    (prune_columns false), and the pruned replay's speed over it."""
    if unpruned is None:
        return {}
    plain = checked_replay(settings, unpruned, workdir, topic, version, peer_table, theirs,
                           produced, None)
    return {"unpruned_records_per_s_without_start": round(produced / plain["replay_s"]),
            "pruned_over_unpruned_without_start": round(plain["replay_s"] / pruned["replay_s"],
                                                         4)}


def from_archive(settings: Any, service: Any, workdir: Path, topic: str, version: str,
                 peer_table: str, theirs: dict[str, Any], produced: int, kafka: dict[str, Any],
                 raw_all: float, profile: Path | None, unpruned: Any | None = None
                 ) -> dict[str, Any]:
    """The topic archived (`kappa archive run --once`), then replayed from the archive."""
    began = time.perf_counter()
    service.archive([topic], once=True)
    archived_s = time.perf_counter() - began
    ours = checked_replay(settings, service, workdir, topic, version, peer_table, theirs,
                          produced, profile)
    if ours["archived_offsets"] != produced:
        raise RuntimeError(f"the replay read {ours['archived_offsets']} of {produced} offsets "
                           "from the archive: it was meant to read them all there")
    wall, replay_s = ours["wall_s"], ours["replay_s"]
    return {
        "archive_run_once_s": round(archived_s, 2),
        "offsets_read_from_archive": ours["archived_offsets"],
        "kappa_records_per_s_with_start": round(produced / wall),
        "kappa_records_per_s_without_start": round(produced / replay_s),
        "without_start_over_kafka": round(kafka["replay_s"] / replay_s, 4),
        "with_start_over_kafka": round(kafka["wall_s"] / wall, 4),
        "kappa_without_start_over_raw_all_cores": round(produced / replay_s / raw_all, 4),
        "peer_over_kappa_with_start": round(theirs["seconds"] / wall, 4),
        "peer_over_kappa_without_start": round(theirs["seconds"] / replay_s, 4),
        "deploy_to_caught_up_s": round(wall, 2),
        "spark_up_to_caught_up_s": round(replay_s, 2),
        "deploy_to_first_batch_s": round(ours["first_batch_s"], 2),
        "driver_peak_rss_total_mb": ours["memory"]["total_mb"],
        "kappa_us_per_event_without_start": round(1e6 * replay_s / produced, 3),
        "tables_equal": True,  # checked_replay raised otherwise
        **pruning_worth(settings, unpruned, workdir, topic, f"{version}u", peer_table, theirs,
                        produced, ours),
        **({"profile": ours["profile"]} if "profile" in ours else {}),
    }


def measure(settings: Any, service: Any, workdir: Path, name: str, count: int,
            workers: list[int], worker_cores: int, profile: Path | None = None,
            sources: tuple[str, ...] = ("kafka",), unpruned: Any | None = None,
            warm: Any | None = None, raw: Any | None = None, avro: bool = False
            ) -> dict[str, Any]:
    """Every figure for one topic of ``count`` events; ``name`` is unique per run. The replay
    from Kafka runs first, before the archive holds the topic: then Kafka serves every range."""
    from bench import peer
    from bench.decoded import from_decoded
    from bench.raw_read import raw_read_rate, raw_read_rate_all_cores
    from bench.warm_start import warm_replay

    topic, version = f"bench_{name}", f"b{name}"
    bootstrap = settings.kafka_bootstrap or ""
    produced = service.produce_sample(topic, count, seed=1)
    raw_one = raw_read_rate(bootstrap, topic, produced)
    raw_all, readers = raw_read_rate_all_cores(bootstrap, topic, produced)
    peer_table = f"peer_{name}"
    theirs = peer.replay(bootstrap, topic, settings.pg_dsn, settings.data_schema, peer_table)
    last = [s for s in ("kafka", "archive", "decoded") if s in sources][-1]  # profiled
    ours = checked_replay(settings, service, workdir, topic, version, peer_table, theirs,
                          produced, profile if last == "kafka" else None)
    if ours["archived_offsets"]:
        raise RuntimeError(f"the replay from Kafka read {ours['archived_offsets']} offsets "
                           "from the archive: the archive held the topic too early")
    pruning = pruning_worth(settings, unpruned, workdir, topic, f"{version}u", peer_table,
                            theirs, produced, ours)
    spare = warm_replay(settings, warm, workdir, topic, f"{version}s", peer_table, theirs,
                        produced, ours) if warm is not None else None
    archived = from_archive(settings, raw or service, workdir, topic, f"{version}a",
                            peer_table, theirs, produced, ours, raw_all,
                            profile if last == "archive" else None, unpruned) \
        if "archive" in sources else None
    decoded = from_decoded(settings, service, raw or service, warm, workdir, topic,
                           f"{version}d", peer_table, theirs, produced, ours, raw_all,
                           profile if last == "decoded" else None) \
        if "decoded" in sources else None
    if avro:
        from bench.avro_runs import avro_figures

        decoded_avro = avro_figures(settings, workdir, name, count, peer_table, theirs, ours,
                                    decoded, raw_all)
    wall, replay_s = ours["wall_s"], ours["replay_s"]
    clusters = [cluster_replay(settings, workdir, topic, f"{version}w{w}", w, worker_cores,
                               peer_table, produced, theirs["invalid"]) for w in workers]
    if clusters:
        base = clusters[0]["kappa_records_per_s_without_start"]
        for run in clusters:
            run["rate_without_start_over_first"] = round(
                run["kappa_records_per_s_without_start"] / base, 4)
    return {
        "events": produced,
        "raw_read_1_process_records_per_s": round(raw_one),
        "raw_read_all_cores_records_per_s": round(raw_all),
        "raw_read_all_cores_processes": readers,
        "kappa_records_per_s_with_start": round(produced / wall),
        "kappa_records_per_s_without_start": round(produced / replay_s),
        "kappa_with_start_over_raw_1_process": round(produced / wall / raw_one, 4),
        "kappa_with_start_over_raw_all_cores": round(produced / wall / raw_all, 4),
        "kappa_without_start_over_raw_1_process": round(produced / replay_s / raw_one, 4),
        "kappa_without_start_over_raw_all_cores": round(produced / replay_s / raw_all, 4),
        "deploy_to_caught_up_s": round(wall, 2),
        "deploy_to_wait_returned_s": round(ours["waited_s"], 2),
        "spark_up_to_caught_up_s": round(replay_s, 2),
        "deploy_to_first_batch_s": round(ours["first_batch_s"], 2),
        "deploy_to_spark_session_up_s": round(ours["session_s"], 2),
        "driver_peak_rss_python_mb": ours["memory"]["python_mb"],
        "driver_peak_rss_jvm_mb": ours["memory"]["jvm_mb"],
        "driver_peak_rss_total_mb": ours["memory"]["total_mb"],
        "peer_s": round(theirs["seconds"], 2),
        "peer_records_per_s": round(produced / theirs["seconds"]),
        "peer_over_kappa_with_start": round(theirs["seconds"] / wall, 4),
        "peer_over_kappa_without_start": round(theirs["seconds"] / replay_s, 4),
        "output_rows": ours["rows"],
        "dead_letters": ours["dead_letters"],
        "tables_equal": True,  # checked above
        "kappa_us_per_event_without_start": round(1e6 * replay_s / produced, 3),
        **pruning,
        **({"warm_spare": spare} if spare else {}),
        **({"from_archive": archived} if archived else {}),
        **({"from_decoded": decoded} if decoded else {}),
        **({"avro": decoded_avro} if avro else {}),
        **({"standalone_cluster": clusters} if clusters else {}),
        **({"profile": ours["profile"]} if "profile" in ours else {}),
    }


def flat_cost(runs: list[dict[str, Any]]) -> float | None:
    """µs/event at the largest N over µs/event at the smallest; None with one N."""
    if len({r["events"] for r in runs}) < 2:
        return None
    small = min(runs, key=lambda r: r["events"])
    large = max(runs, key=lambda r: r["events"])
    ratio: float = large["kappa_us_per_event_without_start"] / small[
        "kappa_us_per_event_without_start"]
    return round(ratio, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--count", type=int, nargs="+", dest="events", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, nargs="*", default=[],
                        help="also replay the smallest N on a standalone cluster of W workers")
    parser.add_argument("--worker-cores", type=int, default=1)
    parser.add_argument("--profile", type=Path,
                        help="profile kappa's replay at the largest N (needs py-spy); stacks "
                             "are written to this directory")
    parser.add_argument("--durable", action="store_true",
                        help="the embedded broker keeps its log in its S3 store (`kappa dev up "
                             "--s3`), not in memory")
    parser.add_argument("--source", nargs="+", choices=["kafka", "archive", "decoded"],
                        default=["kafka"],
                        help="kafka: replay from the broker; archive: then archive the topic "
                             "and replay its raw segments; decoded: decode them and replay "
                             "the decoded segments, in the same run")
    parser.add_argument("--unpruned", action="store_true",
                        help="also replay with prune_columns false, to show what pruning is "
                             "worth")
    parser.add_argument("--cold-only", action="store_true",
                        help="skip the replay on a warm spare driver")
    parser.add_argument("--format", choices=["json", "avro"], default="json",
                        dest="event_format",
                        help="avro: also replay the sample written as Avro (bench/avro_runs.py) "
                             "from Kafka and, with --source decoded, from decoded segments")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from bench.replay_report import show
    from bench.stack import bench_stack
    from orchestrator.service import Orchestrator

    with bench_stack("replay", durable=args.durable, spares=True) as (
            warm_settings, warm, workdir, tag):
        # Every replay starts its driver cold, but the one measured on a warm spare.
        settings = replace(warm_settings, warm_spares=0)
        service = Orchestrator(settings)
        unpruned = Orchestrator(replace(settings, prune_columns=False, decoded_segments=False)) \
            if args.unpruned else None
        raw = Orchestrator(replace(settings, decoded_segments=False))  # raw segments only
        smallest = min(args.events)
        largest = max(args.events)
        runs = [measure(settings, service, workdir, f"{tag}_{i}", n,
                        args.workers if n == smallest else [], args.worker_cores,
                        args.profile if n == largest else None, tuple(args.source), unpruned,
                        None if args.cold_only else warm, raw, args.event_format == "avro")
                for i, n in enumerate(args.events)]
    results = {"runs": runs, "flat_cost_us_per_event_largest_over_smallest": flat_cost(runs)}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        show(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
