"""One alias switch (promote, A/B step, rollback) in two round trips to PostgreSQL.

1. ``BEGIN``, the alias's routing row locked ``FOR UPDATE`` (so two switches of one alias run
   one after the other), and every fact the gates need, in one pipeline (serving/switch_io.py).
2. The gates judged here, against the routing just locked; then the routing row, its history
   and its event written by one statement, pipelined with ``COMMIT``.

A version's lag comes from the newest lag sample of its current run when it is fresh (`kappa
agent` and `kappa lag` take them). Where a promote or an A/B step finds none, it lets the lock
go, asks the broker (which may take seconds), and locks and judges again: no lock is ever held
across a broker round trip. A switch whose versions already have branches in the alias view
runs no DDL; one that needs a branch defines the view in between, under the same lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from orchestrator.catalog import aliases
from orchestrator.catalog.events import actor
from orchestrator.errors import LagRefusedError, StateError
from orchestrator.models import DeployedVersion
from orchestrator.routing import Routing
from orchestrator.serving import switch_io
from orchestrator.serving.switch_gates import (
    SwitchFacts,
    lag_problems,
    rollback_problem,
    state_problems,
    validation_problems,
)
from orchestrator.settings import Settings
from orchestrator.states import RunState


class Switchboard(Protocol):
    """What a switch needs of the switchboard (serving/switching.py) that runs it."""

    s: Settings
    conn: psycopg.Connection

    def measure_now(self, version: DeployedVersion, /) -> int | None: ...

    def prepare_view(self, job: str, alias: str, before: Routing, after: Routing,
                     view_versions: list[str],
                     live: dict[str, DeployedVersion] | None = None) -> list[str] | None: ...

NEEDS_REASON = "--force needs --reason TEXT, which is recorded in the history"


@dataclass(frozen=True)
class SwitchLag:
    """A version's lag as a switch judges and records it, and where the figure came from:
    ``sample`` (the latest lag sample of the current run), ``broker`` (measured for this switch,
    before any lock) or ``none`` (neither: a rollback never waits for the broker)."""

    records: int | None
    source: str
    age_s: float | None = None


@dataclass(frozen=True)
class SwitchRequest:
    job: str
    alias: str
    action: str  # "promote", "ab" or "rollback"
    target: str | None  # the version promoted or split to (None: a rollback)
    change: Callable[[Routing], Routing]
    refuse: str  # how a refusal of a promote or A/B step begins
    force: bool
    reason: str | None
    abandon: str | None = None  # a rollback: the reason its running cutover plan stops


def run_switch(board: Switchboard, request: SwitchRequest) -> dict[str, Any]:
    """Switch the alias, or raise StateError saying why not and what to run."""
    s, conn = board.s, board.conn
    measured: dict[str, SwitchLag] = {}
    refused = False  # the target's own measurement refuses it: ask for nothing more
    while True:
        with switch_io.switch_transaction(conn):
            facts = switch_io.read_locked(
                conn, s.catalog_schema, request.job, request.alias,
                active=[state.value for state in RunState if state.is_active],
                max_age_s=s.lag_sample_max_age_s)
            if request.target is not None:
                facts.version(request.target)  # NotFoundError for an unknown job or version
            # A sample that was fresh at the last look may have aged out while the broker
            # answered for another version: it is asked for too. Each version is asked at
            # most once, so this ends.
            wanted = set() if refused else _broker_lags_wanted(board, request, facts, measured)
            if not wanted:
                return _switch_locked(board, request, facts, measured)
        # The lock is released (rolled back): the broker's answer may take seconds. The
        # target first: where its lag refuses the switch, the others need not be asked.
        for name in sorted(wanted, key=lambda n: (n != request.target, n)):
            lag = SwitchLag(board.measure_now(facts.deployed[name]), "broker")
            measured[name] = lag
            if name == request.target and not request.force and (
                    lag.records is None or lag.records > s.max_lag_records):
                refused = True
                break


def _involved(routing: Routing | None, target: str | None) -> set[str]:
    names = {v for v in (routing.primary, routing.candidate, routing.rollback_to) if v} \
        if routing else set()
    return names | ({target} if target else set())


def _broker_lags_wanted(board: Switchboard, request: SwitchRequest, facts: SwitchFacts,
                        measured: dict[str, SwitchLag]) -> set[str]:
    """The versions whose lag a promote or A/B step must ask the broker for: those without a
    fresh sample, and a target whose sample is too far behind (only a measurement now may
    refuse it: it may have caught up since)."""
    if request.action == "rollback":
        return set()  # a rollback never waits for the broker
    wanted = set()
    for name in _involved(facts.routing, request.target) - set(measured):
        v = facts.versions.get(name)
        if v is None:
            continue
        behind = name == request.target and not state_problems(facts.job, v) and \
            (v.sample_lag or 0) > board.s.max_lag_records
        if v.sample_lag is None or behind:
            wanted.add(name)
    return wanted


def _lag(facts: SwitchFacts, measured: dict[str, SwitchLag], name: str) -> SwitchLag:
    if name in measured:
        return measured[name]
    v = facts.versions.get(name)
    if v is not None and v.sample_lag is not None:
        return SwitchLag(v.sample_lag, "sample", v.sample_age_s)
    return SwitchLag(None, "none")


def _switch_locked(board: Switchboard, request: SwitchRequest, facts: SwitchFacts,
                   measured: dict[str, SwitchLag]) -> dict[str, Any]:
    s, conn, job, name = board.s, board.conn, request.job, request.alias
    if facts.routing is not None:
        before, view_versions = facts.routing, list(facts.view_versions)
    elif request.action == "promote":
        aliases.create(conn, s.catalog_schema, name, job, s.serving_schema)
        locked = aliases.lock(conn, s.catalog_schema, name)
        assert locked is not None
        before, view_versions = locked
    else:
        raise StateError(f"alias {name} does not exist yet: `kappa promote {job} VERSION` "
                         "creates it")
    forced = _judge(board, request, facts, before, measured)
    after = request.change(before)
    new_view = board.prepare_view(job, name, before, after, view_versions, facts.live)
    lag = {v: _lag(facts, measured, v) for v in
           _involved(before, request.target) | after.serves()}
    target = request.target
    switch_io.write(conn, s.catalog_schema, job=job, actor=actor(), action=request.action,
                    before=before, after=after, view_versions=new_view,
                    reason=request.reason, forced=forced,
                    lag={v: x.records for v, x in lag.items()},
                    lag_from={v: x.source for v, x in lag.items()},
                    version=target if target else after.primary, abandon=request.abandon)
    return {"alias": f"{s.serving_schema}.{name}", "primary": after.primary,
            "candidate": after.candidate, "percent": after.percent,
            "rollback_to": after.rollback_to, "view_redefined": new_view is not None}


def _judge(board: Switchboard, request: SwitchRequest, facts: SwitchFacts, before: Routing,
           measured: dict[str, SwitchLag]) -> bool:
    """The gates, against the routing locked; whether the switch goes ahead by --force."""
    job = request.job
    if request.target is None:
        problem = rollback_problem(facts, board.s.serving_schema, before)
        if problem and not request.force:
            raise StateError(f"refusing to roll back: {problem}; or override with --force "
                             "--reason TEXT")
        problems = [problem] if problem else []
    else:
        target = facts.version(request.target)
        problems = state_problems(job, target)
        behind = [] if problems else lag_problems(
            job, target, _lag(facts, measured, target.version).records, board.s.max_lag_records)
        problems += behind + validation_problems(facts, target, before.primary)
        if problems and not request.force:
            override = "; or override with --force --reason TEXT" \
                if request.action == "promote" else ""
            refusal = LagRefusedError if problems == behind else StateError
            raise refusal(f"{request.refuse}: {'; '.join(problems)}{override}")
    if problems and not request.reason:
        raise StateError(NEEDS_REASON)
    return bool(problems)
