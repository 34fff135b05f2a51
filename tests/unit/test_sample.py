"""The sample-event generator: deterministic, typed, with ~0.1 % invalid events of each kind.

Events are classified here independently of the generator (stdlib json, own type rules).
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from typing import Any

import pytest

from orchestrator.sample import INVALID_KINDS, sample_events

FIELDS = ("user_id", "url", "ts", "duration_ms")
N = 100_000


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def classify(value: bytes) -> str:
    """'valid' or one of INVALID_KINDS, by the rules the jobs' validation applies."""
    try:
        doc = json.loads(value)
    except ValueError:  # includes UnicodeDecodeError
        return "not_json"
    if not isinstance(doc, dict):
        return "not_json"
    if any(f not in doc for f in FIELDS):
        return "missing_field"
    if not (_is_int(doc["user_id"]) and isinstance(doc["url"], str) and _is_int(doc["ts"])
            and _is_int(doc["duration_ms"])):
        return "wrong_type"
    if doc["duration_ms"] < 0:
        return "negative_duration"
    return "valid"


@pytest.fixture(scope="module")
def events() -> list[tuple[bytes, bytes]]:
    return list(sample_events(N, seed=42))


@pytest.fixture(scope="module")
def kinds(events: list[tuple[bytes, bytes]]) -> list[str]:
    return [classify(v) for _, v in events]


def test_count_and_pair_types(events: list[tuple[bytes, bytes]]) -> None:
    assert len(events) == N
    assert all(type(k) is bytes and type(v) is bytes for k, v in events)
    assert list(sample_events(0, seed=1)) == []


def test_deterministic_across_calls() -> None:
    assert list(sample_events(5_000, seed=7)) == list(sample_events(5_000, seed=7))


def test_shorter_run_is_a_prefix() -> None:
    assert list(sample_events(500, seed=9)) == list(islice(sample_events(5_000, seed=9), 500))


def test_different_seeds_differ() -> None:
    a = list(sample_events(1_000, seed=1))
    b = list(sample_events(1_000, seed=2))
    assert a != b
    assert sum(x != y for x, y in zip(a, b, strict=True)) > 900


def test_invalid_kinds_constant() -> None:
    assert set(INVALID_KINDS) == {"not_json", "missing_field", "wrong_type", "negative_duration"}
    assert len(INVALID_KINDS) == 4


def test_invalid_fraction_per_kind(kinds: list[str]) -> None:
    counts = Counter(kinds)
    assert set(counts) == {"valid", *INVALID_KINDS}
    for kind in INVALID_KINDS:
        # expected 0.1 % = 100 of 100k; binomial sd ~10
        assert 50 <= counts[kind] <= 150, (kind, counts[kind])
    assert counts["valid"] >= N * 0.99


def test_valid_events_have_the_right_types(
    events: list[tuple[bytes, bytes]], kinds: list[str]
) -> None:
    previous_ts = None
    for (key, value), kind in zip(events, kinds, strict=True):
        if kind != "valid":
            continue
        doc = json.loads(value)
        assert set(doc) == set(FIELDS)
        assert _is_int(doc["user_id"]) and doc["user_id"] > 0
        assert key == str(doc["user_id"]).encode()
        assert isinstance(doc["url"], str) and doc["url"].startswith("/") and doc["url"].isascii()
        assert _is_int(doc["ts"]) and _is_int(doc["duration_ms"]) and doc["duration_ms"] >= 0
        if previous_ts is not None:
            assert doc["ts"] >= previous_ts  # base epoch + increments
        previous_ts = doc["ts"]


def test_timestamps_are_not_wall_clock(events: list[tuple[bytes, bytes]]) -> None:
    first = json.loads(events[0][1])["ts"]
    assert first == json.loads(next(sample_events(1, seed=42))[1])["ts"]
    assert 1_600_000_000_000 < first < 1_800_000_000_000


def test_invalid_events_keep_a_user_key(
    events: list[tuple[bytes, bytes]], kinds: list[str]
) -> None:
    for (key, _), kind in zip(events, kinds, strict=True):
        if kind != "valid":
            assert key.isdigit()


def test_wrong_types_cover_the_tricky_cases(
    events: list[tuple[bytes, bytes]], kinds: list[str]
) -> None:
    seen = set()
    for (_, value), kind in zip(events, kinds, strict=True):
        if kind != "wrong_type":
            continue
        doc = json.loads(value)
        for f in FIELDS:
            seen.add((f, type(doc[f]).__name__))
    assert {("user_id", "str"), ("user_id", "bool"), ("duration_ms", "float"),
            ("duration_ms", "str"), ("url", "int")} <= seen


def test_urls_need_normalising(events: list[tuple[bytes, bytes]], kinds: list[str]) -> None:
    urls = {json.loads(v)["url"] for (_, v), k in zip(events, kinds, strict=True) if k == "valid"}
    assert 100 <= len(urls) <= 1_000
    assert "/" in urls
    assert any(u.startswith("/?") for u in urls)
    assert any("?" in u and not u.startswith("/?") for u in urls)
    assert any("#" in u for u in urls)
    assert any(len(u) > 1 and u.endswith("/") for u in urls)
    assert any(u != u.lower() for u in urls)
    assert all(u.isascii() for u in urls)
