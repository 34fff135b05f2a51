"""Replays read the archive first (#23): a version's read tasks whose offsets the archive holds
read its Parquet segments, the rest read Kafka, with the same output, dead letters and gap
accounting; each batch records how many of its offsets came from the archive, and a segment
that differs from the manifest stops the batch that needs it, naming the segment. Segments
decoded once (#46) are read with no parse, and give the same tables."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import (
    archiver,
    assert_batches_tile_the_log,
    assert_exact,
    dead_letters,
    output,
    query,
)
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _segments(settings, topic: str) -> list:
    from orchestrator.catalog import archive_manifest
    from orchestrator.catalog.db import connect

    with connect(settings.pg_dsn, autocommit=True) as conn:
        return [s for s in archive_manifest.segments(conn, settings.catalog_schema)
                if s.lineage.topic == topic]


def _decoded(settings, topic: str) -> dict[str, str]:
    """{raw segment path: decoded segment path} of the topic's segments."""
    from orchestrator.catalog import archive_manifest, decoded_manifest
    from orchestrator.catalog.db import connect

    with connect(settings.pg_dsn, autocommit=True) as conn:
        raw = {(s.partition, s.first_offset): s.path for s in
               archive_manifest.segments(conn, settings.catalog_schema)
               if s.lineage.topic == topic}
        return {raw[(d.partition, d.first_offset)]: d.path for d in
                decoded_manifest.decoded(conn, settings.catalog_schema)
                if d.lineage.topic == topic}


def _archived_offsets(settings, version: str) -> list[int | None]:
    return [r[0] for r in query(
        settings, f"SELECT b.archived_offsets FROM {settings.catalog_schema}.batches b JOIN "
        f"{settings.catalog_schema}.job_versions v ON v.id = b.version_id WHERE v.job = %s AND "
        "v.version = %s ORDER BY b.batch_id", JOB, version)]


def _status(settings, topic: str) -> list[dict]:
    return [r for r in json.loads(kappa_cli(settings, "archive", "status", topic, "--json",
                                            check=True).stdout) if r["topic"] == topic]


def _decoding_fails_then_goes_on(settings, topic: str, tmp_path: Path, log_end: int) -> None:
    """A decode that raises, whatever the error (the fail point archive.decode raises one that
    is no ArchiveError), stops that topic's decoding only (#60): the continuous archiver archives
    on to the log end, `kappa archive status` names the error, and every pass tries the decoding
    again. It used to end the archiver."""
    import signal

    from orchestrator import failpoints
    from orchestrator.catalog import archive_manifest
    from orchestrator.catalog.db import connect

    released = tmp_path / "released"
    released.mkdir()
    # Two passes fail; the third waits at the point, so that the error stays for the test to
    # see, until it is released.
    proc = archiver(settings, [topic], "archive.decode=2*raise->pause", released,
                    "--interval", "0.2")
    try:
        def paused_after_two_failures() -> bool:
            if proc.poll() is not None:
                return True
            with connect(settings.pg_dsn, autocommit=True) as conn:
                seen = conn.execute(
                    f"SELECT seen_at > since FROM {settings.catalog_schema}.archive_errors "
                    "WHERE topic = %s", (topic,)).fetchone()
                held = sum(s.end_offset - s.first_offset for s in archive_manifest.segments(
                    conn, settings.catalog_schema) if s.lineage.topic == topic)
            return bool(seen and seen[0]) and held >= log_end

        wait_until(paused_after_two_failures, 120, "two passes to fail to decode")
        assert proc.poll() is None, f"the archiver exited: {proc.stderr.read()}"  # type: ignore
        errors = {r["error"] for r in _status(settings, topic)}
        assert len(errors) == 1 and "fail point archive.decode" in str(errors), errors
        assert "decod" in str(errors), errors
        assert _decoded(settings, topic) == {}
        failpoints.release(released, "archive.decode")
        wait_until(lambda: proc.poll() is not None or (
            len(_decoded(settings, topic)) == len(_segments(settings, topic))
            and all(r["error"] is None for r in _status(settings, topic))), 120,
            "the decoding to go through and its error to be cleared")
        assert proc.poll() is None, f"the archiver exited: {proc.stderr.read()}"  # type: ignore
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    named = [line for line in err.splitlines() if "its decoding stopped" in line]
    assert len(named) == 1 and "fail point archive.decode" in named[0], err  # not once a pass


