"""The archive of the log, written from a real broker into Parquet files under a real
PostgreSQL manifest: every offset is a record or a gap, the records are the log's, and crashes
at the fail points between a segment's write, its rename and its record leave no half segment,
no hole and no overlap. A recreated topic starts a new lineage."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

from conftest import kappa_cli, wait_until
from integration.helpers import archiver, reap

pytestmark = [pytest.mark.integration]


def _manifest(settings, topic: str) -> list:
    from orchestrator.catalog import archive_manifest
    from orchestrator.catalog.db import connect

    with connect(settings.pg_dsn, autocommit=True) as conn:
        return [s for s in archive_manifest.segments(conn, settings.catalog_schema)
                if s.lineage.topic == topic]


def _status(settings, topic: str) -> list[dict]:
    done = kappa_cli(settings, "archive", "status", topic, "--json")
    assert done.returncode == 0, done.stderr
    return [row for row in json.loads(done.stdout) if row["topic"] == topic]


def _run(settings, topic: str, fail_points: str | None = None) -> int:
    import os

    extra = {"KAPPA_FAIL_POINTS": fail_points} if fail_points else {}
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        done = kappa_cli(settings, "archive", "run", "--once", topic)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode


def test_a_transactional_log_is_archived_offset_for_offset_across_crashes(
        settings, topic: str) -> None:
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.archive_model.segments import checksum
    from orchestrator.failpoints import EXIT_STATUS
    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.kafka.reader import read_range
    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=1_500)
    service = Orchestrator(settings)
    # Transactions of 1,000 records, every 5th aborted: their markers are offsets with no record.
    service.produce_sample(topic, 12_000, seed=131, transactional=True)
    # A death after a segment was written under its temporary name, then one after it was put
    # in place but before the manifest held it; then a clean run.
    assert _run(settings, topic, "archive.before_rename=2*off->1*exit") == EXIT_STATUS
    assert _run(settings, topic, "archive.before_record=1*off->1*exit") == EXIT_STATUS
    crashed = _manifest(settings, topic)
    assert len(crashed) == 3  # two segments before the first death, one before the second
    assert _run(settings, topic) == 0

    bounds = log_bounds(settings.kafka, [topic])
    segments = _manifest(settings, topic)
    assert segments[:3] == crashed  # recorded segments are never rewritten
    store = ParquetStore(str(settings.state_dir / "archive"))
    root = settings.state_dir / "archive"
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))
    assert on_disk == sorted(s.path for s in segments)  # nothing unrecorded is left
    group = f"test-archive-{uuid.uuid4().hex[:8]}"
    total_gaps = 0
    for (name, partition), (start, end) in bounds.items():
        mine = [s for s in segments if s.partition == partition]
        assert mine[0].first_offset == start and mine[-1].end_offset == end
        assert all(a.end_offset == b.first_offset for a, b in pairwise(mine))
        for s in mine:
            archived = store.read(s.path)
            from_log = [r for batch in read_range(settings.kafka, name, partition,
                                                  s.first_offset, s.end_offset, group,
                                                  timestamp_types=True) for r in batch]
            assert archived == from_log and s.checksum == checksum(archived)  # type: ignore[arg-type]
            assert s.records + len(s.gap_offsets) == s.end_offset - s.first_offset
            assert not set(s.gap_offsets) & {r[0] for r in archived}
            total_gaps += len(s.gap_offsets)
    assert total_gaps >= 12  # one marker per transaction at least

    rows = _status(settings, topic)
    assert len(rows) == len(bounds) and all(r["behind"] == 0 and r["current"] for r in rows)
    assert all(r["lag_seconds"] == 0 for r in rows)
    # Everything the broker holds is archived: retention can take it all safely.
    assert all((r["retention"], r["retention_headroom_share"]) == ("ok", 1.0) for r in rows)
    assert sum(r["records"] for r in rows) == sum(s.records for s in segments)
    service.produce_sample(topic, 400, seed=132)
    after = log_bounds(settings.kafka, [topic])
    rows = _status(settings, topic)
    assert sum(r["behind"] for r in rows) == sum(
        e for _, e in after.values()) - sum(e for _, e in bounds.values()) > 0
    # The records not archived yet were written moments ago: their age is known and small.
    waiting = [r for r in rows if r["behind"]]
    assert waiting and all(r["lag_seconds"] is not None and 0 <= r["lag_seconds"] < 120
                           for r in waiting)


def test_a_recreated_topic_starts_a_new_lineage(settings, topic: str, monkeypatch) -> None:
    from confluent_kafka.admin import AdminClient

    from orchestrator.errors import KappaError
    from orchestrator.kafka.admin import ensure_topic
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 2_000, seed=133)
    assert _run(settings, topic) == 0
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result()

    def recreated() -> bool:
        try:
            return ensure_topic(settings.kafka_bootstrap, topic, 4)
        except KappaError:
            return False

    wait_until(recreated, 30, f"{topic} to be created again")
    service.produce_sample(topic, 500, seed=134)
    assert _run(settings, topic) == 0
    lineages = {(s.lineage.cluster_id, s.lineage.topic_id) for s in _manifest(settings, topic)}
    assert len(lineages) == 2
    rows = _status(settings, topic)
    current = [r for r in rows if r["current"]]
    assert sum(r["records"] for r in current) == 500 and all(r["behind"] == 0 for r in current)
    gone = [r for r in rows if r["current"] is False]
    assert sum(r["records"] for r in gone) == 2_000
    assert all(r["log_end"] is None and r["behind"] is None and r["lag_seconds"] is None
               and r["retention"] is None for r in gone)  # unknown, not 0
    _a_prune_while_the_new_lineage_is_decoded(settings, topic, monkeypatch)


def _a_prune_while_the_new_lineage_is_decoded(settings, topic: str, monkeypatch) -> None:
    """A prune while a pass decodes the new lineage under a decoding whose old lineage no
    version reads any more (#60): it removes the old lineage's decoded segments, never the
    decoding that the pass records under. It used to forget the decoding, and the pass's next
    record failed on a foreign key, which ended the archiver. Which lineage a version reads is
    set here (decode_pass.uses), as a deploy of each would set it."""
    from orchestrator.archive import decode_pass
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.archive.readable import archive_root
    from orchestrator.archive_model.decoding import Decoding
    from orchestrator.catalog import decoded_manifest
    from orchestrator.catalog.db import connect
    from orchestrator.models import TopicInput

    old, new = sorted({s.lineage for s in _manifest(settings, topic)},
                      key=lambda lineage: -sum(s.records for s in _manifest(settings, topic)
                                               if s.lineage == lineage))  # 2,000, then 500
    decoding = Decoding.of(TopicInput(topic, "user_id bigint, url string, ts bigint, "
                                             "duration_ms bigint", (), "dead_letter"))
    store, schema = ParquetStore(archive_root(settings)), settings.catalog_schema
    decode = decode_pass.decode_segment
    pruned: list[object] = []

    def pruning_first(*args: object) -> object:
        if not pruned:  # the pass has registered the decoding and decodes its first segment
            with connect(settings.pg_dsn, autocommit=True) as other:
                pruned.extend(decode_pass.prune_unused(other, schema, store))
        return decode(*args)  # type: ignore[arg-type]

    with connect(settings.pg_dsn, autocommit=True) as conn:
        monkeypatch.setattr(decode_pass, "uses", lambda *_: [decode_pass.Use(old, decoding)])
        assert decode_pass.decode_pending(conn, schema, store, [topic])
        monkeypatch.setattr(decode_pass, "uses", lambda *_: [decode_pass.Use(new, decoding)])
        monkeypatch.setattr(decode_pass, "decode_segment", pruning_first)
        written = decode_pass.decode_pending(conn, schema, store, [topic])
        assert [(p.topic, p.decoded_segments) for p in pruned] == [  # type: ignore[attr-defined]
            (topic, len([s for s in _manifest(settings, topic) if s.lineage == old]))]
        assert {d.lineage for d in written} == {new}
        assert {d.lineage for d in decoded_manifest.decoded(conn, schema)
                if d.lineage.topic == topic} == {new}
        assert decoding.fingerprint in decoded_manifest.decodings(conn, schema)


def test_an_unwritable_archive_root_stops_with_one_line(settings, topic: str,
                                                         tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    settings = replace(settings, archive_root=str(blocker / "archive"))
    Orchestrator(settings).produce_sample(topic, 100, seed=135)
    done = kappa_cli(settings, "archive", "run", "--once", topic)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "cannot write segment" in line and "archive_root" in line, line
    assert _manifest(settings, topic) == []


def test_verify_reads_back_and_a_damaged_or_missing_segment_stops_with_one_line(
        settings, topic: str) -> None:
    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=1_000)
    Orchestrator(settings).produce_sample(topic, 3_000, seed=136)
    assert _run(settings, topic) == 0
    done = kappa_cli(settings, "archive", "verify", topic, "--json")
    assert done.returncode == 0, done.stderr
    segments = _manifest(settings, topic)
    assert json.loads(done.stdout) == {"segments": len(segments),
                                       "compared_with_log": len(segments),
                                       "records_compared": 3_000, "decoded_segments": 0,
                                       "decoded_rebuilt": [],
                                       "decoded_again": None}  # not asked (--decoded)
    root = settings.state_dir / "archive"
    first, second = segments[0], segments[1]
    (root / first.path).write_bytes((root / second.path).read_bytes())  # a valid file, wrong
    done = kappa_cli(settings, "archive", "verify", topic)
    (line,) = done.stderr.strip().splitlines()
    assert done.returncode == 1 and first.path in line and "differs from the manifest" in line
    (root / second.path).unlink()
    done = kappa_cli(settings, "archive", "run", "--once", topic)
    (line,) = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "gone from archive_root" in line, line
    assert second.path.rsplit("/", 1)[-1] in line


def test_two_archivers_at_once_share_the_partitions_without_a_clash(settings, topic: str,
                                                                     tmp_path: Path) -> None:
    """`kappa archive run` while the agent archives: each partition is written by one of them
    at a time, both write, and the manifest tiles every partition with the log's records."""
    import re
    import subprocess

    from orchestrator import failpoints
    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=500)
    Orchestrator(settings).produce_sample(topic, 20_000, seed=137)
    # Each run holds its first segment's partition, its file in place, until both are there:
    # the second run has found the first's partition taken and written another one, however
    # late it started (a fixed time per segment let a loaded machine start it after the first
    # had written them all).
    release = tmp_path / "release"
    release.mkdir()
    root = settings.state_dir / "archive"
    runs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):
            runs.append(archiver(settings, [topic], "archive.before_record=1*pause",
                                         release, "--once", stdout=subprocess.PIPE))
        try:
            wait_until(lambda: len(list(root.rglob("*.parquet"))) >= 2
                       or any(run.poll() is not None for run in runs), 300,
                       "each archiver to hold a segment of its own before recording it")
        finally:
            failpoints.release(release, "archive.before_record")
        outputs = [run.communicate(timeout=300) for run in runs]
    finally:
        reap(*runs)  # the other one too, when one's communicate timed out
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    wrote = [set(re.findall(r"^archived \S+/(\d+) \[(\d+), ", out, re.M))
             for out, _ in outputs]
    assert all(wrote) and not wrote[0] & wrote[1], wrote  # both wrote, never the same segment
    assert _run(settings, topic) == 0  # whatever one skipped while the other held it
    _equal_to_the_log(settings, topic)


