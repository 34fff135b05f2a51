"""The last lines of a stack process's log, for one-line errors."""

from __future__ import annotations

from pathlib import Path


def tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"
