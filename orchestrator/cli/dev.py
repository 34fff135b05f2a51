"""`kappa dev up | down | status | env`."""

from __future__ import annotations

from orchestrator.cli.output import print_json, table
from orchestrator.settings import Settings


def run_dev(settings: Settings, action: str, as_json: bool) -> int:
    from orchestrator.dev import stack

    if action == "env":
        for line in stack.env_lines(settings.state_dir):
            print(line)
        return 0
    if action == "down" and stack.status(settings.state_dir).running:
        from orchestrator.service import Orchestrator

        # Drivers writing to this PostgreSQL would only fail once it is gone.
        for st in Orchestrator(settings).stop_all():
            print(f"stopped {st.job} {st.version}")
    status = {"up": stack.up, "down": stack.down, "status": stack.status}[action](
        settings.state_dir)
    if as_json:
        print_json({
            "state_dir": str(status.state_dir), "running": status.running,
            "kafka_bootstrap": status.kafka_bootstrap,
            "services": [{"name": s.name, "pid": s.pid, "running": s.running,
                          "address": s.address} for s in (status.postgres, status.broker)],
        })
    else:
        print(table(["service", "running", "pid", "address"],
                    [[s.name, "yes" if s.running else "no", s.pid, s.address]
                     for s in (status.postgres, status.broker)]))
        if action == "up":
            print(f"\nstate in {status.state_dir}; `kappa dev env` prints the settings as "
                  "export lines")
    return 0
