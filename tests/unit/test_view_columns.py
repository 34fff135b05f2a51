"""Which versions one alias view serves together, and which splits are refused (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from orchestrator.errors import ConflictError
from orchestrator.models import DeployedVersion
from orchestrator.serving.columns import change, check_split, fits, shape


def _version(label: str, schema: dict[str, str], keys: tuple[str, ...] = ("user_id",)
             ) -> DeployedVersion:
    from orchestrator.jobspec import load_job_file

    from conftest import ROOT

    spec = load_job_file(ROOT / "jobs" / "user_profiles" / "v1.py")
    spec = replace(spec, version=label, output_schema=tuple(schema.items()), key_columns=keys)
    return DeployedVersion(id=1, spec=spec, output_table=f"t_{label}",
                           dead_letter_table=f"d_{label}", checkpoint_dir="c",
                           consumer_group="g", log_start={},
                           created_at=datetime(2026, 11, 1, tzinfo=UTC))


V1 = {"user_id": "bigint", "plan": "text", "city": "text"}
V2 = {"user_id": "bigint", "plan": "text", "region": "text", "city": "text"}


def test_a_version_that_only_adds_columns_splits_and_fits() -> None:
    v1, v2 = _version("v1", V1), _version("v2", V2)
    assert change(v1, v2).added == ("region",) and not change(v1, v2).removed
    check_split(v1, v2, breaking=False)
    assert fits(v1, v2) and fits(v2, v1)
    # The primary's columns in order, then what the others add.
    assert shape([v1, v2]) == (("user_id", "bigint"), ("plan", "text"), ("city", "text"),
                               ("region", "text"))
    assert shape([v2, v1]) == tuple(V2.items())


def test_removing_or_retyping_a_column_needs_breaking_and_other_keys_never_split() -> None:
    v1, v2 = _version("v1", V1), _version("v2", V2)
    with pytest.raises(ConflictError, match=r"removes column\(s\) region.*--breaking"):
        check_split(v2, v1, breaking=False)
    check_split(v2, v1, breaking=True)
    retyped = _version("v3", {**V1, "plan": "bigint"})
    with pytest.raises(ConflictError, match=r"retyped column.*plan text -> bigint.*--breaking"):
        check_split(v1, retyped, breaking=False)
    check_split(v1, retyped, breaking=True)
    # Not in the view unless it is the candidate of a --breaking split; then its column is
    # text in every branch, whichever version is the primary.
    assert not fits(v1, retyped)
    assert dict(shape([v1, retyped]))["plan"] == "text"
    assert dict(shape([retyped, v1]))["plan"] == "text"
    assert dict(shape([retyped, v2]))["user_id"] == "bigint"
    rekeyed = _version("v4", V1, keys=("plan",))
    with pytest.raises(ConflictError, match="other key columns"):
        check_split(v1, rekeyed, breaking=True)
    assert not fits(v1, rekeyed)
    # A key of another type hashes to other text ('007' against 7): never split.
    key_retyped = _version("v5", {**V1, "user_id": "text"})
    with pytest.raises(ConflictError, match=r"other key columns \(user_id text instead of "
                                            r"user_id bigint\)"):
        check_split(v1, key_retyped, breaking=True)
    assert not fits(v1, key_retyped)


def test_a_retyped_column_is_cast_to_text_only_in_the_branch_that_differs() -> None:
    from orchestrator.serving.views import view_query

    v1 = _version("v1", V1)
    retyped = _version("v3", {**V1, "plan": "bigint"})
    text = view_query("kappa", "data", "user_profiles", [v1, retyped]).as_string(None)
    # Two branches per version: it serves every key; it serves some.
    v1_branches, v3_branches = text.split(" UNION ALL ")[:2], text.split(" UNION ALL ")[2:]
    assert all('"plan"::text' not in b for b in v1_branches), text
    assert all('t."plan"::text AS "plan"' in b for b in v3_branches), text


def test_two_versions_that_add_one_column_with_two_types_never_share_the_view() -> None:
    from orchestrator.serving.switching import Switchboard

    v1 = _version("v1", V1)
    v2, v3 = _version("v2", {**V1, "score": "bigint"}), _version("v3", {**V1, "score": "text"})
    deployed = {"v1": v1, "v2": v2, "v3": v3}
    # Deployed after v2, v3 waits for DDL rather than turn v2's score into text.
    assert Switchboard._branch(v1, deployed, None) == [v1, v2]
    assert dict(shape(Switchboard._branch(v1, deployed, None)))["score"] == "bigint"
    assert Switchboard._branch(v1, deployed, v3) == [v1, v3]
    # A --breaking split keeps its candidate in the view, and only what fits it too.
    retyped = _version("v4", {**V1, "plan": "bigint"})
    assert Switchboard._branch(v1, {**deployed, "v4": retyped}, retyped) == [v1, retyped]
