"""`kappa dev up | down | status | env | reset`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from orchestrator.cli.output import print_json, table
from orchestrator.errors import ConfigError
from orchestrator.settings import Settings


def run_dev(settings: Settings, action: str, as_json: bool, *, memory: bool = False,
            s3: bool = False, yes: bool = False) -> int:
    from orchestrator.dev import stack

    if (memory or s3) and action != "up":
        raise ConfigError(f"--{'memory' if memory else 's3'} goes with `kappa dev up`: the "
                          "storage is chosen at start")
    if memory and s3:
        raise ConfigError("--memory and --s3 are two storages of the log: pick one")
    if action == "env":
        for line in stack.env_lines(settings.state_dir):
            print(line)
        return 0
    if action == "reset":
        return _reset(settings, as_json, yes)
    if action == "down":
        stack.stop_queue_keeper(settings.state_dir)  # it would start queued versions again
        _stop_drivers(settings)
    restored: list[Any] = []
    if action == "up":
        status = stack.up(settings.state_dir,
                          storage=stack.MEMORY if memory else stack.S3 if s3 else None,
                          restore=restore_into(settings, as_json, restored))
    else:
        status = {"down": stack.down, "status": stack.status}[action](settings.state_dir)
    spare, waiting = _spares(settings, action, status)
    if as_json:
        shown = _as_json(status)
        shown["warm_spares"] = [{"pid": w.pid, "ready": w.ready} for w in waiting]
        if action == "up":
            shown["warm_spare_pid"] = spare
        if restored:
            from orchestrator.cli.archive import restore_json

            shown["restore"] = restore_json(restored[0])
        print_json(shown)
        return 0
    print(table(["service", "running", "pid", "address"],
                [[s.name, "yes" if s.running else "no", s.pid, s.address]
                 for s in status.services]))
    if action == "down" and status.storage == stack.MEMORY:
        print("\nlog: it was in the broker's memory, and is gone; the versions that read it "
              "will show failed")
    else:
        print(f"\nlog: {status.storage_text}")
    if waiting:
        print("warm spare drivers: " + ", ".join(
            f"pid {w.pid} ({'ready' if w.ready else 'warming'})" for w in waiting))
    if action == "up":
        if spare is not None:
            print(f"warm spare driver: warming (pid {spare}); the next deploy adopts it "
                  "(warm_spares = 0 turns spares off)")
        print(f"state in {status.state_dir}; `kappa dev env` prints the settings as export "
              "lines")
    return 0


def restore_into(settings: Settings, as_json: bool, reports: list[Any] | None = None
                 ) -> Callable[[str, str, Any, Any, str | None], None]:
    """What `kappa dev up` runs once the broker is up: the archived topics it lost are
    written back before the archiver starts, and what the lost broker acknowledged past the
    archive is named (the report goes to ``reports``)."""
    def restore(pg_dsn: str, bootstrap: str, acknowledged: Any, deleted: Any,
                client_id: str | None) -> None:
        from dataclasses import replace

        from orchestrator.cli.archive import print_restore
        from orchestrator.service import Orchestrator

        # The client id the stack's proxy lets through while it holds other clients off.
        properties = (*settings.kafka_properties, *([("client.id", client_id)] if client_id
                                                   else []))
        report = Orchestrator(replace(settings, pg_dsn=pg_dsn, kafka_bootstrap=bootstrap,
                                      kafka_properties=properties)
                              ).archive_restore(acknowledged=acknowledged, deleted=deleted)
        if not as_json:
            print_restore(report, quiet_if_nothing=True)
        if reports is not None:
            reports.append(report)

    return restore


def _as_json(status: Any) -> dict[str, Any]:
    return {
        "state_dir": str(status.state_dir), "running": status.running,
        "kafka_bootstrap": status.kafka_bootstrap, "storage": status.storage,
        "cluster_id": status.cluster_id, "log_at_down": status.log_at_down,
        "services": [{"name": s.name, "pid": s.pid, "running": s.running,
                      "address": s.address} for s in status.services],
    }


def _spares(settings: Settings, action: str, status: Any) -> tuple[int | None, list[Any]]:
    """`kappa dev up` keeps one warm spare driver for the stack's services (README) and `down`
    withdraws it; (the PID of one started now, the spares waiting)."""
    from dataclasses import replace

    from orchestrator.spark.launch import launcher

    if action == "down":
        launcher.withdraw_spares(settings)
        return None, []
    started = launcher.keep_spare(replace(
        settings, pg_dsn=settings.pg_dsn or status.pg_dsn,
        kafka_bootstrap=settings.kafka_bootstrap or status.kafka_bootstrap)) \
        if action == "up" else None
    return started, launcher.waiting_spares(settings)


def _stop_drivers(settings: Settings) -> None:
    from orchestrator.dev import stack

    # Not `running`: with the log store down, the drivers must stop all the same.
    now = stack.status(settings.state_dir)
    if not (now.postgres.running and now.broker.running):
        return
    from orchestrator.service import Orchestrator

    # Drivers writing to this PostgreSQL would only fail once it is gone.
    for st in Orchestrator(settings).stop_all():
        print(f"stopped {st.job} {st.version}")


def _reset(settings: Settings, as_json: bool, yes: bool) -> int:
    from orchestrator.dev import stack
    from orchestrator.spark.checkpoint import is_local, local_path

    where = settings.state_dir.resolve()
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"`kappa dev reset` deletes the log, the catalog, the outputs and "
                              f"the checkpoints in {where}: add --yes to confirm")
        answer = input(f"Delete the log, the catalog, the outputs and the checkpoints in "
                       f"{where}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    _stop_drivers(settings)
    stack.down(settings.state_dir)
    removed = stack.reset(settings.state_dir)
    if as_json:
        print_json({"state_dir": str(where), "removed": [str(p) for p in removed]})
    else:
        for path in removed:
            print(f"removed {path}")
        elsewhere = settings.checkpoint_root
        if elsewhere and not (is_local(elsewhere)
                              and local_path(elsewhere).resolve().is_relative_to(where)):
            print(f"checkpoints under {elsewhere} (KAPPA_CHECKPOINT_ROOT) were left alone")
        if settings.archive_root:
            print(f"the archive under {settings.archive_root} (KAPPA_ARCHIVE_ROOT) was left "
                  "alone")
        print("the embedded stack is down and empty; `kappa dev up` starts it afresh")
    return 0
