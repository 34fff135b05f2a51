"""Restoring archived topics into a broker that lost them, against the real broker and
PostgreSQL: the records come back at their offsets, gaps included; the restored topic continues
its lineage, so the archive goes on in the same segments; what a crash lost before the archive
held it is reported by offset; and a damaged segment is never restored."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import replace

import pytest

from conftest import kappa_cli
from integration.test_archive import _manifest, _run

pytestmark = [pytest.mark.integration]


def _log(settings, topic: str) -> dict[int, list]:
    from orchestrator.archive.archiver import read_archived
    from orchestrator.kafka.offsets import log_bounds

    group = f"test-restore-{uuid.uuid4().hex[:8]}"
    return {p: read_archived(settings.kafka, topic, p, start, end, group)
            for (_, p), (start, end) in sorted(log_bounds(settings.kafka, [topic]).items())}


def _delete(settings, topic: str) -> None:
    from orchestrator.kafka.admin import delete_topic

    delete_topic(settings.kafka, topic)


def _restore(settings, *topics: str) -> tuple[int, dict, str]:
    done = kappa_cli(settings, "archive", "restore", *topics, "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}, done.stderr


def test_a_lost_topic_comes_back_offset_for_offset_and_continues_its_lineage(
        settings, topic: str) -> None:
    from orchestrator.kafka.admin import log_identity
    from orchestrator.service import Orchestrator

    settings = replace(settings, archive_segment_records=700)
    service = Orchestrator(settings)
    service.produce_sample(topic, 1_500, seed=141)
    # Transactions of 1,000, every 5th aborted: this broker shows aborted records, and each
    # transaction leaves a marker, an offset with no record, which the restore must reproduce.
    service.produce_sample(topic, 6_000, seed=142, transactional=True)
    service.produce_sample(topic, 500, seed=143)
    assert _run(settings, topic) == 0
    before = _log(settings, topic)
    archived = _manifest(settings, topic)
    assert sum(len(s.gap_offsets) for s in archived) >= 6
    was = log_identity(settings.kafka, [topic]).topics[topic]

    _delete(settings, topic)
    code, report, err = _restore(settings, topic)
    assert code == 0, err
    [restored] = report["restored"]
    assert restored["records"] == sum(s.records for s in archived)
    assert restored["gaps"] == sum(len(s.gap_offsets) for s in archived)
    assert report["lost"] == [] and report["failed_versions"] == []
    now = log_identity(settings.kafka, [topic]).topics[topic]
    assert now != was and restored["topic_id"] == now
    # Every record at its offset: key, value, timestamp and its type, headers; gaps where they
    # were (a record's offset is part of what is compared).
    assert _log(settings, topic) == before

    # A second restore finds the topic there: nothing is written twice.
    code, again, err = _restore(settings, topic)
    assert code == 0 and again["restored"] == [] and again["kept"] == [topic], err

    # The archive goes on in the lineage it had: new records, same segments' directory.
    service.produce_sample(topic, 800, seed=144)
    assert _run(settings, topic) == 0
    after = _manifest(settings, topic)
    assert set(archived) < set(after)  # recorded segments stay; new ones follow them
    assert {(s.lineage.cluster_id, s.lineage.topic_id) for s in after} == {
        (archived[0].lineage.cluster_id, archived[0].lineage.topic_id)}
    status = json.loads(kappa_cli(settings, "archive", "status", topic, "--json").stdout)
    assert status and all(r["current"] and r["behind"] == 0 for r in status)
    verified = kappa_cli(settings, "archive", "verify", topic, "--json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["compared_with_log"] == len(after)


def test_what_a_crash_lost_before_the_archive_is_reported_by_offset(settings, topic: str
                                                                    ) -> None:
    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 2_000, seed=145)
    assert _run(settings, topic) == 0
    archived_ends = {p: e for (_, p), (_, e) in log_bounds(settings.kafka, [topic]).items()}
    service.produce_sample(topic, 1_000, seed=146)
    seen_ends = {p: e for (_, p), (_, e) in log_bounds(settings.kafka, [topic]).items()}
    # The archiver sees the new log end, then dies before its segment is in place: the broker
    # acknowledged those records, and only the broker had them.
    assert _run(settings, topic, "archive.before_rename=1*exit") != 0
    _delete(settings, topic)

    code, report, err = _restore(settings, topic)
    assert code == 0, err
    lost = {r["partition"]: (r["first_offset"], r["end_offset"]) for r in report["lost"]}
    assert lost == {p: (archived_ends[p], seen_ends[p]) for p in seen_ends
                    if seen_ends[p] > archived_ends[p]}
    assert lost  # 1,000 records over 4 partitions
    assert report["restored"][0]["ends"] == {str(p): e for p, e in archived_ends.items()}
    human = kappa_cli(settings, "archive", "restore", topic)
    assert "nothing to restore" in human.stdout

    # A second crash of the broker's new life, after everything it acknowledged was archived:
    # nothing is lost, though the first life's log had reached further (#47, path 5: the
    # highest end ever noted, across broker lives, was reported lost again).
    service.produce_sample(topic, 300, seed=147)
    assert _run(settings, topic) == 0
    second_ends = {p: e for (_, p), (_, e) in log_bounds(settings.kafka, [topic]).items()}
    assert any(second_ends[p] < seen_ends[p] for p in seen_ends)  # the case at stake
    _delete(settings, topic)
    code, report, err = _restore(settings, topic)
    assert code == 0, err
    assert report["lost"] == []
    assert report["restored"][0]["ends"] == {str(p): e for p, e in second_ends.items()}


def test_a_deleted_topic_is_never_restored(settings, topic: str) -> None:
    """#47, path 2: a topic the user deleted, found gone by the next archiver pass, ends its
    lineage, so a restore (as `kappa dev up` runs after `kappa dev down`) does not bring it
    back; a topic of that name created again starts a lineage of its own, and a restore gives
    it only its own records."""
    from orchestrator.kafka.admin import topic_names
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    other = f"{topic}_other"
    for name, seed in ((topic, 148), (other, 149)):
        service.produce_sample(name, 1_000, seed=seed)
        assert _run(settings, name) == 0
    _delete(settings, topic)
    assert _run(settings, other) == 0  # an archiver pass, which finds the topic gone

    code, report, err = _restore(settings, topic)
    assert code == 0, err
    assert report["restored"] == [] and report["lost"] == [], report
    assert report["ended"] == [topic], report
    assert topic not in topic_names(settings.kafka)

    service.produce_sample(topic, 200, seed=150)  # the name again: a new topic
    assert _run(settings, topic) == 0
    _delete(settings, topic)
    code, report, err = _restore(settings, topic)
    assert code == 0, err
    (restored,) = report["restored"]
    assert restored["records"] == 200, restored


def test_a_topic_deleted_before_any_archiver_pass_saw_it_is_not_restored(
        settings, topic: str, tmp_path) -> None:
    """#47, path 2, the deletion no archiver pass saw: a topic deleted through the stack's ack
    proxy and created again, then the broker lost before the archiver's next pass. The ledger
    kept the deletion, so the restore ends the old lineage: the old records do not come back
    into the new topic, and what the new topic was acknowledged is reported lost. The restore's
    own clients delete without ending anything (the other topic is restored).

    #61, path 6: a third topic is deleted, created again and archived by a pass, which ends
    its old lineage and meets the new one. The ledger notes the id the broker gave each topic
    it deleted; the deletion's time, from the proxy's clock, is put an hour ahead here, as a
    clock ahead of PostgreSQL's would put it. Compared by time, the new lineage was met "before"
    the deletion and was ended; by id, only what was deleted is."""
    import psutil

    from orchestrator.dev.broker_process import start_broker
    from orchestrator.dev.processes import live_process
    from orchestrator.dev.proxy_process import (
        lost_broker_acks,
        lost_broker_deletions,
        lost_ledger_path,
        retire_ledger,
    )
    from orchestrator.kafka.admin import log_identity, topic_names
    from orchestrator.service import Orchestrator

    dev = tmp_path / "dev"
    dev.mkdir()
    brokers: list = []

    def broker() -> object:
        # In memory, behind its ack proxy, as `kappa dev up` starts it; the same cluster id.
        started = start_broker(dev, None, None, archived=True)
        brokers.append(started)
        return replace(settings, kafka_bootstrap=started["kafka_bootstrap"])

    other, again = f"{topic}_other", f"{topic}_again"
    try:
        first = broker()
        service = Orchestrator(first)
        for name, count, seed in ((topic, 500, 152), (other, 300, 153), (again, 200, 155)):
            service.produce_sample(name, count, seed=seed)
            assert _run(first, name) == 0
        deleted_ids = log_identity(first.kafka, [topic, again]).topics
        _delete(first, topic)
        service.produce_sample(topic, 50, seed=154)  # the name again, not archived yet
        _delete(first, again)
        service.produce_sample(again, 40, seed=156)  # the name again, archived
        assert _run(first, again) == 0
        lost = brokers[0]
        psutil.Process(lost["broker_pid"]).kill()
        retire_ledger(dev, lost)
        deletions = lost_broker_deletions(dev)
        assert {t: d.topic_ids for t, d in deletions.items()} == {
            t: {deleted_ids[t]} for t in (topic, again)}, deletions
        ledger = lost_ledger_path(dev)
        ledger.write_text(re.sub(r"^(deleted(?:-id)? )(\d+)",
                                 lambda m: f"{m[1]}{int(m[2]) + 3_600_000}",
                                 ledger.read_text(), flags=re.MULTILINE))

        second = broker()
        report = Orchestrator(second).archive_restore(
            acknowledged=lost_broker_acks(dev), deleted=lost_broker_deletions(dev))
        assert report.ended == (topic,), report
        assert sorted((t.topic, t.records) for t in report.restored) == [
            (again, 40), (other, 300)], report
        assert topic not in topic_names(second.kafka)
        assert {r.topic for r in report.unarchived} == {topic}, report
        assert all(r.first_offset == 0 for r in report.unarchived), report
        assert sum(r.end_offset for r in report.unarchived) == 50, report
    finally:
        for started in brokers:
            for name in ("broker", "proxy"):
                process = live_process(started, name)
                if process is not None:
                    process.kill()
                    process.wait(30)


def test_a_restore_cut_off_stays_restoring_and_starts_again(settings, topic: str) -> None:
    """A restore killed after it produced a topic's records and before it read them back: the
    topic stays `restoring` (the archiver leaves it alone), and the next restore deletes it and
    restores it again, checked. One that finds records another client wrote meanwhile deletes
    nothing: the topic stays as it is, `restoring`, until someone deletes it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from orchestrator.catalog import archive_manifest
    from orchestrator.catalog.db import connect
    from orchestrator.failpoints import EXIT_STATUS
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 1_000, seed=151)
    assert _run(settings, topic) == 0
    before = _log(settings, topic)
    segments = len(_manifest(settings, topic))
    _delete(settings, topic)

    def restoring() -> list:
        with connect(settings.pg_dsn, autocommit=True) as conn:
            return [k for k in archive_manifest.known_logs(conn, settings.catalog_schema)
                    if k.identity.topic == topic and k.restoring]

    os.environ["KAPPA_FAIL_POINTS"] = "restore.before_check=1*exit"
    try:
        cut = kappa_cli(settings, "archive", "restore", topic)
    finally:
        del os.environ["KAPPA_FAIL_POINTS"]
    assert cut.returncode == EXIT_STATUS, cut.stderr
    assert restoring(), "the cut-off restore is not marked restoring"
    assert _run(settings, topic) == 0 and len(_manifest(settings, topic)) == segments
    code, report, err = _restore(settings, topic)
    assert code == 0, err
    assert [t["topic"] for t in report["restored"]] == [topic] and not restoring()
    assert _log(settings, topic) == before

    # The check reads the restored log back: a record another client wrote meanwhile fails
    # it. That record was acknowledged to its producer: the topic stays, with it (#61 path 1;
    # the restore used to delete the topic, and the record with it, unreported).
    _delete(settings, topic)
    env = {**os.environ, **settings.driver_environment(),
           "KAPPA_FAIL_POINTS": "restore.before_check=1*sleep(5000)"}
    with subprocess.Popen([str(Path(sys.executable).with_name("kappa")), "archive", "restore",
                           topic], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:  # its pipe is closed when done
        assert proc.stderr is not None
        first = proc.stderr.readline()  # its records are produced; it waits here, then checks
        assert "fail point restore.before_check: sleeping" in first, first
        service.produce_sample(topic, 1, seed=152)
        err = proc.stderr.read()
    assert proc.wait(60) != 0 and "holds records that the restore did not write" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert topic in _topics(settings), "the restore deleted a record acknowledged to a client"
    after = _log(settings, topic)
    assert sum(map(len, after.values())) == sum(map(len, before.values())) + 1
    assert restoring(), "the archiver would archive the topic as a new one"
    # As the error says: delete the topic, then restore.
    _delete(settings, topic)
    code, report, err = _restore(settings, topic)
    assert code == 0, err
    assert _log(settings, topic) == before


def _topics(settings) -> list[str]:
    from orchestrator.kafka.admin import topic_names

    return topic_names(settings.kafka)


def test_a_damaged_segment_is_never_restored(settings, topic: str) -> None:
    import pyarrow.parquet as pq

    from orchestrator.kafka.admin import log_identity
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 1_000, seed=147)
    assert _run(settings, topic) == 0
    segment = _manifest(settings, topic)[-1]
    path = settings.state_dir / "archive" / segment.path
    table = pq.read_table(path)
    values = table.column("value").to_pylist()
    values[0] = b"{}"
    pq.write_table(table.set_column(4, "value", [values]), path)
    _delete(settings, topic)

    code, _, err = _restore(settings, topic)
    assert code != 0
    [line] = err.strip().splitlines()
    print(line)  # pytest shortens a failed assertion's operands; the whole line is shown here
    assert str(path) in line, f"{path} not named"
    assert "differs from its manifest checksum" in line and "kappa dev up" in line
    # Nothing of the topic is left on the broker to pass for the log.
    assert topic in log_identity(settings.kafka, [topic]).missing
