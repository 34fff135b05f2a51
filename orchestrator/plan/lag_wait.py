"""A plan's switch that its version's lag refused, tried again for a while.

A promote or an A/B step of a plan is refused when the version's lag cannot be measured now (a
broker that did not answer in time) or is above ``max_lag_records``. Both may pass seconds later,
and a plan that rolled back for them would throw away its soaks, or an outcome test that has
decided. So a plan tries the switch again every few seconds, saying why, for up to
``LAG_WAIT_S``; any other refusal fails the step at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from orchestrator.errors import LagRefusedError

LAG_WAIT_S = 60.0
RETRY_S = 2.0
T = TypeVar("T")


def switch_when_lag_allows(switch: Callable[[], T], say: Callable[[str], None], *,
                           wait_s: float = LAG_WAIT_S, retry_s: float = RETRY_S,
                           clock: Callable[[], float] = time.monotonic,
                           sleep: Callable[[float], None] = time.sleep) -> T:
    """``switch()``, tried again while its version's lag refuses it, for up to ``wait_s``."""
    deadline = clock() + wait_s
    while True:
        try:
            return switch()
        except LagRefusedError as exc:
            left = deadline - clock()
            if left <= 0:
                raise
            say(f"{exc}; trying again for up to {left:.0f} s")
            sleep(min(retry_s, left))