def _equal_to_the_log(settings, topic: str) -> None:
    """The manifest tiles each partition from its log start to its end, with no file on disk
    that it does not hold, and the archived records are the log's."""
    from orchestrator.archive.parquet_store import ParquetStore
    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.kafka.reader import read_range

    segments = _manifest(settings, topic)
    root = settings.state_dir / "archive"
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))
    assert on_disk == sorted(s.path for s in segments)  # nothing half-written or unrecorded
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]
    store = ParquetStore(str(root))
    group = f"test-archive-{uuid.uuid4().hex[:8]}"
    for (name, partition), (start, end) in log_bounds(settings.kafka, [topic]).items():
        mine = [s for s in segments if s.partition == partition]
        assert mine[0].first_offset == start and mine[-1].end_offset == end
        assert all(a.end_offset == b.first_offset for a, b in pairwise(mine))
        archived = [r for s in mine for r in store.read(s.path)]
        from_log = [r for batch in read_range(settings.kafka, name, partition, start, end,
                                              group, timestamp_types=True) for r in batch]
        assert archived == from_log


def test_a_topic_nobody_created_is_refused_when_named_and_waited_for_otherwise(settings
                                                                               ) -> None:
    from orchestrator.archive.archiver import Archiver
    from orchestrator.archive_model.segments import ArchiveError
    from orchestrator.catalog.db import connect
    from orchestrator.service import Orchestrator

    missing = f"never_created_{uuid.uuid4().hex[:8]}"
    service = Orchestrator(settings)
    service.archive_status()  # the catalog, migrated
    with connect(settings.pg_dsn, autocommit=True) as conn:
        archiver = Archiver(settings, conn, settings.kafka)
        assert archiver.archive([missing], skip_missing=True) == []
        with pytest.raises(ArchiveError, match=f"topic {missing} does not exist"):
            archiver.archive([missing])
        # Waited for: once created, the next pass archives it.
        service.produce_sample(missing, 300, seed=136)
        written = archiver.archive([missing], skip_missing=True)
        assert sum(s.records for s in written) == 300


