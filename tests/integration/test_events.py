"""The event log lists the newest events first, and stays bounded at `events_kept`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import kappa_cli

pytestmark = [pytest.mark.integration]


def test_events_are_listed_newest_first_and_pruned_to_events_kept(settings) -> None:
    from orchestrator.catalog import events
    from orchestrator.service import Orchestrator

    service = Orchestrator(replace(settings, events_kept=10))
    for n in range(30):
        service.record_event("note", "some_job", "v1", n=n)
    listed = service.events("some_job", limit=5)
    assert [e["detail"]["n"] for e in listed] == [29, 28, 27, 26, 25]
    shown = kappa_cli(settings, "events", "some_job", "--limit", "3", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [e["detail"]["n"] for e in json.loads(shown.stdout)] == [29, 28, 27]

    with service._catalog() as conn:
        assert events.prune(conn, settings.catalog_schema, 10) == 20
        assert events.prune(conn, settings.catalog_schema, 10) == 0
    assert [e["detail"]["n"] for e in service.events()] == list(range(29, 19, -1))