def _a_decoded_segment_that_lies_is_found_by_decoding_it_again(settings, topic: str) -> None:
    """`kappa archive verify --decoded` decodes the decoded segments again from their raw
    segments and compares them row for row (#60): one whose file matches its checksum but not
    what the parser makes (here one value changed, and its checksum with it, as a decoder that
    lied would have written it) is named, rebuilt, and the command fails."""
    from orchestrator.archive.decoder import file_checksum
    from orchestrator.archive.parquet_store import parquet_bytes
    from orchestrator.archive.readable import archive_root
    from orchestrator.catalog import decoded_manifest
    from orchestrator.catalog.db import connect

    def verify(*args: str) -> tuple[int, dict]:
        done = kappa_cli(settings, "archive", "verify", topic, "--json", "--decoded", *args)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, {**json.loads(done.stdout)["decoded_again"],
                                 "stderr": done.stderr}

    with connect(settings.pg_dsn, autocommit=True) as conn:
        held = [d for d in decoded_manifest.decoded(conn, settings.catalog_schema)
                if d.lineage.topic == topic]
        code, again = verify()
        assert (code, again["compared"], again["differed"]) == (0, len(held), []), again
        lying = held[-1]  # a sample of 2 takes the first and the last
        path = Path(archive_root(settings)) / lying.path
        table = pq.read_table(path)
        urls = table.column("url").to_pylist()
        row = next(n for n, url in enumerate(urls) if url is not None)
        urls[row] = f"{urls[row]}/lied"
        data = parquet_bytes(table.set_column(table.schema.get_field_index("url"), "url",
                                              pa.array(urls, pa.string())),
                             plain=("kafka_offset", "kafka_timestamp"))
        path.write_bytes(data)
        conn.execute(f"UPDATE {settings.catalog_schema}.archive_decoded SET checksum = %s "
                     "WHERE path = %s", (file_checksum(data), lying.path))
        offset = table.column("kafka_offset")[row].as_py()
        code, again = verify("2")
        assert (code, again["compared"], len(again["differed"])) == (1, 2, 1), again
        assert lying.path in again["differed"][0] and "rebuilt" in again["differed"][0], again
        assert f"column url at offset {offset}" in again["differed"][0], again
        assert lying.path in again["stderr"] and "report it" in again["stderr"], again
        code, again = verify()  # rebuilt as the parser makes it
        assert (code, again["compared"], again["differed"]) == (0, len(held), []), again


