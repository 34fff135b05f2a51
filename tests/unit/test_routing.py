from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import StateError
from orchestrator.routing import Routing


def test_promote_ab_rollback_story() -> None:
    r = Routing("pv").promote("v1")
    assert (r.primary, r.candidate, r.rollback_to) == ("v1", None, None)
    r = r.ab("v2", 10).ab("v2", 50)
    assert (r.primary, r.candidate, r.percent, r.rollback_to) == ("v1", "v2", 50, "v1")
    r = r.promote("v2")
    assert (r.primary, r.candidate, r.percent, r.rollback_to) == ("v2", None, 0, "v1")
    back = r.rollback()
    assert (back.primary, back.candidate, back.rollback_to) == ("v1", None, None)
    with pytest.raises(StateError, match="nothing to roll back"):
        back.rollback()


def test_rollback_during_ab_returns_to_the_primary() -> None:
    r = Routing("pv").promote("v1").ab("v2", 30)
    assert r.rollback().primary == "v1" and r.rollback().percent == 0


def test_refusals_say_what_to_do() -> None:
    with pytest.raises(StateError, match="promote"):
        Routing("pv").ab("v2", 10)
    r = Routing("pv").promote("v1")
    with pytest.raises(StateError, match="already serves"):
        r.promote("v1")
    with pytest.raises(StateError, match=r"1\.\.99"):
        r.ab("v2", 100)
    with pytest.raises(StateError, match="in progress"):
        r.ab("v2", 10).ab("v3", 10)


@given(st.lists(st.tuples(st.sampled_from(["promote", "ab", "rollback"]),
                          st.sampled_from(["v1", "v2", "v3"]), st.integers(1, 99)), max_size=30))
def test_every_key_is_served_by_exactly_one_version(steps: list[tuple[str, str, int]]) -> None:
    r = Routing("pv").promote("v1")
    for action, version, percent in steps:
        try:
            r = (r.promote(version) if action == "promote" else
                 r.ab(version, percent) if action == "ab" else r.rollback())
        except StateError:
            continue
        assert sum(r.served_fraction(v) for v in ("v1", "v2", "v3")) == 100
        assert r.primary is not None and r.candidate != r.primary
