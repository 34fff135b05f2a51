"""The run state machine: one Enum and one ``transition()``, and the one guard that every
change of a run's state passes (``Expected``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator.errors import StateError


class RunState(StrEnum):
    REGISTERED = "registered"  # deployed, table created, no driver started yet
    QUEUED = "queued"  # waiting for a replay slot (replay_slots); the agent starts it
    STARTING = "starting"  # driver process launched, Spark not yet reading
    REPLAYING = "replaying"  # reading the log from the beginning (catch-up profile)
    CAUGHT_UP = "caught_up"  # reached the log end; switching to the live profile
    LIVE = "live"  # streaming new events as they arrive
    STOPPED = "stopped"  # stopped on purpose; `kappa restart` resumes from the checkpoint
    FAILED = "failed"  # the driver died or raised; `kappa restart` resumes
    RETIRED = "retired"  # final

    @property
    def is_active(self) -> bool:
        """A driver is supposed to be running in this state."""
        return self in _ACTIVE


_ACTIVE = frozenset({RunState.STARTING, RunState.REPLAYING, RunState.CAUGHT_UP, RunState.LIVE})



@dataclass(frozen=True)
class Expected:
    """What a change of a run's state was decided on: the attempt, and the states the run may
    still be in. A run that has moved since (a restart took a new attempt; a stop, a pause or
    a failure changed its state) is left as it is: the decision was made on a run that is no
    more, and whoever made it must look again, or, for a driver, stop."""

    attempt: int
    states: frozenset[RunState]

    @classmethod
    def seen(cls, attempt: int, state: RunState) -> Expected:
        """The run exactly as it was read (under its lock, or judged from that reading)."""
        return cls(attempt, frozenset({state}))

    @classmethod
    def driver(cls, attempt: int) -> Expected:
        """A driver's own changes: its attempt, while a driver is supposed to run. A stop or a
        pause from another host reaches a remote driver only through this."""
        return cls(attempt, _ACTIVE)

    def admits(self, attempt: int, state: RunState) -> bool:
        return attempt == self.attempt and state in self.states


ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.REGISTERED: frozenset({RunState.QUEUED, RunState.STARTING, RunState.RETIRED}),
    RunState.QUEUED: frozenset({RunState.STARTING, RunState.STOPPED, RunState.FAILED,
                                RunState.RETIRED}),
    # Back to the queue: the process that took its slot died before it launched the driver.
    RunState.STARTING: frozenset({RunState.REPLAYING, RunState.STOPPED, RunState.FAILED,
                                  RunState.QUEUED}),
    # Back to the queue, too: paused by live first (a live version too far behind).
    RunState.REPLAYING: frozenset({RunState.CAUGHT_UP, RunState.STOPPED, RunState.FAILED,
                                   RunState.QUEUED}),
    RunState.CAUGHT_UP: frozenset({RunState.LIVE, RunState.STOPPED, RunState.FAILED}),
    RunState.LIVE: frozenset({RunState.STOPPED, RunState.FAILED}),
    # A stopped version fails when the log it read changes under it (a topic recreated). A
    # restart of a catch-up over the replay budget queues it.
    RunState.STOPPED: frozenset({RunState.STARTING, RunState.FAILED, RunState.RETIRED,
                                 RunState.QUEUED}),
    RunState.FAILED: frozenset({RunState.STARTING, RunState.STOPPED, RunState.RETIRED,
                                RunState.QUEUED}),
    RunState.RETIRED: frozenset(),
}

_NEXT_STEP = {
    RunState.REGISTERED: "run `kappa restart JOB VERSION` to start it",
    RunState.QUEUED: "it starts when a replay slot frees (`kappa queue`); to start it sooner, "
                     "raise the budget for one command: `KAPPA_REPLAY_SLOTS=N kappa restart "
                     "JOB VERSION`",
    RunState.STOPPED: "run `kappa restart JOB VERSION` to resume it",
    RunState.FAILED: "run `kappa restart JOB VERSION` to resume it",
    RunState.RETIRED: "deploy a new version instead",
}


def transition(current: RunState, target: RunState) -> RunState:
    """Return ``target`` if the state machine allows ``current -> target``, else raise."""
    if target not in ALLOWED[current]:
        allowed = ", ".join(sorted(s.value for s in ALLOWED[current])) or "none"
        hint = _NEXT_STEP.get(current, "check `kappa status`")
        raise StateError(
            f"cannot go from {current.value} to {target.value} (allowed: {allowed}); {hint}"
        )
    return target
