from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import (
    InvalidNameError,
    JobFileError,
    KappaError,
    LogGapError,
    StateError,
)
from orchestrator.jobspec import load_job_file, parse_job_source
from orchestrator.lag import (
    MIN_CHUNK_RECORDS,
    chunk_size,
    lag_records,
    replay_start,
    split_range,
    take_records,
)
from orchestrator.naming import dead_letter_table, output_table, validate_name
from orchestrator.parsing import EventParser
from orchestrator.states import ALLOWED, RunState, transition

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["a", "pageview_counts", "v2", "a" * 41, "x_1"])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "1a", "_a", "a" * 42, "a-b", "a;drop", 'a"', "a__b",
                                  "ä", "a b"])
def test_invalid_names_get_one_line_errors(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name(name, "version")
    assert "\n" not in str(info.value) and "version" in str(info.value)


def test_table_names() -> None:
    assert output_table("pageview_counts", "v2") == "pageview_counts__v2"
    assert dead_letter_table("pageview_counts", "v2") == "pageview_counts__v2__dead_letters"
    with pytest.raises(InvalidNameError):
        dead_letter_table("a" * 41, "b" * 41)


@given(st.sampled_from(list(RunState)), st.sampled_from(list(RunState)))
def test_transition_allows_exactly_the_table(current: RunState, target: RunState) -> None:
    if target in ALLOWED[current]:
        assert transition(current, target) is target
    else:
        with pytest.raises(StateError) as info:
            transition(current, target)
        assert current.value in str(info.value) and target.value in str(info.value)


def test_retired_is_final() -> None:
    assert not ALLOWED[RunState.RETIRED]


@given(st.integers(0, 10**12), st.integers(0, 5000), st.integers(1, 10**5))
def test_split_range_covers_exactly(start: int, length: int, chunk: int) -> None:
    chunks = split_range(start, start + length, chunk)
    covered = [o for lo, hi in chunks for o in (lo, hi)]
    if length == 0:
        assert chunks == []
        return
    assert chunks[0][0] == start and chunks[-1][1] == start + length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert all(0 < hi - lo <= chunk for lo, hi in chunks)
    assert covered == sorted(covered)


@given(st.integers(0, 10**8), st.integers(1, 256), st.integers(1, 10**6))
def test_chunks_give_every_core_a_task_within_bounds(batch: int, cores: int, cap: int) -> None:
    chunk = chunk_size(batch, cores, cap)
    assert 1 <= chunk <= cap
    if chunk < cap and chunk > MIN_CHUNK_RECORDS:
        assert -(-batch // chunk) >= cores  # enough tasks for every core
    if batch >= cores * MIN_CHUNK_RECORDS and cap >= MIN_CHUNK_RECORDS:
        assert -(-batch // chunk) >= cores


@given(st.dictionaries(st.sampled_from(["0", "1", "2", "3"]),
                       st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
       st.one_of(st.none(), st.integers(0, 3000)))
def test_take_records_respects_limit(parts: dict[str, tuple[int, int]], limit: int | None
                                     ) -> None:
    start = {"t": {p: lo for p, (lo, _) in parts.items()}}
    ends = {"t": {p: lo + n for p, (lo, n) in parts.items()}}
    taken = take_records(start, ends, limit)
    total = sum(n for _, n in parts.values())
    got = sum(taken["t"][p] - start["t"][p] for p in parts)
    assert got == (total if limit is None else min(total, limit))
    assert all(start["t"][p] <= taken["t"][p] <= ends["t"][p] for p in parts)


def test_lag_records() -> None:
    assert lag_records({"t": {"0": 5, "1": 10}}, {("t", 0): 8, ("t", 1): 10, ("t", 2): 4}) == 7


def test_event_parser_routes_every_kind_of_bad_event() -> None:
    parser = EventParser([("user_id", "long"), ("url", "string"), ("ts", "long"),
                          ("duration_ms", "long")], ["duration_ms"])
    good = b'{"user_id": 1, "url": "/A?x", "ts": 5, "duration_ms": 0}'
    assert parser.parse(good) == ((1, "/A?x", 5, 0), None)
    bad = {
        b"not json": "not JSON",
        b"[1]": "not a JSON object",
        b'{"user_id": 1, "url": "/", "ts": 5}': "missing field duration_ms",
        b'{"user_id": "1", "url": "/", "ts": 5, "duration_ms": 1}': "user_id is not a long",
        b'{"user_id": true, "url": "/", "ts": 5, "duration_ms": 1}': "user_id is not a long",
        b'{"user_id": 1, "url": "/", "ts": 5, "duration_ms": 1.5}': "duration_ms is not a long",
        b'{"user_id": 1, "url": 3, "ts": 5, "duration_ms": 1}': "url is not a string",
        b'{"user_id": 1, "url": "/", "ts": 5, "duration_ms": -1}': "duration_ms is negative",
    }
    for raw, message in bad.items():
        values, error = parser.parse(raw)
        assert values is None and error is not None and message in error, raw
    assert parser.parse(None)[1] is not None


def test_shipped_jobs_load() -> None:
    v1 = load_job_file(ROOT / "jobs/pageview_counts/v1.py")
    v2 = load_job_file(ROOT / "jobs/pageview_counts/v2.py")
    assert (v1.name, v1.version, v2.version) == ("pageview_counts", "v1", "v2")
    assert v1.key_columns == ("url",) and v1.fingerprint != v2.fingerprint
    assert dict(v1.merge) == {"views": "sum", "total_duration_ms": "sum"}


_GOOD = (ROOT / "jobs/pageview_counts/v1.py").read_text()


@pytest.mark.parametrize(("source", "message"), [
    ("def transform(:\n", "syntax error"),
    (_GOOD.replace('NAME = "pageview_counts"', ""), "missing declaration(s) NAME"),
    (_GOOD.replace("def transform(events)", "def other(events)"), "def transform(events)"),
    (_GOOD.replace('VERSION = "v1"', 'VERSION = "V1"'), "invalid version 'V1'"),
    (_GOOD.replace('NAME = "pageview_counts"', 'NAME = "pv; drop"'), "invalid job name"),
    (_GOOD.replace('KEY_COLUMNS = ["url"]', 'KEY_COLUMNS = ["nope"]'), "KEY_COLUMNS"),
    (_GOOD.replace('"views": "bigint"', '"views": "bigint; drop table x"'), "OUTPUT_SCHEMA"),
    (_GOOD.replace('TOPICS = ["pageviews"]', "TOPICS = [x]"), "must be a literal"),
])
def test_bad_job_files_get_one_line_errors(source: str, message: str) -> None:
    with pytest.raises(KappaError) as info:
        parse_job_source(source, "job.py")
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize("field", ["kafka_offset", "Kafka_Key", "_dead", "_dead_reason",
                                   "_dead_key", "_DEAD_VALUE"])
def test_an_event_field_with_a_reserved_name_is_refused_naming_it(field: str) -> None:
    """Every events DataFrame carries the Kafka metadata columns, and a decoded segment the dead
    letters' columns, beside the fields: a field of the same name would make the decode or
    every read of its segments fail (#60)."""
    source = _GOOD.replace('"duration_ms": "long"}', f'"duration_ms": "long", "{field}": "long"}}')
    with pytest.raises(JobFileError) as info:
        parse_job_source(source, "job.py")
    text = str(info.value)
    assert f"'{field}'" in text and "rename" in text and "\n" not in text


def test_an_event_field_named_only_like_a_reserved_one_is_taken() -> None:
    near = ("dead", "_deadline", "dead_reason", "Kafka_Offsets", "_dead_reasons")
    source = _GOOD.replace('"duration_ms": "long"}', '"duration_ms": "long", ' + ", ".join(
        f'"{name}": "long"' for name in near) + "}")
    spec = parse_job_source(source, "job.py")
    assert all(f"`{name}` bigint" in spec.inputs[0].schema for name in near), spec.inputs


def test_missing_job_file(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="does not exist"):
        load_job_file(tmp_path / "nope.py")


def test_replay_starts_at_the_first_retained_offset_and_refuses_a_gap() -> None:
    whole = {("t", 0): (0, 10), ("t", 1): (0, 5)}
    assert replay_start(whole, allow_gap=False) == ({"t": {"0": 0, "1": 0}}, 0)
    trimmed = {("t", 0): (7, 10), ("t", 1): (0, 5)}
    with pytest.raises(LogGapError) as info:
        replay_start(trimmed, allow_gap=False)
    assert "removed 7 offsets" in str(info.value) and "--allow-gap" in str(info.value)
    assert replay_start(trimmed, allow_gap=True) == ({"t": {"0": 7, "1": 0}}, 7)
