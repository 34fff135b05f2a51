"""`kappa archive status`: each partition's retention risk, in the table and in --json."""

from __future__ import annotations

import argparse
import json

import pytest

from orchestrator.archive_model.segments import PartitionArchive
from orchestrator.cli.archive import run_archive

ROWS = (
    PartitionArchive("pageviews", 0, "c-t2", True, 0, 1_000, 1, 1_000, 0, 10, 500, 1_200),
    PartitionArchive("pageviews", 1, "c-t2", True, 0, 1_000, 1, 1_000, 0, 10, 950, 2_000),
    PartitionArchive("pageviews", 2, "c-t2", True, 0, 1_000, 1, 1_000, 0, 10, 1_400, 2_000),
    PartitionArchive("pageviews", 3, "c-t2", True, 0, 1_000, 1, 1_000, 0, 10, None, None),
    PartitionArchive("pageviews", 0, "c-t1", False, 0, 50, 1, 50, 0, 10, None, None),
)


class _Service:
    def archive_status(self, topics: list[str]) -> tuple[PartitionArchive, ...]:
        return ROWS

    def archive_decodings(self) -> list[object]:
        return []


def _status(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    args = argparse.Namespace(action="status", topics=[], json="--json" in flags)
    assert run_archive(_Service(), args) == 0
    return capsys.readouterr().out


def test_the_table_says_ok_at_risk_with_what_is_left_and_lost_with_what_went(
        capsys: pytest.CaptureFixture[str]) -> None:
    header, *lines = _status(capsys).splitlines()
    at = header.index("RETENTION")
    cells = [line[at:].split("  ")[0] for line in lines]
    assert cells == ["ok", "at_risk (50 left)", "lost (400 records)", "unknown", "-"]


def test_json_gives_the_state_and_the_headroom_or_null(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = json.loads(_status(capsys, "--json"))
    assert [(r["retention"], r["retention_headroom"]) for r in rows] == [
        ("ok", 500), ("at_risk", 50), ("lost", -400), (None, None), (None, None)]
    assert rows[1]["retention_headroom_share"] == pytest.approx(50 / 1_050)
