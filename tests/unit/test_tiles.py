"""The tile arithmetic of a batch phase (orchestrator/tiles.py, #60)."""

from __future__ import annotations

from orchestrator.tiles import (
    TILE_TARGET_S,
    Tile,
    next_tile,
    next_tile_records,
    past_the_log_end,
)

BOUNDS = {("t", 0): (0, 5_000), ("t", 1): (0, 1_000), ("u", 0): (0, 4_000)}


def test_a_tile_takes_at_most_its_records_shared_by_what_each_partition_has_left() -> None:
    start = {"t": {"0": 1_000, "1": 1_000}, "u": {"0": 0}}
    tile = next_tile(7, start, BOUNDS, 4_000)
    assert tile.batch_id == 7 and tile.start == start
    assert tile.records == 4_000
    assert tile.end["t"]["1"] == 1_000  # nothing left there
    assert tile.end == {"t": {"0": 3_000, "1": 1_000}, "u": {"0": 2_000}}
    whole = next_tile(7, start, BOUNDS, 10**9)
    assert whole.end == {"t": {"0": 5_000, "1": 1_000}, "u": {"0": 4_000}}
    assert next_tile(8, whole.end, BOUNDS, 4_000).records == 0  # the log end: no tile


def test_a_partition_the_start_does_not_know_enters_at_its_log_start_with_no_records() -> None:
    tile = next_tile(0, {"t": {"0": 0}}, {("t", 0): (0, 100), ("t", 1): (40, 90)}, 1_000)
    assert tile.end == {"t": {"0": 100, "1": 40}} and tile.records == 100


def test_a_plan_past_what_the_log_holds_now_is_named_partition_by_partition() -> None:
    tile = Tile(3, {"t": {"0": 0, "1": 0}}, {"t": {"0": 6_000, "1": 900}})
    assert past_the_log_end(tile.end, BOUNDS) == {"t/0": (6_000, 5_000)}
    assert past_the_log_end({"t": {"0": 5_000}}, BOUNDS) == {}


def test_the_next_tile_takes_about_the_target_time_at_the_last_ones_rate() -> None:
    assert next_tile_records(100_000, 20.0, least=1_000, most=10**7) == \
        int(100_000 / 20.0 * TILE_TARGET_S)
    assert next_tile_records(100_000, 0.001, least=1_000, most=200_000) == 200_000
    assert next_tile_records(10, 60.0, least=1_000, most=200_000) == 1_000
    assert next_tile_records(0, 0.0, least=1_000, most=200_000) == 200_000  # not timed yet
