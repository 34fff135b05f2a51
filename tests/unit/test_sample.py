"""The sample-event generator: deterministic, typed, with ~0.1 % invalid events of each kind.

Events are classified here independently of the generator (stdlib json, own type rules).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import KappaError
from orchestrator.samples.sample import INVALID_KINDS, sample_events
from orchestrator.samples.sample_profiles import COUNTRIES, TAGS, sample_profiles
from orchestrator.samples.sample_profiles import INVALID_KINDS as INVALID_PROFILE_KINDS

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


# The two keywords of sample_events -------------------------------------------------------------

# sha256 over (len(key), key, len(value), value) of the first 5,000 events of seed 1, computed
# with sample_events as it was before `users` and `invalid_share` existed.
PINNED_SHA256 = "7f1b02ee5b653011f87bb69907a3efcb038c221c9a9eb9dc6a5ea2ff90866298"


def _digest(pairs: Iterable[tuple[bytes, bytes | None]]) -> str:
    h = hashlib.sha256()
    for key, value in pairs:
        v = b"" if value is None else value
        h.update(len(key).to_bytes(4, "big") + key + len(v).to_bytes(4, "big") + v)
    return h.hexdigest()


def test_default_output_is_pinned() -> None:
    assert _digest(sample_events(5_000, seed=1)) == PINNED_SHA256
    assert _digest(sample_events(5_000, seed=1, users=5_000, invalid_share=None)) == PINNED_SHA256
    # 0.4 % in all is the default 0.1 % per kind
    assert _digest(sample_events(5_000, seed=1, invalid_share=0.004)) == PINNED_SHA256


@pytest.mark.parametrize("users", [1, 7, 5_000, 123_457, 10_000_000])
def test_users_bounds_the_user_ids(users: int) -> None:
    events = list(sample_events(20_000, seed=3, users=users))
    ids = {int(k) for k, _ in events}
    assert min(ids) >= 1 and max(ids) <= users
    if users <= 7:
        assert ids == set(range(1, users + 1))
    if users >= 123_457:
        assert max(ids) > 5_000
    for (key, value), kind in zip(events, map(classify, (v for _, v in events)), strict=True):
        assert type(key) is bytes and key == str(int(key)).encode()
        if kind == "valid":
            assert json.loads(value)["user_id"] == int(key)


def test_parameters_keep_determinism_and_prefixes() -> None:
    kw: dict[str, Any] = {"users": 50_000, "invalid_share": 0.2}
    assert list(sample_events(3_000, seed=5, **kw)) == list(sample_events(3_000, seed=5, **kw))
    assert list(sample_events(700, seed=5, **kw)) == list(
        islice(sample_events(3_000, seed=5, **kw), 700))
    assert list(sample_events(700, seed=5, **kw)) != list(sample_events(700, seed=5))


def test_invalid_share_is_close_to_the_request() -> None:
    counts = Counter(classify(v) for _, v in sample_events(N, seed=8, invalid_share=0.3))
    assert abs(1 - counts["valid"] / N - 0.3) <= 0.01, counts
    for kind in INVALID_KINDS:
        assert abs(counts[kind] / N - 0.075) <= 0.005, (kind, counts)


def test_invalid_share_zero_gives_only_valid_events() -> None:
    assert {classify(v) for _, v in sample_events(20_000, seed=8, invalid_share=0)} == {"valid"}


@pytest.mark.parametrize("kw", [{"invalid_share": 1.0}, {"invalid_share": -0.01},
                                {"invalid_share": float("nan")}, {"users": 0}, {"users": -3}])
def test_bad_parameters_raise_a_one_line_error_at_the_call(kw: dict[str, Any]) -> None:
    with pytest.raises(KappaError) as info:
        sample_events(10, seed=1, **kw)  # not iterated: raised by the call
    assert "\n" not in str(info.value)


# The profile changelog ------------------------------------------------------------------------
# Classified from the module docstring of orchestrator.samples.sample_profiles, independently.

PROFILE_FIELDS = ["user_id", "plan", "address", "tags", "updated_at"]
PROFILE_KINDS = ("not_json", "missing_field", "wrong_type")
PLANS = {"free", "pro", "team", "enterprise"}
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
P_N = 100_000


def classify_profile(key: bytes, value: bytes | None) -> str:
    """'tombstone', 'valid' or one of the three invalid kinds."""
    if value is None:
        return "tombstone"
    try:
        doc = json.loads(value)
    except ValueError:
        return "not_json"
    if not isinstance(doc, dict):
        return "not_json"
    if any(f not in doc for f in PROFILE_FIELDS):
        return "missing_field"
    address = doc["address"]
    if isinstance(address, dict) and ("country" not in address or "city" not in address):
        return "missing_field"
    if not (_is_int(doc["user_id"]) and isinstance(doc["plan"], str)
            and isinstance(address, dict) and isinstance(address["country"], str)
            and isinstance(address["city"], str) and isinstance(doc["tags"], list)
            and all(isinstance(t, str) for t in doc["tags"])
            and isinstance(doc["updated_at"], str)):
        return "wrong_type"
    return "valid"


@pytest.fixture(scope="module")
def changes() -> list[tuple[bytes, bytes | None]]:
    return list(sample_profiles(P_N, seed=5, invalid_share=0.03))


@pytest.fixture(scope="module")
def change_kinds(changes: list[tuple[bytes, bytes | None]]) -> list[str]:
    return [classify_profile(k, v) for k, v in changes]


def _latest_state(
    pairs: Iterable[tuple[bytes, bytes | None]],
) -> tuple[dict[bytes, dict[str, Any]], Counter[str]]:
    """Apply creates, updates and tombstones in order, skipping invalid events."""
    state: dict[bytes, dict[str, Any]] = {}
    seen: set[bytes] = set()
    ops: Counter[str] = Counter()
    for key, value in pairs:
        kind = classify_profile(key, value)
        if kind == "tombstone":
            assert key in seen, "a tombstone before the user's first profile"
            ops["tombstone"] += 1
            state.pop(key, None)
        elif kind == "valid":
            ops["update" if key in seen else "create"] += 1
            seen.add(key)
            assert value is not None
            state[key] = json.loads(value)
        else:
            ops["invalid"] += 1
    return state, ops


def test_profiles_are_deterministic_and_seeded() -> None:
    assert list(sample_profiles(5_000, seed=7)) == list(sample_profiles(5_000, seed=7))
    assert list(sample_profiles(5_000, seed=7)) != list(sample_profiles(5_000, seed=8))
    assert list(sample_profiles(0, seed=7)) == []


def test_a_shorter_profile_run_is_a_prefix() -> None:
    for kw in ({}, {"users": 300, "invalid_share": 0.1}, {"users": 100_000}):
        longer = list(sample_profiles(8_000, seed=3, **kw))
        # planned for the same stream length: a prefix
        assert list(sample_profiles(1_000, seed=3, horizon=8_000, **kw)) == longer[:1_000]
    # while count <= users every event is a create in both: a plain prefix
    assert list(sample_profiles(1_000, seed=3)) == list(sample_profiles(5_000, seed=3))[:1_000]


def test_valid_profiles_have_exactly_the_documented_shape(
    changes: list[tuple[bytes, bytes | None]], change_kinds: list[str]
) -> None:
    previous = ""
    for (key, value), kind in zip(changes, change_kinds, strict=True):
        assert type(key) is bytes and key.isdigit() and 1 <= int(key) <= 5_000
        assert key == str(int(key)).encode()
        if kind != "valid":
            continue
        assert value is not None
        doc = json.loads(value)
        assert value == json.dumps(doc, separators=(",", ":")).encode()  # compact, plain ASCII
        assert list(doc) == PROFILE_FIELDS
        assert _is_int(doc["user_id"]) and str(doc["user_id"]).encode() == key
        assert doc["plan"] in PLANS
        assert list(doc["address"]) == ["country", "city"]
        assert doc["address"]["country"] in COUNTRIES
        assert doc["address"]["city"] in COUNTRIES[doc["address"]["country"]]
        tags = doc["tags"]
        assert len(tags) <= 3 and len(set(tags)) == len(tags) and set(tags) <= set(TAGS)
        assert tags == sorted(tags, key=TAGS.index)
        assert STAMP.fullmatch(doc["updated_at"])
        assert doc["updated_at"] > previous  # strictly increasing (same-length ISO strings)
        previous = doc["updated_at"]
    assert previous.startswith("2024-")


def test_profile_vocabulary_is_small_and_used(
    changes: list[tuple[bytes, bytes | None]], change_kinds: list[str]
) -> None:
    docs = [json.loads(v) for (_, v), k in zip(changes, change_kinds, strict=True)
            if k == "valid" and v is not None]
    assert {d["plan"] for d in docs} == PLANS
    assert len(COUNTRIES) == 12 and all(2 <= len(c) <= 3 for c in COUNTRIES.values())
    assert {d["address"]["country"] for d in docs} == set(COUNTRIES)
    assert {len(d["tags"]) for d in docs} == {0, 1, 2, 3}
    assert datetime.strptime(docs[0]["updated_at"], "%Y-%m-%dT%H:%M:%S.%fZ").year == 2024


def test_profile_changelog_mixes_creates_updates_and_tombstones(
    changes: list[tuple[bytes, bytes | None]],
) -> None:
    _, ops = _latest_state(changes)
    non_creates = ops["update"] + ops["tombstone"]
    assert 4_500 <= ops["create"] <= 5_000  # ~users/count of the events, ids run out at 5,000
    assert abs(ops["tombstone"] / non_creates - 0.12) <= 0.01, ops
    assert abs(ops["invalid"] / P_N - 0.03) <= 0.003, ops


def test_profile_invalid_kinds_near_the_requested_share(change_kinds: list[str]) -> None:
    counts = Counter(change_kinds)
    assert set(counts) == {"valid", "tombstone", *PROFILE_KINDS}
    assert set(INVALID_PROFILE_KINDS) == set(PROFILE_KINDS)
    for kind in PROFILE_KINDS:
        # expected 1 % = 1,000 of 100k; binomial sd ~31
        assert 850 <= counts[kind] <= 1_150, (kind, counts[kind])
    default = Counter(classify_profile(k, v) for k, v in sample_profiles(P_N, seed=6))
    assert 60 <= sum(default[k] for k in PROFILE_KINDS) <= 140  # default 0.1 %
    assert all(default[k] for k in PROFILE_KINDS)


def test_profile_invalid_events_cover_the_nested_cases(
    changes: list[tuple[bytes, bytes | None]], change_kinds: list[str]
) -> None:
    missing_nested: set[str] = set()
    wrong: set[str] = set()
    for (_, value), kind in zip(changes, change_kinds, strict=True):
        if kind == "missing_field":
            doc = json.loads(value or b"")
            if "address" in doc:
                missing_nested |= {"country", "city"} - set(doc["address"])
        elif kind == "wrong_type":
            doc = json.loads(value or b"")
            wrong.add(f"user_id:{type(doc['user_id']).__name__}")
            wrong.add(f"address:{type(doc['address']).__name__}")
            if isinstance(doc["address"], dict):
                wrong |= {f"{f}:{type(doc['address'][f]).__name__}" for f in ("country", "city")}
            if isinstance(doc["tags"], list):
                wrong |= {f"tag:{type(t).__name__}" for t in doc["tags"]}
    assert missing_nested == {"country", "city"}
    assert {"user_id:str", "address:str", "country:int", "city:int", "tag:int"} <= wrong


def test_profiles_with_as_many_users_as_events_are_all_creates() -> None:
    pairs = list(sample_profiles(20_000, seed=9, users=20_000))
    assert len({k for k, _ in pairs}) == 20_000
    assert {int(k) for k, _ in pairs} == set(range(1, 20_001))
    state, ops = _latest_state(pairs)
    assert ops["update"] == ops["tombstone"] == 0
    assert len(state) == ops["create"] == 20_000 - ops["invalid"]


def test_profile_users_bound_the_keys() -> None:
    for users in (1, 3, 1_000_000):
        ids = {int(k) for k, _ in sample_profiles(5_000, seed=2, users=users)}
        assert min(ids) >= 1 and max(ids) <= users
        if users <= 3:
            assert ids == set(range(1, users + 1))


PINNED_SMALL_STATE = (287, 256)  # (users created, users live at the end) for the case below


def test_latest_state_of_a_small_changelog() -> None:
    pairs = list(sample_profiles(3_000, seed=11, users=300, invalid_share=0.05))
    state, ops = _latest_state(pairs)
    created = {k for k, v in pairs if classify_profile(k, v) == "valid"}
    assert len(created) <= 300 and ops["create"] == len(created)
    # a user is live unless its last valid event is a tombstone: ~12 % of touched users are not
    assert 0.8 * len(created) <= len(state) <= 0.95 * len(created)
    assert all(doc["user_id"] == int(key) for key, doc in state.items())
    assert (len(created), len(state)) == PINNED_SMALL_STATE


@pytest.mark.parametrize("kw", [{"invalid_share": 1.0}, {"invalid_share": -0.5},
                                {"users": 0}, {"horizon": 0}])
def test_bad_profile_parameters_raise_a_one_line_error(kw: dict[str, Any]) -> None:
    with pytest.raises(KappaError) as info:
        sample_profiles(10, seed=1, **kw)
    assert "\n" not in str(info.value)


def test_produce_sample_checks_its_arguments_before_kafka(tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator
    from orchestrator.settings import load_settings

    service = Orchestrator(load_settings(env={}, cwd=tmp_path))
    with pytest.raises(KappaError, match="unknown sample kind 'clicks'"):
        service.produce_sample("t", 10, 1, kind="clicks")
    with pytest.raises(KappaError, match="users"):
        service.produce_sample("profiles", 10, 1, users=0)
    with pytest.raises(KappaError, match="invalid_share"):
        service.produce_sample("pageviews", 10, 1, invalid_share=2.0)
