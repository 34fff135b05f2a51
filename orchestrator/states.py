"""The run state machine: one Enum and one ``transition()``."""

from __future__ import annotations

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
