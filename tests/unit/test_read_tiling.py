"""The commit's choice of staged read tasks (catalog/read_accounting.tiling): whatever cuts the
attempts of a batch made, the tasks counted tile its range, each offset once (#60)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.catalog.read_accounting import Staged, tiling

LO, HI = 100, 1_100


@st.composite
def cuts(draw: st.DrawFn) -> list[Staged]:
    """One attempt's read tasks over [LO, HI): a random cut, its tasks in some order."""
    inner = sorted(draw(st.sets(st.integers(LO + 1, HI - 1), max_size=12)))
    bounds = [LO, *inner, HI]
    return [(a, b, b - a, 0, 0) for a, b in pairwise(bounds)]


def _covered(tasks: list[Staged]) -> list[tuple[int, int]]:
    return [(first, end) for first, end, *_ in tasks]


@given(st.lists(cuts(), min_size=1, max_size=3), st.lists(cuts(), max_size=3),
       st.randoms(use_true_random=False))
def test_whole_attempts_among_partial_ones_give_a_tiling(
        whole: list[list[Staged]], partial: list[list[Staged]], rng: object) -> None:
    staged = [task for cut in whole for task in cut]
    for cut in partial:  # crashed attempts, cut otherwise, that staged some of their tasks
        staged += rng.sample(cut, rng.randrange(len(cut)))  # type: ignore[attr-defined]
    rng.shuffle(staged)  # type: ignore[attr-defined]
    spans = _covered(tiling(LO, HI, staged))
    assert spans[0][0] == LO and spans[-1][1] == HI
    assert all(a[1] == b[0] for a, b in pairwise(spans))


@given(cuts(), st.integers(1, 12))
def test_without_a_tiling_the_tasks_counted_never_overlap(cut: list[Staged], drop: int) -> None:
    if len(cut) < 2:
        return
    staged = [t for n, t in enumerate(cut) if n != drop % len(cut)]  # one task never staged
    spans = _covered(tiling(LO, HI, staged))
    assert all(a[1] <= b[0] for a, b in pairwise(spans))
    assert sum(b - a for a, b in spans) == sum(t[1] - t[0] for t in staged)
