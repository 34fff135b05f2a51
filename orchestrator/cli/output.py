"""Printing for people (tables, a progress bar) and for scripts (--json)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator.models import VersionStatus


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def status_table(statuses: Sequence[VersionStatus]) -> str:
    rows = []
    for st in statuses:
        offsets = "(of a log that is gone)" if st.log_gone else ", ".join(
            f"{t}/{p}:{o}" for t, ps in st.processed_offsets.items() for p, o in ps.items())
        rows.append([st.job, st.version, st.state.value, st.pid or st.app_id, st.output_table,
                     st.rows, st.dead_letters, st.lag_records,
                     None if st.heartbeat_age_s is None else f"{st.heartbeat_age_s:.1f}s",
                     offsets])
    text = table(["job", "version", "state", "pid", "output table", "rows", "dead letters",
                  "lag", "heartbeat", "processed offsets"], rows)
    for st in statuses:
        if st.reason and st.state.value in ("failed", "stopped"):
            text += f"\n\n{st.job} {st.version} {st.state.value}: {st.reason}"
            if st.log_tail:
                text += f"\nlast lines of {st.log_path}:\n  " + "\n  ".join(st.log_tail)
    return text


class ProgressBar:
    """One line on stderr, redrawn in place while a version catches up."""

    def __init__(self, label: str, width: int = 30):
        self.label, self.width = label, width
        self.tty = sys.stderr.isatty()
        self._last = ""

    def update(self, st: VersionStatus) -> None:
        processed = sum(o for ps in st.processed_offsets.values() for o in ps.values())
        behind = st.lag_records or 0
        total = processed + behind
        fraction = processed / total if total else 0.0
        filled = int(fraction * self.width)
        line = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{fraction:6.1%} {processed:,}/{total:,} {st.state.value}")
        if self.tty:
            sys.stderr.write("\r" + line)
        elif line != self._last and st.state.value != self._last.rsplit(" ", 1)[-1]:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self._last = line

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
