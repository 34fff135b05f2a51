"""bench/replay.py's results, for people."""

from __future__ import annotations

from typing import Any


def show(results: dict[str, Any]) -> None:
    for run in results["runs"]:
        print(f"--- {run['events']:,} events")
        for key, value in run.items():
            if key == "profile":
                show_profile(value)
                continue
            if key in _SECTIONS:
                _section(key, value, "  ")
                continue
            if key == "standalone_cluster":
                for c in value:
                    print(f"  standalone cluster, {c['workers']} worker(s) of "
                          f"{c['cores_per_worker']} core(s):")
                    for k, v in c.items():
                        if k not in ("workers", "cores_per_worker"):
                            print(f"    {k:40} {v!s:>14}")
                continue
            print(f"{key:44} {value:>14,}" if isinstance(value, int) and
                  not isinstance(value, bool) else f"{key:44} {value!s:>14}")
    if results["flat_cost_us_per_event_largest_over_smallest"] is not None:
        print(f"{'flat_cost_us_per_event_largest_over_smallest':44} "
              f"{results['flat_cost_us_per_event_largest_over_smallest']:>14}")


_SECTIONS = {"from_archive": "replayed from the archive's raw segments:",
             "from_decoded": "replayed from decoded segments:",
             "warm_spare": "deployed on a warm spare driver:",
             "avro": "the same events as Avro (two schema versions), from Kafka:"}


def _section(key: str, value: dict[str, Any], indent: str) -> None:
    print(f"{indent}{_SECTIONS[key]}")
    for k, v in value.items():
        if k == "profile":
            show_profile(v)
        elif k in _SECTIONS:
            _section(k, v, indent + "  ")
        else:
            print(f"{indent}  {k:40} {v!s:>14}")


def show_profile(profile: dict[str, Any]) -> None:
    print(f"  profile, deploy to caught up: {profile['window_s']} s, "
          f"{profile['cpu_capacity_s']} CPU-s available")
    for who, seconds in profile["cpu_s_by_role"].items():
        print(f"    {who:40} {seconds:>8} CPU-s")
    python = profile["python"]
    print(f"  Python stacks ({python['samples']:,} samples, {profile['stacks_file']}):")
    for kind in ("self", "inclusive"):
        print(f"    by {kind} time:")
        for fn, share in python[kind]:
            print(f"      {share:>6.1%}  {fn}")