def test_a_replay_reads_the_archive_below_its_end_and_kafka_past_it(settings, topic: str,
                                                                    tmp_path: Path) -> None:
    from orchestrator.archive.readable import archive_root
    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=6_000, max_batch_records=20_000,
                       chunk_records=5_000)
    service = Orchestrator(settings)
    service.produce_sample(topic, 24_000, seed=231)
    archived = kappa_cli(settings, "archive", "run", "--once", topic)
    assert archived.returncode == 0, archived.stderr
    segments = _segments(settings, topic)
    archive_end: dict[int, int] = {}
    for s in segments:
        archive_end[s.partition] = max(archive_end.get(s.partition, 0), s.end_offset)
    service.produce_sample(topic, 6_000, seed=232)  # past the archive's end: Kafka's alone
    try:
        service.deploy(job_file(tmp_path, "v1", topic))
        service.wait(JOB, "v1", timeout_s=600)
        reference = compute(settings.kafka_bootstrap, topic)
        assert output(settings, f"{JOB}__v1") == reference.v1
        assert dead_letters(settings, f"{JOB}__v1__dead_letters") == reference.invalid_offsets
        assert reference.invalid_offsets
        assert_batches_tile_the_log(settings, JOB, "v1", topic, reference.log_end)
        # Nothing decoded yet: v1 parsed the raw segments, and its status says how far the
        # decoding of what it reads is.
        assert service.version_status(JOB, "v1").decoded == (0, len(segments))
        counted = _archived_offsets(settings, "v1")
        from_archive = sum(c or 0 for c in counted)
        print(f"offsets from the archive per batch: {counted}; archive ends {archive_end}")
        assert None not in counted, counted
        assert 0 < from_archive <= sum(archive_end.values()), (counted, archive_end)
        assert reference.records - from_archive >= 6_000, (counted, reference.records)

        # The archiver decodes every segment under v1's decoding; v2 (the same decoding)
        # reads those, with no parse. One decoded file is damaged: it is rebuilt from its raw
        # segment, and one line names it. Another raw segment is damaged: v2 never reads it.
        _decoding_fails_then_goes_on(settings, topic, tmp_path, sum(reference.log_end.values()))
        decoded = kappa_cli(settings, "archive", "run", "--once", topic)
        assert decoded.returncode == 0, decoded.stderr
        assert all(r["error"] is None for r in _status(settings, topic))  # decoded: cleared
        segments = _segments(settings, topic)
        _a_decoded_segment_that_lies_is_found_by_decoding_it_again(settings, topic)
        progress = json.loads(kappa_cli(settings, "archive", "decodings", "--json",
                                        check=True).stdout)
        mine = [p for p in progress if p["topic"] == topic]
        assert len(mine) == 1 and mine[0]["in_use"], progress
        assert mine[0]["decoded_segments"] == mine[0]["raw_segments"] == len(segments), mine
        assert mine[0]["dead_letters"] == len(reference.invalid_offsets), mine
        assert service.version_status(JOB, "v1").decoded == (len(segments), len(segments))
        # What tells a warm spare to warm Spark's Parquet reader (spark/launch/spare.py).
        from orchestrator.catalog import decoded_manifest
        from orchestrator.catalog.db import connect

        with connect(settings.pg_dsn, autocommit=True) as conn:
            assert decoded_manifest.holds_any(conn, settings.catalog_schema)
            assert not decoded_manifest.holds_any(conn, "kappa_never_migrated")
        files = _decoded(settings, topic)
        root = Path(archive_root(settings))
        rebuilt, skipped = segments[0], segments[1]
        shutil.copyfile(root / files[segments[2].path], root / files[rebuilt.path])
        shutil.copyfile(root / segments[2].path, root / skipped.path)
        service.deploy(job_file(tmp_path, "v2", topic))
        service.wait(JOB, "v2", timeout_s=600)
        assert_exact(settings, JOB, "v2", topic, reference, reference.v2)
        # The archive holds the whole log now: every offset of v2 came from it.
        assert sum(c or 0 for c in _archived_offsets(settings, "v2")) == \
            sum(s.end_offset - s.first_offset for s in segments) == sum(reference.log_end.values())
        log = Path(service.version_status(JOB, "v2").log_path or "").read_text()
        named = [line for line in log.splitlines() if files[rebuilt.path] in line]
        assert len(named) == 1 and "rebuilt from its raw segment" in named[0], named
        assert "reads decoded segments with Spark's Parquet reader" in log  # a batch job

        # Without decoded segments a replay parses the raw ones: the damaged one stops the
        # batch that needs it, naming the segment.
        raw_only = Orchestrator(replace(settings, decoded_segments=False))
        v3 = tmp_path / "v3.py"
        v3.write_text(job_file(tmp_path, "v1", topic).read_text().replace(
            'VERSION = "v1"', 'VERSION = "v3"'))
        raw_only.deploy(v3)
        st = wait_until(lambda: (s := raw_only.version_status(JOB, "v3")).state.value ==
                        "failed" and s, 600, "v3 to fail on the damaged segment")
        assert skipped.path in st.reason and "kappa archive verify" in st.reason, st.reason
        assert "failed 3 times" not in st.reason and "\n" not in st.reason, st.reason
        # No batch that needs the damaged segment was applied.
        assert sum(c or 0 for c in _archived_offsets(settings, "v3")) < \
            sum(reference.log_end.values())

        # Decoded segments go only on command, and only once no version reads them.
        kept = kappa_cli(settings, "archive", "prune-decoded", "--json", check=True)
        assert json.loads(kept.stdout) == [], kept.stdout
        service.stop_all()
        for version in ("v1", "v2", "v3"):
            service.retire(JOB, version)
        assert all((root / path).exists() for path in files.values())  # retiring is no prune
        pruned = json.loads(kappa_cli(settings, "archive", "prune-decoded", "--json",
                                      check=True).stdout)
        assert [(p["topic"], p["decoded_segments"]) for p in pruned] == \
            [(topic, len(segments))], pruned
        assert not any((root / path).exists() for path in files.values())
        assert _decoded(settings, topic) == {} and len(_segments(settings, topic)) == \
            len(segments)
    finally:
        service.stop_all()


def test_a_local_archive_root_with_executors_on_other_hosts_is_refused_at_deploy(
        settings, topic: str, tmp_path: Path) -> None:
    """Executors on other hosts cannot read a local archive root: the deploy says so in one
    line, before anything is registered, rather than replaying from the brokers unseen."""
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 1_000, seed=233)
    archived = kappa_cli(settings, "archive", "run", "--once", topic)
    assert archived.returncode == 0, archived.stderr
    # A master on a documentation address (RFC 5737): nothing listens there, and the deploy
    # must not get as far as asking it.
    on_cluster = replace(settings, spark_master="spark://192.0.2.10:7077")
    refused = kappa_cli(on_cluster, "deploy", str(job_file(tmp_path, "v1", topic)))
    assert refused.returncode != 0
    message = refused.stderr.strip()
    assert "\n" not in message, message
    assert topic in message and "archive_root" in message and "s3://" in message, message
    assert service.status() == [] or all(s.job != JOB for s in service.status())
