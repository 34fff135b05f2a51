"""Where a replay's seconds go, phase by phase: each line the driver logged after the deploy
call, as seconds since that call (the driver's log clock is this host's, as the deploy's)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")
MESSAGE_CHARS = 400  # the batch lines split their seconds by phase at the end


def timeline(log_path: Path, deployed_at: datetime) -> list[tuple[float, str]]:
    """(seconds after ``deployed_at``, message) of each driver log line from then on, in
    order; the lines a warm spare logged before its adoption are left out."""
    steps: list[tuple[float, str]] = []
    for line in log_path.read_text(errors="replace").splitlines():
        found = _LINE.match(line)
        if found is None:
            continue
        # logging's asctime is local time; the bench's machines (and CI's) run in UTC.
        at = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        seconds = (at - deployed_at).total_seconds()
        if seconds >= 0:
            steps.append((round(seconds, 3), found[2][:MESSAGE_CHARS]))
    return steps
