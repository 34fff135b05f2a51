"""The archiver's watch of the log ends: which ends it notes, as pure logic (the broker's
answers and the catalog's writes are stood in for; test_archived_stack runs it for real)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest

from orchestrator.archive import end_watch
from orchestrator.archive.end_watch import LogEndWatch, WatchedLog
from orchestrator.archive_model.segments import Lineage
from orchestrator.log_identity import LogIdentity

ROOT = Lineage("cluster", "pageviews", "old-id")
RESTORED = Lineage("cluster", "pageviews", "restored-id")
Noted = list[tuple[Lineage, dict[int, int]]]


class _Clients:
    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends

    def bounds(self, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
        return {(t, p): (0, e) for t in topics for p, e in self.ends.items()}


class _Conn:
    def transaction(self) -> Any:
        return nullcontext()


@pytest.fixture
def noted(monkeypatch: pytest.MonkeyPatch) -> Noted:
    calls: Noted = []
    monkeypatch.setattr("orchestrator.catalog.archive_manifest.note_log_ends",
                        lambda conn, schema, root, ends: calls.append((root, dict(ends))))
    return calls


def _identity(monkeypatch: pytest.MonkeyPatch, topic_id: str | None) -> None:
    monkeypatch.setattr(end_watch, "log_identity", lambda kafka, topics, admin: LogIdentity(
        cluster_id="cluster", topics={"pageviews": topic_id}))


def _note(watch: LogEndWatch, clients: _Clients, seen: dict[tuple[str, int], int]) -> None:
    watch._note(_Conn(), clients, None, {"pageviews": WatchedLog(ROOT, RESTORED)}, seen)  # type: ignore[arg-type]


def test_ends_go_to_the_root_lineage_and_only_when_they_moved(
        monkeypatch: pytest.MonkeyPatch, noted: Noted) -> None:
    _identity(monkeypatch, "restored-id")
    watch = LogEndWatch("127.0.0.1:1", lambda: None, "kappa")  # type: ignore[arg-type,return-value]
    seen: dict[tuple[str, int], int] = {}
    clients = _Clients({0: 10, 1: 20})
    _note(watch, clients, seen)
    _note(watch, clients, seen)  # nothing moved: no write
    clients.ends[1] = 25
    _note(watch, clients, seen)
    assert noted == [(ROOT, {0: 10, 1: 20}), (ROOT, {1: 25})]


@pytest.mark.parametrize("topic_id", ["recreated-id", None])
def test_ends_of_a_topic_recreated_or_deleted_since_the_pass_are_not_the_roots(
        monkeypatch: pytest.MonkeyPatch, noted: Noted, topic_id: str | None) -> None:
    _identity(monkeypatch, topic_id)
    watch = LogEndWatch("127.0.0.1:1", lambda: None, "kappa")  # type: ignore[arg-type,return-value]
    _note(watch, _Clients({0: 10}), {})
    assert noted == []
