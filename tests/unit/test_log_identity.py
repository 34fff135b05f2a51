"""Telling the log a version read from the one there now (pure logic)."""

from __future__ import annotations

from orchestrator.log_identity import (
    LogIdentity,
    changes,
    is_log_gone,
    log_gone_reason,
    topic_id_text,
)

READ = LogIdentity("kappa-1", {"pageviews": "id-a", "clicks": "id-b"})


def test_the_same_log_has_no_changes() -> None:
    assert changes(READ, LogIdentity("kappa-1", {"pageviews": "id-a", "clicks": "id-b"}),
                   ["pageviews", "clicks"]) == []


def test_another_cluster_is_one_change_whatever_the_topics_say() -> None:
    (change,) = changes(READ, LogIdentity("kappa-2", {"pageviews": "id-a"}), ["pageviews"])
    assert change.kind == "cluster" and "another cluster" in change.describe()
    assert "kappa-2" in change.describe() and "kappa-1" in change.describe()


def test_a_recreated_or_missing_topic_is_named_and_others_are_not() -> None:
    now = LogIdentity("kappa-1", {"pageviews": "id-c"}, missing=("clicks",))
    found = changes(READ, now, ["pageviews", "clicks"])
    assert [(c.kind, c.topic) for c in found] == [("recreated", "pageviews"), ("gone", "clicks")]
    assert changes(READ, now, ["other"]) == []  # a topic the version does not read
    reason = log_gone_reason(found, "pageview_counts", "v2")
    assert "topic pageviews was deleted and recreated" in reason
    assert "topic clicks no longer exists" in reason
    assert "new VERSION" in reason and "--allow-gap" not in reason  # nothing to go on from
    assert is_log_gone(reason)
    recreated = log_gone_reason(found[:1], "pageview_counts", "v2")
    assert "--allow-gap pageview_counts v2" in recreated and is_log_gone(recreated)
    assert not is_log_gone("driver process 12 is gone") and not is_log_gone(None)


def test_missing_ids_are_no_evidence() -> None:
    # A broker without cluster or topic ids (it answers a zero id), or a topic not asked about.
    assert changes(READ, LogIdentity(None, {"pageviews": None}), ["pageviews"]) == []
    assert changes(READ, LogIdentity(None, {"pageviews": None}), ["clicks"]) == []
    assert changes(LogIdentity(None, {"pageviews": None}), LogIdentity("x", {"pageviews": "y"}),
                   ["pageviews"]) == []
    assert topic_id_text("AAAAAAAAAAAAAAAAAAAAAA") is None and topic_id_text("abc") == "abc"


def test_identity_round_trips_through_json() -> None:
    assert LogIdentity.from_json(READ.to_json()) == READ
    gone = LogIdentity("kappa-1", {}, missing=("clicks",))
    assert LogIdentity.from_json(gone.to_json()) == gone
    assert LogIdentity.from_json(None) is None