def test_five_sigkills_mid_segment_leave_no_half_segment_hole_or_overlap(settings, topic: str
                                                                          ) -> None:
    """`kappa archive run` SIGKILLed five times in the middle of a segment, while the log grows:
    held by a fail point after 1 to 3 segments, with the next one's file written under its
    temporary name (before its rename) or in place (before its record), which the kill leaves
    behind. The runs remove it as they reach its partition, each resumes where the manifest
    ends, and the archive equals the log."""
    import os
    import random
    import signal
    import subprocess
    import sys

    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=400)
    service = Orchestrator(settings)
    service.produce_sample(topic, 30_000, seed=138)
    assert service.archive_status([topic])  # the catalog, with its manifest, exists now
    kappa = str(Path(sys.executable).with_name("kappa"))
    chance = random.Random(int(os.environ.get("KAPPA_CHAOS_SEED", "138")))
    root = settings.state_dir / "archive"

    def left_behind() -> list[Path]:
        recorded = {s.path for s in _manifest(settings, topic)}
        return [p for p in root.rglob("*") if p.is_file() and (
            ".tmp-" in p.name or (p.suffix == ".parquet"
                                  and str(p.relative_to(root)) not in recorded))]

    for kill in range(5):
        point = ("archive.before_rename", "archive.before_record")[kill % 2]
        held = f"{point}={chance.randint(1, 3)}*off->sleep(600000)"
        env = dict(os.environ, **settings.driver_environment(), KAPPA_FAIL_POINTS=held)
        errors = Path(settings.state_dir).parent / f"archiver-{kill}.err"
        with open(errors, "w") as sink:
            proc = subprocess.Popen([kappa, "archive", "run", "--interval", "0.1", topic],
                                    env=env, stdout=subprocess.DEVNULL, stderr=sink, text=True)
        try:
            # Held at the point, not passing through an ordinary segment's own window (a file
            # under its temporary name, or in place before its record), which a loaded
            # machine's poll can see and the archiver leave before the kill lands (CI: "it did
            # not land mid-segment").
            wait_until(lambda said=f"fail point {point}: sleeping", at=errors:
                       said in at.read_text() and left_behind(), 120,
                       f"archiver run {kill + 1} to hang mid-segment ({held})", poll_s=0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            reap(proc)
        err = errors.read_text()
        assert "Traceback" not in err
        assert left_behind(), "the kill left nothing behind: it did not land mid-segment"
        service.produce_sample(topic, 2_000, seed=139 + kill)  # the log grows meanwhile
    assert _run(settings, topic) == 0
    _equal_to_the_log(settings, topic)  # what each kill left behind is gone


def test_one_topics_error_stops_only_that_topic_and_the_archiver_runs_on(settings, topic: str
                                                                         ) -> None:
    """A continuous `kappa archive run` whose pass fails on one topic (the fail point
    `archive.topic`, where a topic deleted or recreated mid-pass, or a damaged segment, raises)
    archives the other topic in the same pass, names the failed one in one line, and archives
    it on its next pass. It used to exit for good, and the embedded stack's archiver with it
    (#47, path 3)."""
    import signal

    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.service import Orchestrator

    second = f"{topic}_b"
    service = Orchestrator(settings)
    for name, seed in ((topic, 140), (second, 141)):
        service.produce_sample(name, 1_000, seed=seed)
    assert service.archive_status([topic])  # the catalog, with its manifest, exists now
    ends = {name: sum(end for (_, _), (_, end) in log_bounds(settings.kafka, [name]).items())
            for name in (topic, second)}
    # The first topic's pass fails on 20 passes in a row (every other hit: each pass reaches
    # the point once per topic), then goes through.
    proc = archiver(settings, [topic, second],
                    "archive.topic=" + "->".join(["1*raise", "1*off"] * 20), None,
                    "--interval", "0.2")
    try:
        def archived(name: str) -> bool:
            held = sum(s.end_offset - s.first_offset for s in _manifest(settings, name))
            return held >= ends[name]

        def named() -> bool:
            rows = {r["topic"]: r["error"] for r in _status(settings, topic)
                    + _status(settings, second)}
            return proc.poll() is not None or (
                "fail point archive.topic" in (rows.get(topic) or "") and archived(second))

        # While it fails, `kappa archive status` names the error on its topic only, and the
        # other topic is archived.
        wait_until(named, 120, f"{topic}'s error in `kappa archive status`")
        assert proc.poll() is None, f"the archiver exited: {proc.stderr.read()}"  # type: ignore
        assert all(r["error"] is None for r in _status(settings, second))
        wait_until(lambda: archived(topic) or proc.poll() is not None, 120,
                   f"{topic} to be archived once its passes go through")
        assert proc.poll() is None, f"the archiver exited: {proc.stderr.read()}"  # type: ignore
        wait_until(lambda: all(r["error"] is None for r in _status(settings, topic)), 30,
                   "the error to be cleared")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    failed = [line for line in err.splitlines() if "stop on this topic only" in line]
    assert len(failed) == 1 and topic in failed[0] and "fail point" in failed[0], err  # once
