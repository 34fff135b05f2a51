"""Printing for people and for scripts.

People get `rich`: on a terminal, tables with their states in colour (none under ``NO_COLOR``),
a progress bar redrawn in place, and `kappa lag --watch` redrawn as one live table. Where the
output is not a terminal (a pipe, a file, a CI log) the same tables come as plain lines, with
no colour, no redraw and no width limit, exactly as scripts that read them have always seen
them. Scripts that want structure use ``--json``, printed as before, byte for byte.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, cast

from orchestrator.models import VersionStatus

if TYPE_CHECKING:
    # Imported where a person's output is drawn: a `--json` call never pays for rich.
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.text import Text

# Run states, lag states and the stack's yes/no, as people scan for them.
STATE_STYLES = {
    "live": "green", "caught_up": "green", "yes": "green",
    "replaying": "cyan", "catching_up": "cyan", "starting": "cyan", "registered": "cyan",
    "stopped": "yellow", "falling_behind": "yellow", "retired": "dim",
    "failed": "bold red", "stalled": "bold red", "no": "red", "log_gone": "magenta",
}
_STYLED_COLUMNS = {"state", "running"}
_PLAIN_WIDTH = 100_000  # off a terminal, lines are as long as their content
_UNWRAPPED = 3


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def console(stream: IO[str] | None = None) -> Console:
    """A console on ``stream`` (stdout): a terminal's width and colours on a terminal, else
    plain lines. rich itself honours NO_COLOR."""
    from rich.console import Console

    stream = sys.stdout if stream is None else stream
    tty = stream.isatty()
    return Console(file=stream, highlight=False, force_terminal=tty,
                   width=None if tty else _PLAIN_WIDTH)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table for ``print``: upper-case headers, columns two spaces apart, states coloured on
    a terminal."""
    from rich.table import Table

    grid = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1),
                 header_style="bold", show_header=True)
    for i, header in enumerate(headers):
        # On a narrow terminal the leading columns (job, version, state: what people scan for)
        # never wrap; the others fold within their cells.
        grid.add_column(header.upper(), no_wrap=i < _UNWRAPPED, overflow="fold")
    styled = [h in _STYLED_COLUMNS for h in headers]
    for row in rows:
        grid.add_row(*[_cell(value, style) for value, style in zip(row, styled, strict=True)])
    return render(grid)


def render(renderable: Any) -> str:
    """What ``renderable`` prints as on stdout, as text (with its colours on a terminal)."""
    from rich.console import Console

    shown = console()
    buffer = io.StringIO()
    into = Console(file=buffer, highlight=False, force_terminal=shown.is_terminal,
                   color_system=cast(Any, shown.color_system), no_color=shown.no_color,
                   width=shown.width)
    into.print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").split("\n"))


def _cell(value: Any, styled: bool) -> Text:
    from rich.text import Text

    text = "" if value is None else str(value)
    return Text(text, style=STATE_STYLES.get(text, "") if styled else "")


def status_table(statuses: Sequence[VersionStatus]) -> str:
    rows = []
    for st in statuses:
        offsets = "(of a log that is gone)" if st.log_gone else ", ".join(
            f"{t}/{p}:{o}" for t, ps in st.processed_offsets.items() for p, o in ps.items())
        rows.append([st.job, st.version, st.state.value, st.pid or st.app_id, st.output_table,
                     st.rows, st.dead_letters, st.lag_records,
                     None if st.heartbeat_age_s is None else f"{st.heartbeat_age_s:.1f}s",
                     offsets, None if st.decoded is None else "{:,}/{:,}".format(*st.decoded)])
    text = table(["job", "version", "state", "pid", "output table", "rows", "dead letters",
                  "lag", "heartbeat", "processed offsets", "decoded"], rows)
    for st in statuses:
        if st.reason and st.state.value in ("failed", "stopped", "queued"):
            text += f"\n\n{st.job} {st.version} {st.state.value}: {st.reason}"
            if st.log_tail:
                text += f"\nlast lines of {st.log_path}:\n  " + "\n  ".join(st.log_tail)
    return text


def print_error(message: str) -> None:
    from rich.text import Text

    console(sys.stderr).print(Text(message, style="red"))


class ProgressBar:
    """A version catching up, on stderr: a bar redrawn in place on a terminal, else a plain line
    whenever the state changes."""

    def __init__(self, label: str, width: int = 30):
        self.label, self.width = label, width
        self.tty = sys.stderr.isatty()
        self._last = self._last_state = ""
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(bar_width=width),
                TextColumn("{task.percentage:>5.1f}%"), MofNCompleteColumn(),
                TextColumn("{task.fields[state]}"), console=console(sys.stderr))
            self._task = self._progress.add_task(label, total=None, state="")
            self._progress.start()

    def update(self, st: VersionStatus) -> None:
        processed = sum(o for ps in st.processed_offsets.values() for o in ps.values())
        total = processed + (st.lag_records or 0)
        state = st.state.value
        if st.state.value == "queued" and st.reason:
            state += f" ({st.reason})"
        if st.decoded is not None and st.decoded[0] < st.decoded[1]:
            # The replay parses what is not decoded yet; the archiver decodes meanwhile.
            state += " (decoded segments {:,} of {:,})".format(*st.decoded)
        if self._progress is not None and self._task is not None:
            from rich.text import Text

            self._progress.update(self._task, completed=processed, total=total or None,
                                  state=Text(state, style=STATE_STYLES.get(state, "")))
            return
        fraction = processed / total if total else 0.0
        filled = int(fraction * self.width)
        line = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{fraction:6.1%} {processed:,}/{total:,} {state}")
        if line != self._last and state != self._last_state:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        self._last, self._last_state = line, state

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
