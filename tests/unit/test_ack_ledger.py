"""The ack proxy's two pure parts: reading Produce and DeleteTopics messages off the wire, and
the ledger of acknowledged ends that a crash must not lose."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.archive_model.deletion import Deletion
from orchestrator.dev import ack_ledger
from orchestrator.dev.ack_ledger import AckLedger, merge, read_deletions, read_ledger
from orchestrator.kafka import wire


def _batch(records: int) -> bytes:
    """A magic-2 record batch header taking ``records`` offsets (the records are not read)."""
    body = struct.pack(">ibIhiqqqhii", 0, 2, 0, 0, records - 1, 0, 0, -1, -1, -1, records)
    body += b"r" * (7 * records)
    return struct.pack(">qi", 0, len(body)) + body


def _string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else struct.pack(">h", -1)
    data = text.encode()
    return _uvarint(len(data) + 1) + data if flexible else struct.pack(">h", len(data)) + data


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _array(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else struct.pack(">i", n)


def _by_topic(data: Mapping[tuple[str, int], Any], flexible: bool,
              partition: Callable[[int, Any], bytes]) -> bytes:
    """The topics array of a Produce request or response, ``partition`` encoding each entry."""
    topics = sorted({t for t, _ in data})
    out = _array(len(topics), flexible)
    for topic in topics:
        parts = sorted(p for t, p in data if t == topic)
        out += _string(topic, flexible) + _array(len(parts), flexible)
        for p in parts:
            out += partition(p, data[(topic, p)]) + (b"\x00" if flexible else b"")
        out += b"\x00" if flexible else b""
    return out


def _produce(version: int, correlation_id: int, data: dict[tuple[str, int], list[int]]) -> bytes:
    flexible = version >= 9

    def partition(p: int, batches: list[int]) -> bytes:
        records = b"".join(_batch(n) for n in batches)
        size = _uvarint(len(records) + 1) if flexible else struct.pack(">i", len(records))
        return struct.pack(">i", p) + size + records

    out = struct.pack(">hhi", wire.PRODUCE, version, correlation_id) + _string("app", False)
    out += b"\x00" if flexible else b""
    out += _string(None, flexible) + struct.pack(">hi", -1, 30000)
    return out + _by_topic(data, flexible, partition) + (b"\x00" if flexible else b"")


def _response(version: int, correlation_id: int,
              acks: dict[tuple[str, int], tuple[int, int]]) -> bytes:
    flexible = version >= 9

    def partition(p: int, ack: tuple[int, int]) -> bytes:
        out = struct.pack(">ihqq", p, ack[0], ack[1], -1)
        out += struct.pack(">q", 0) if version >= 5 else b""
        return out + (_array(0, flexible) + _string(None, flexible) if version >= 8 else b"")

    out = struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"")
    out += _by_topic(acks, flexible, partition)
    return out + struct.pack(">i", 0) + (b"\x00" if flexible else b"")


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11])
def test_a_produce_request_and_its_response_give_the_acknowledged_ends(version: int) -> None:
    request = _produce(version, 41, {("pageviews", 0): [5, 3], ("pageviews", 2): [1],
                                     ("other", 1): [10]})
    header, acks, counts = wire.produce_counts(request)
    assert (header.api_version, header.correlation_id, acks) == (version, 41, -1)
    assert counts == {("pageviews", 0): 8, ("pageviews", 2): 1, ("other", 1): 10}
    correlation_id, acks = wire.produce_acks(_response(version, 41, {
        ("pageviews", 0): (0, 100), ("pageviews", 2): (6, -1), ("other", 1): (0, 0)}), version)
    assert correlation_id == 41
    assert [(a.topic, a.partition, a.error_code, a.base_offset) for a in acks] == [
        ("other", 1, 0, 0), ("pageviews", 0, 0, 100), ("pageviews", 2, 6, -1)]


def test_messages_it_does_not_understand_are_refused_not_guessed() -> None:
    with pytest.raises(wire.WireError, match="Produce v13"):
        wire.produce_counts(_produce(13, 1, {}))
    with pytest.raises(wire.WireError, match="ends at"):
        wire.produce_counts(_produce(7, 1, {("t", 0): [2]})[:-5])
    old_batch = bytearray(_batch(2))
    old_batch[16] = 1
    with pytest.raises(wire.WireError, match="magic 1"):
        wire.batch_offsets(bytes(old_batch))


@pytest.mark.parametrize("version", [1, 4])
def test_a_delete_topics_request_names_its_topics(version: int) -> None:
    flexible = version >= 4
    request = (struct.pack(">hhi", wire.DELETE_TOPICS, version, 7) + _string("admin", False)
               + (b"\x00" if flexible else b"") + _array(2, flexible)
               + _string("a", flexible) + _string("b.c", flexible) + struct.pack(">i", 100))
    assert wire.deleted_topics(request) == ["a", "b.c"]


@pytest.mark.parametrize("version", [0, 1, 4, 5])
def test_a_delete_topics_response_says_which_topics_were_deleted(version: int) -> None:
    flexible = version >= 4
    tags = b"\x00" if flexible else b""
    response = struct.pack(">i", 7) + tags + (struct.pack(">i", 0) if version >= 1 else b"")
    response += _array(2, flexible)
    for topic, error in (("a", 0), ("b.c", 3)):  # 3: UNKNOWN_TOPIC_OR_PARTITION
        response += _string(topic, flexible) + struct.pack(">h", error)
        response += (_string(None, flexible) if version >= 5 else b"") + tags
    assert wire.delete_outcomes(response + tags, version) == {"a": 0, "b.c": 3}
    with pytest.raises(wire.WireError, match="v6"):
        wire.delete_outcomes(response, 6)


def test_a_deletion_forgets_the_ends_before_it_and_is_kept_when_compacted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#47, path 2: the ledger keeps when a client deleted a topic, and (#61, path 6) the ids
    it deleted, so that a restore after a crash ends the archive's lineages of those ids even
    when no archiver pass saw the deletion; a deletion whose id is unknown keeps its time."""
    path = tmp_path / "acks"
    ledger = AckLedger(path)
    ledger.note("t", 0, 500)
    ledger.deleted("t", 1_000, "id-t1")
    ledger.note("t", 0, 20)  # the name again: a new topic
    ledger.deleted("u", 2_000)  # the broker did not name its id
    ledger.deleted("v", 2_500, "id-v1")
    ledger.deleted("v", 2_600, "id-v2")  # created again and deleted again
    ledger.write(*ledger.take())
    expected = {"t": Deletion(1_000, frozenset({"id-t1"}), unidentified=False),
                "u": Deletion(2_000),
                "v": Deletion(2_600, frozenset({"id-v1", "id-v2"}), unidentified=False)}
    assert read_ledger(path) == {"t": {0: 20}}
    assert read_deletions(path) == expected
    assert [d.by_id for d in expected.values()] == [True, False, True]
    monkeypatch.setattr(ack_ledger, "COMPACT_AFTER_BYTES", 0)
    ledger.note("t", 1, 7)
    ledger.write(*ledger.take())  # rewritten as its deletions, then its ends
    ledger.close()
    assert read_ledger(path) == {"t": {0: 20, 1: 7}}
    assert read_deletions(path) == expected
    reopened = AckLedger(path)
    reopened.close()
    assert reopened.deletions == expected
    # A ledger of before the ids: its deletions are by time.
    path.write_text("deleted 3000 w\n")
    assert read_deletions(path) == {"w": Deletion(3_000)}


