"""Live first (pure): while versions catch up, the live versions that readers depend on come
first, and stay within ``live_lag_protect_s`` of the log end.

A lag can only be kept under a limit by acting before it is reached: the agent sees a lag a
sample late, and a live version takes a few seconds to read what piled up once a catch-up has
made room. So a live version more than half the limit behind (the age of its oldest unread
record) holds the replay queue, so that no catch-up starts, and pauses the lowest-priority
catch-up. It pauses one more each half limit for as long as it stays that far behind, since a
pause takes a while to show in the live version's lag. The hold ends once every live version is
back under a quarter of the limit, so that a live version hovering at the mark does not pause
and resume the same catch-up over and over. A lag that was not measured decides nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LiveLag:
    job: str
    version: str
    lag_seconds: float | None  # None: not measured


@dataclass(frozen=True)
class Decision:
    hold: bool  # the queue is held (or stays held) after this look
    pause: bool  # pause one catch-up now
    behind: LiveLag | None  # the live version furthest behind, when one was measured

    def reason(self, limit_s: float) -> str | None:
        if self.behind is None or self.behind.lag_seconds is None:
            return None
        return (f"live version {self.behind.job} {self.behind.version} is "
                f"{self.behind.lag_seconds:.1f}s behind (live_lag_protect_s={limit_s:g})")


def acts_at(limit_s: float) -> float:
    """The lag past which a live version holds the queue and pauses catch-ups."""
    return limit_s / 2


def lets_go_at(limit_s: float) -> float:
    """The lag under which every live version must be for the hold to end."""
    return limit_s / 4


def decide(live: Sequence[LiveLag], limit_s: float, *, held: bool,
           since_last_pause_s: float | None, catching_up: int) -> Decision:
    """What one look does. ``held``: the queue is held now; ``since_last_pause_s``: since this
    hold last paused a catch-up (None: it has not); ``catching_up``: catch-ups that could be
    paused."""
    known = [lag for lag in live if lag.lag_seconds is not None]
    if not known:  # nothing measured (or nothing live): a hold stands or ends as it was
        return Decision(hold=held and bool(live), pause=False, behind=None)
    worst = max(known, key=lambda lag: lag.lag_seconds or 0.0)
    behind = worst.lag_seconds or 0.0
    if behind > acts_at(limit_s):
        settled = since_last_pause_s is None or since_last_pause_s >= acts_at(limit_s)
        return Decision(hold=True, pause=catching_up > 0 and settled, behind=worst)
    return Decision(hold=held and behind > lets_go_at(limit_s), pause=False, behind=worst)
