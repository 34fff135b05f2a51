"""bench/replay.py's replay by a warm spare driver: the same version deployed once a spare
fitting its settings is warm, so that the deploy adopts it rather than starting Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.timeline import timeline
from orchestrator.spark.launch import launcher, spares


def warm_replay(settings: Any, service: Any, workdir: Path, topic: str, version: str,
                peer_table: str, theirs: dict[str, Any], produced: int,
                cold: dict[str, Any]) -> dict[str, Any]:
    """Start a spare, wait until it is warm, deploy on it; its figures beside the cold ones."""
    from bench.kappa_runs import checked_replay

    settings = service.settings  # the cold replays' settings turn spares off
    env = launcher.driver_environment(settings)
    began_spare = spares.keep(settings, env)
    if not spares.wait_ready(settings, env, timeout_s=300):
        raise RuntimeError(f"no warm spare within 300 s (started: {began_spare}); is memory "
                           "short? see the spare log in the spare directory")
    wanted = spares.fingerprint(settings, env)
    (ready,) = [s.pid for s in spares.live_spares(spares.spare_dir(settings))
                if s.ready and s.fingerprint == wanted][:1]
    ours = checked_replay(settings, service, workdir, topic, version, peer_table, theirs,
                          produced, None)
    if ours["pid"] != ready:
        raise RuntimeError(f"the deploy did not adopt spare {ready} (driver {ours['pid']})")
    wall = ours["wall_s"]
    return {
        "deploy_to_first_batch_s": round(ours["first_batch_s"], 2),
        "deploy_to_caught_up_s": round(wall, 2),
        "deploy_to_wait_returned_s": round(ours["waited_s"], 2),
        "spark_up_to_caught_up_s": round(ours["replay_s"], 2),  # adoption excluded
        "kappa_records_per_s_with_start": round(produced / wall),
        "kappa_records_per_s_without_start": round(produced / ours["replay_s"]),
        "peer_over_kappa_with_start": round(theirs["seconds"] / wall, 4),
        "first_batch_cold_over_warm": round(cold["first_batch_s"] / ours["first_batch_s"], 2),
        "caught_up_cold_over_warm": round(cold["wall_s"] / wall, 2),
        "tables_equal": True,  # checked_replay raised otherwise
        "timeline": timeline(Path(ours["log_path"]), ours["deployed_at"])
        if ours["log_path"] else None,
    }