def test_the_ledger_keeps_the_highest_end_and_survives_a_line_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "acks"
    ledger = AckLedger(path)
    for topic, partition, end in [("t", 0, 10), ("t", 0, 7), ("t", 1, 3), ("u", 0, 5)]:
        ledger.note(topic, partition, end)
    ledger.write(*ledger.take())
    ledger.forget("u")
    ledger.write(*ledger.take())
    ledger.close()
    assert read_ledger(path) == {"t": {0: 10, 1: 3}}
    with path.open("ab") as torn:
        torn.write(b"end 0 99")  # a crash mid-write: never acknowledged
    assert read_ledger(path) == {"t": {0: 10, 1: 3}}
    assert read_ledger(tmp_path / "none") == {}


def test_a_deleted_topic_starts_again_from_nothing(tmp_path: Path) -> None:
    ledger = AckLedger(tmp_path / "acks")
    ledger.note("t", 0, 500)
    ledger.note("t", 1, 400)
    ledger.forget("t")  # DeleteTopics: a topic of that name starts again at offset 0
    ledger.note("t", 0, 20)
    ledger.write(*ledger.take())
    ledger.close()
    assert read_ledger(tmp_path / "acks") == {"t": {0: 20}}


def test_a_long_ledger_is_rewritten_as_its_ends(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ack_ledger, "COMPACT_AFTER_BYTES", 200)
    path = tmp_path / "acks"
    ledger = AckLedger(path)
    for end in range(1, 101):
        ledger.note("pageviews", end % 4, end)
        ledger.write(*ledger.take())
    ledger.note("pageviews", 0, 1000)
    ledger.write(*ledger.take())
    ledger.close()
    assert path.stat().st_size < 400
    assert read_ledger(path) == {"pageviews": {0: 1000, 1: 97, 2: 98, 3: 99}}
    reopened = AckLedger(path)
    reopened.close()
    assert reopened.ends == read_ledger(path)


