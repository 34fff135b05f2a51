"""Live first (pure): while versions catch up, the live versions that readers depend on come
first.

A live version more than ``live_lag_protect_s`` behind (the age of its oldest unread record)
holds the replay queue, so that no catch-up starts, and pauses the lowest-priority catch-up.
It pauses one more each ``live_lag_protect_s`` for as long as it stays behind, since a pause
takes a while to show in the live version's lag. The hold ends once every live version is back
under half the limit, so that a live version hovering at the limit does not pause and resume
the same catch-up over and over. A lag that was not measured decides nothing."""

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
    if behind > limit_s:
        settled = since_last_pause_s is None or since_last_pause_s >= limit_s
        return Decision(hold=True, pause=catching_up > 0 and settled, behind=worst)
    return Decision(hold=held and behind > limit_s / 2, pause=False, behind=worst)