def test_ledgers_merge_to_the_highest_end() -> None:
    assert merge({"t": {0: 5, 1: 9}}, {"t": {0: 7}, "u": {2: 1}}) == {
        "t": {0: 7, 1: 9}, "u": {2: 1}}


def test_a_group_whose_sync_raises_fails_its_waiters_and_syncs_the_next_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#47, path 6: a ledger error other than OSError (here the fail point's) ended the sync
    loop, and every later Produce waited for ever while the proxy looked alive. Now the waiters
    of the failed sync get its error (their producers reconnect and retry), and the next
    acknowledgement is synced and answered."""
    import asyncio

    from orchestrator.dev.ack_proxy import _Group
    from orchestrator.failpoints import FailPointError

    monkeypatch.setenv("KAPPA_FAIL_POINTS", "ack_proxy.ledger_write=1*raise")
    ledger = AckLedger(tmp_path / "broker-acks")

    async def two_acknowledgements() -> None:
        group = _Group(ledger)
        syncing = asyncio.create_task(group.run())
        ledger.note("t", 0, 5)
        with pytest.raises(FailPointError):
            await asyncio.wait_for(group.durable(), 5)
        ledger.note("t", 0, 9)
        await asyncio.wait_for(group.durable(), 5)  # raised TimeoutError: nobody synced it
        syncing.cancel()

    asyncio.run(two_acknowledgements())
    ledger.close()
    assert read_ledger(tmp_path / "broker-acks") == {"t": {0: 9}}


def test_two_ledgers_merge_into_one_with_the_highest_ends_and_the_latest_deletions(
        tmp_path: Path) -> None:
    older, newer = tmp_path / "older", tmp_path / "newer"
    gone, other = Deletion.noted(100, "id-1"), Deletion.noted(70, "id-3")
    older.write_text(ack_ledger.as_lines({"a": {0: 10, 1: 4}, "b": {0: 3}}, {"gone": gone}))
    newer.write_text(ack_ledger.as_lines({"a": {0: 7, 1: 9}},
                                         {"gone": Deletion(50), "other": other}))
    both = tmp_path / "both"
    both.write_text(ack_ledger.merged(older, newer))
    assert read_ledger(both) == {"a": {0: 10, 1: 9}, "b": {0: 3}}
    assert read_deletions(both) == {"gone": Deletion(100, frozenset({"id-1"})), "other": other}
