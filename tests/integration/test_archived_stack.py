"""The embedded default as a user runs it: the broker keeps the log in memory and the stack's
archiver keeps its durable copy. A crash of the broker is answered by `kappa dev up` with the
same log, offset for offset; a crash of the archiver by a new one; and records that only the
broker held when it died are reported by offset, and the version that read them fails, saying
so, rather than going on over offsets that will hold other records."""

from __future__ import annotations

import json
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import job_file, wait_until
from integration.embedded_cli import (
    TOPIC,
    archive_rows,
    archived_records,
    cli,
    exact,
    kill,
    ok,
    pid_of,
    spare_ready,
    stack_json,
    tear_down,
    wait_archived,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.broker_storage("archive")]
RETRIED = "retried"  # written by a producer that retries through a broker's crash
DELETED = "deleted_by_a_client"  # archived, then deleted while no archiver runs


def test_the_archived_log_outlives_crashes_and_reports_what_only_the_broker_held(
        tmp_path: Path) -> None:
    from reference import read_records

    # mkdtemp, not tmp_path: the embedded server runs as another user (see conftest.stack).
    state = Path(tempfile.mkdtemp(prefix="kappa-archived-"))
    try:
        up = json.loads(ok(state, "dev", "up", "--json"))
        assert up["storage"] == "archive"
        assert [s["name"] for s in up["services"]] == ["postgres", "broker", "ack proxy",
                                                        "archiver", "queue keeper"]
        bootstrap = up["kafka_bootstrap"]
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "3000", "--seed", "151")
        # Transaction markers: offsets with no record, which the restore must put back too.
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "3000", "--seed", "152",
            "--transactional")
        ok(state, "produce-sample", "--topic", DELETED, "--count", "200", "--seed", "150")
        # `kappa dev up` keeps a warm spare driver, which the first deploy adopts.
        spare = up["warm_spare_pid"]
        wait_until(lambda: spare_ready(state, spare), 240, "the spare to warm")
        path = job_file(tmp_path, "v1", TOPIC)
        ok(state, "deploy", str(path), "--wait", "--timeout", "300")
        assert json.loads(ok(state, "status", "--json"))[0]["pid"] == spare
        wait_archived(state, "the stack's archiver to reach the log end")
        before = read_records(bootstrap, TOPIC)

        # A crash of the broker: `kappa dev up` starts another and restores the log into it;
        # the running version goes on from its offsets on the restored topic (its new id).
        kill(pid_of(state, "broker"))
        again = ok(state, "dev", "up")
        assert "restored pageviews: 6,000 records" in again, again
        assert "pageview_counts v1 goes on from its offsets" in again, again
        assert stack_json(state)["cluster_id"] == up["cluster_id"]
        assert read_records(bootstrap, TOPIC) == before  # offsets, timestamps, keys, values

        # A crash of the archiver: the next `kappa dev up` starts one; the broker lives on.
        # A topic that a client deletes meanwhile stays deleted (#61 path 1: `dev up`, as its
        # status told the user to run, restored it with every archived record).
        broker = pid_of(state, "broker")
        kill(pid_of(state, "archiver"))
        assert not stack_json(state)["running"]
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "400", "--seed", "153")
        _delete_topic(bootstrap, DELETED)
        again = ok(state, "dev", "up")
        assert "restored pageviews" not in again and f"restored {DELETED}" not in again, again
        assert pid_of(state, "broker") == broker
        assert DELETED not in _topics(bootstrap)
        wait_archived(state, "the new archiver to catch up")
        ok(state, "wait", "pageview_counts", "v1", "--timeout", "300")
        assert exact(state), "v1's output after the broker's crash differs from the log's"
        v1 = next(v for v in json.loads(ok(state, "status", "--json"))
                  if v["version"] == "v1")
        assert v1["state"] in ("caught_up", "live") and v1["attempt"] == 2, v1

        # The version reads records that only the broker holds: the archiver is held, and a
        # pass that sees the new log end dies before its segment is in place.
        archiver = psutil.Process(pid_of(state, "archiver"))
        archiver.send_signal(signal.SIGSTOP)
        archived_end = {(r["partition"]): r["archived_end"] for r in json.loads(
            ok(state, "archive", "status", TOPIC, "--json"))}
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "800", "--seed", "154")
        ok(state, "wait", "pageview_counts", "v1", "--timeout", "300")
        died = cli(state, "archive", "run", "--once", TOPIC,
                    fail_points="archive.before_rename=1*exit")
        assert died.returncode != 0
        seen_end = {(r["partition"]): r["log_end"] for r in json.loads(
            ok(state, "archive", "status", TOPIC, "--json"))}
        kill(pid_of(state, "broker"))
        archiver.kill()

        crashed = json.loads(ok(state, "dev", "up", "--json"))["restore"]
        assert crashed["ended"] == [DELETED]  # deleted before the broker was lost: not restored
        assert DELETED not in _topics(bootstrap)
        lost = {r["partition"]: (r["first_offset"], r["end_offset"]) for r in crashed["lost"]}
        assert lost == {p: (archived_end[p], seen_end[p]) for p in seen_end
                        if seen_end[p] > archived_end[p]} != {}
        [failed] = crashed["failed_versions"]
        assert failed.startswith("pageview_counts/v1: the log this version read is gone")
        v1 = next(v for v in json.loads(cli(state, "status", "--json", traceback_ok=True)
                                        .stdout) if v["version"] == "v1")
        assert v1["state"] == "failed" and "lost with the broker" in v1["reason"]
        assert v1["log_gone"]
        refused = cli(state, "restart", "pageview_counts", "v1")
        assert refused.returncode != 0 and "new VERSION" in refused.stderr

        # `kappa dev down` withdraws the spares this stack's commands started.
        ok(state, "dev", "down")
        assert _spares_started_by(state) == []
    finally:
        tear_down(state)


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer comes
    admin.delete_topics([topic])[topic].result(30)
    wait_until(lambda: topic not in _topics(bootstrap), 30, f"{topic} to be deleted")


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    # No auto-creation: a Metadata request that named the topic would create it again.
    listed = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return set(listed.topics)


def _spares_started_by(state: Path) -> list[int]:
    from orchestrator.settings import Settings
    from orchestrator.spark.launch import launcher, spares

    directory = spares.spare_dir(Settings())  # the host's, as the commands above had it
    return [s.pid for s in spares.spares(directory) if launcher.is_alive(s.pid, s.started)
            and spares.started_by(directory, s.pid) == str(state)]


class _Writer:
    """A producer writing about 1,000 records/s in a thread, as an application does, keeping
    what the broker acknowledged: {(partition, offset): value}."""

    def __init__(self, bootstrap: str, records: list[tuple[bytes | None, bytes | None]],
                 topic: str = TOPIC, reconnect_max_ms: int = 10_000) -> None:
        self.bootstrap, self.records, self.topic = bootstrap, records, topic
        self.reconnect_max_ms = reconnect_max_ms
        self.acked: dict[tuple[int, int], bytes | None] = {}
        # (partition, offset, value) in the order heard: a log restored under the producer may
        # take new records at the offsets of lost ones.
        self.heard: list[tuple[int, int, bytes | None]] = []
        # (when, how many acknowledgements had been heard) each time librdkafka said that all
        # its brokers were down.
        self.all_down: list[tuple[float, int]] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import KafkaError, Producer

        # Batches of 100 ms, as an application's producer fills them: Tansu's memory storage
        # lists every batch of a partition at each Fetch, and 5 ms batches (about 400 a second
        # from two writers) slowed its Fetches past the archiver's 10 s as the logs grew, so
        # that a topic's first pass never came (CI, twice: no record of RETRIED archived).
        def error(err: Any) -> None:
            if err.code() == KafkaError._ALL_BROKERS_DOWN:
                self.all_down.append((time.monotonic(), len(self.heard)))

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 100,
                             "message.timeout.ms": 5000,
                             "reconnect.backoff.max.ms": self.reconnect_max_ms,
                             "error_cb": error})

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                self.acked[(msg.partition(), msg.offset())] = msg.value()
                self.heard.append((msg.partition(), msg.offset(), msg.value()))
            else:
                self.refused += 1

        i = 0
        while not self._stop.wait(0.01):
            for _ in range(10):
                key, value = self.records[i % len(self.records)]
                i += 1
                try:
                    producer.produce(self.topic, key=key, value=value,
                                     on_delivery=delivered)
                except BufferError:  # the broker is away: the queue is full
                    break
            producer.poll(0)
        producer.flush(15)

    def more(self, count: int, what: str) -> None:
        floor = len(self.acked)
        wait_until(lambda: len(self.acked) >= floor + count, 60, what)

    def went_down(self, since: float) -> int | None:
        """How many acknowledgements had been heard when librdkafka first said, after
        ``since``, that all its brokers were down; None before it did. It queues that event
        behind the delivery reports of the connection whose end it reports, and both are
        served in order by one poll: every acknowledgement of the brokers it had is heard by
        then."""
        return next((heard for at, heard in self.all_down if at >= since), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_sigkills_of_the_archiver_postgres_and_broker_while_a_producer_writes(
        tmp_path: Path) -> None:
    """Each part of the stack is killed while an application writes, then `kappa dev up`:
    nothing that was acknowledged and archived is lost; what the broker alone held is lost
    only past the archive's end, with no hole, is reported to the offset, and a version that
    had read it fails, saying so."""
    from reference import read_records

    state = Path(tempfile.mkdtemp(prefix="kappa-archived-"))
    try:
        bootstrap = json.loads(ok(state, "dev", "up", "--json", spares=False))["kafka_bootstrap"]
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "3000", "--seed", "161")
        ok(state, "deploy", str(job_file(tmp_path, "v1", TOPIC)), "--wait", "--timeout", "300")
        samples = [(key, value) for _, _, _, key, value in read_records(bootstrap, TOPIC)]

        # Without the ack proxy, clients cannot reach the broker: an outage until `kappa dev up`.
        for name, writes_on in (("archiver", True), ("postgres", True), ("ack proxy", False)):
            writer = _Writer(bootstrap, samples)
            writer.more(2000, f"the producer to write before the {name} is killed")
            kill(pid_of(state, name))
            if writes_on:
                writer.more(1000, f"the producer to write on after the {name} was killed")
            ok(state, "dev", "up", spares=False)
            writer.more(1000, f"the producer to write on after the {name} came back")
            writer.stop()
            wait_archived(state, f"the archive to catch up after the {name}")
            log = {(p, o): v for p, o, _, _, v in read_records(bootstrap, TOPIC)}
            assert all(log.get(at) == value for at, value in writer.acked.items()), name
            verified = json.loads(ok(state, "archive", "verify", TOPIC, "--json"))
            assert verified["compared_with_log"] == verified["segments"] > 0, verified
        ok(state, "wait", "pageview_counts", "v1", "--timeout", "300")
        assert exact(state), "v1's output after the archiver's and PostgreSQL's crashes differs"

        # The archiver dies first, so the broker alone holds what it acknowledges from then on
        # (for far longer than the 0.2 s between the archiver's notes of the log ends).
        writer = _Writer(bootstrap, samples)
        # Another application keeps producing through the broker's crash and `kappa dev up`,
        # reconnecting every half second: it must not reach the new broker before the restore
        # has put its topic back (#47, path 1).
        retrier = _Writer(bootstrap, samples, topic=RETRIED, reconnect_max_ms=500)
        writer.more(2000, "the producer to write before the archiver is killed")
        retrier.more(1000, "the retrying producer to write before the archiver is killed")
        wait_archived(state, f"the archiver to archive 500 records of {RETRIED}",
                       lambda: archived_records(state, RETRIED) >= 500, RETRIED)
        kill(pid_of(state, "archiver"))
        ok(state, "produce-sample", "--topic", "unseen", "--count", "500", "--seed", "162")
        writer.more(1000, "the producer to write before the broker is killed")
        retrier.more(500, "the retrying producer to write before the broker is killed")
        # v1 reads records that only the broker holds before it dies: the branch below where
        # a version read lost records always runs.
        held = {r["partition"]: r["archived_end"] or 0 for r in json.loads(
            ok(state, "archive", "status", TOPIC, "--json")) if r["current"]}

        def read_past_the_archive() -> bool:
            v1 = next(v for v in json.loads(ok(state, "status", "--json"))
                      if v["version"] == "v1")
            return any(int(o) > held.get(int(p), 0)
                       for p, o in v1["processed_offsets"].get(TOPIC, {}).items())

        wait_until(read_past_the_archive, 120, "v1 to read records only the broker holds")
        before_kill = time.monotonic()
        kill(pid_of(state, "broker"))
        writer.stop()
        # The new broker starts only after the retrying producer has heard all the lost one
        # acknowledged, so that its acknowledgements split exactly into the lost broker's and
        # the new one's, however late a loaded machine lets it hear them.
        wait_until(lambda: retrier.went_down(before_kill) is not None, 120,
                   "the retrying producer to hear that its broker is gone")
        heard_from_the_lost_broker = retrier.went_down(before_kill)
        assert heard_from_the_lost_broker is not None
        before_up = {(r["partition"]): r["archived_end"] for r in json.loads(
            ok(state, "archive", "status", TOPIC, "--json"))}
        v1 = next(v for v in json.loads(ok(state, "status", "--json")) if v["version"] == "v1")
        read = {int(p): e for p, e in v1["processed_offsets"][TOPIC].items()}
        # Three seconds in which the retrying producer, let in, would recreate its topic.
        up = cli(state, "dev", "up", "--json", fail_points="restore.start=1*sleep(3000)",
                 spares=False)
        assert up.returncode == 0, up.stderr
        report = json.loads(up.stdout)["restore"]
        retrier.more(300, "the retrying producer to write once the restore is done")
        retrier.stop()
        _check_retried(bootstrap, retrier, heard_from_the_lost_broker, report)
        restored = read_records(bootstrap, TOPIC)
        ends: dict[int, int] = {}
        for p, o, _, _, _ in restored:
            ends[p] = max(ends.get(p, 0), o + 1)
        # Everything archived came back; what was acknowledged and is not back lies past the
        # restored end of its partition (no hole), and is reported where the stack saw it.
        assert all(ends.get(p, 0) >= end for p, end in before_up.items()), (ends, before_up)
        log = {(p, o): v for p, o, _, _, v in restored}
        missing = {at for at in writer.acked if at not in log}
        assert all(o >= ends.get(p, 0) for p, o in missing), sorted(missing)[:5]
        assert all(log[at] == value for at, value in writer.acked.items() if at in log)
        lost = {r["partition"]: (r["first_offset"], r["end_offset"]) for r in report["lost"]
                if r["topic"] == TOPIC}
        # A topic the archiver never saw is lost whole, and said so.
        unseen = [(r["first_offset"], r["end_offset"]) for r in report["lost"]
                  if r["topic"] == "unseen"]
        assert all(first == 0 for first, _ in unseen), unseen
        assert sum(end for _, end in unseen) == 500, unseen
        assert all(first == ends.get(p, 0) for p, (first, _) in lost.items()), (lost, ends)
        assert all(first < end for first, end in lost.values()), lost
        past = {p for p, n in read.items() if n > ends.get(p, 0)}
        assert past <= set(lost), (past, lost)
        after = next(v for v in json.loads(cli(state, "status", "--json", traceback_ok=True)
                                           .stdout) if v["version"] == "v1")
        assert past, (read, ends)  # v1 had read records that only the broker held
        assert after["state"] == "failed" and "lost with the broker" in after["reason"]
        unreported = [(p, o) for p, o in missing
                      if not lost.get(p, (0, 0))[0] <= o < lost.get(p, (0, 0))[1]]
        print(f"acknowledged {len(writer.acked)}, {len(missing)} lost past the archive, "
              f"{len(unreported)} of them unreported, reported {lost}, v1 read past it: "
              f"{sorted(past)}, {writer.refused} told they failed")
        # What the producer was told is safe is reported to the offset: the stack's ack proxy
        # noted every acknowledgement before the producer heard of it.
        acked_ends: dict[int, int] = {}
        for p, o in writer.acked:
            acked_ends[p] = max(acked_ends.get(p, 0), o + 1)
        assert not unreported, f"{len(unreported)} acknowledged records lost unreported"
        assert {p for p, end in acked_ends.items() if end > ends.get(p, 0)} <= set(lost), lost
        # The report runs to what the broker acknowledged: past what the producer heard only by
        # acknowledgements still on their way when the broker died, which the producer was told
        # had failed (it never hears of a record twice).
        beyond_heard = sum(end - max(acked_ends.get(p, 0), first)
                           for p, (first, end) in lost.items())
        assert 0 <= beyond_heard <= writer.refused, (lost, acked_ends, writer.refused)
    finally:
        tear_down(state)


def _check_retried(bootstrap: str, retrier: _Writer, from_the_lost_broker: int,
                   report: dict[str, Any]) -> None:
    """What the lost broker acknowledged (the first ``from_the_lost_broker`` acknowledgements
    heard) is back at its offset or in a LOST range; what the new broker acknowledged, after
    the restore, is in the log."""
    from reference import read_records

    log = {(p, o): v for p, o, _, _, v in read_records(bootstrap, RETRIED)}
    lost = {r["partition"]: (r["first_offset"], r["end_offset"]) for r in report["lost"]
            if r["topic"] == RETRIED}
    old = retrier.heard[:from_the_lost_broker]
    new = retrier.heard[from_the_lost_broker:]
    lost_unreported = [(p, o) for p, o, v in old if log.get((p, o)) != v
                       and not lost.get(p, (0, 0))[0] <= o < lost.get(p, (0, 0))[1]]
    assert old and new, (len(old), len(new))
    assert not lost_unreported, (f"{len(lost_unreported)} of {len(old)} acknowledged records "
                                 f"of {RETRIED} lost unreported, e.g. {lost_unreported[:3]}; "
                                 f"reported {lost}")
    assert all(log.get((p, o)) == v for p, o, v in new)


def test_what_the_broker_acknowledged_while_a_pass_hangs_is_reported_when_it_is_lost(
        tmp_path: Path) -> None:
    """A pass of the archiver hangs while it writes a segment (a slow archive_root); the broker
    acknowledges more records meanwhile and then dies. Every one of them is reported by offset:
    the archiver notes the log ends beside its passes, not only as a pass begins."""
    state = Path(tempfile.mkdtemp(prefix="kappa-archived-"))

    def rows() -> list[dict[str, Any]]:
        return [r for r in archive_rows(state) if r["current"]]

    def noted() -> list[dict[str, Any]] | None:
        found = rows()
        return found if found and all(r["noted_end"] == r["log_end"] for r in found) else None

    try:
        ok(state, "dev", "up", spares=False)
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "2000", "--seed", "171")
        wait_archived(state, "the stack's archiver to reach the log end")
        kill(pid_of(state, "archiver"))
        # Held until the archiver is killed: never released.
        started = cli(state, "dev", "up", fail_points="archive.before_record=pause", spares=False,
                       release=tmp_path)
        assert started.returncode == 0, started.stderr
        # A pass that notes these ends goes on to write their segment, and hangs there.
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "10", "--seed", "172")
        wait_until(noted, 120, "the new archiver's pass to note the log ends")
        ok(state, "produce-sample", "--topic", TOPIC, "--count", "1000", "--seed", "173")
        found = wait_until(noted, 120, "the log ends to be noted while the pass hangs")
        assert isinstance(found, list)
        at_risk = {r["partition"]: (r["archived_end"], r["log_end"]) for r in found
                   if r["log_end"] > r["archived_end"]}
        assert sum(end - first for first, end in at_risk.values()) >= 1000, at_risk

        kill(pid_of(state, "broker"))
        kill(pid_of(state, "archiver"))
        report = json.loads(ok(state, "dev", "up", "--json", spares=False))["restore"]
        lost = {r["partition"]: (r["first_offset"], r["end_offset"]) for r in report["lost"]}
        assert lost == at_risk
    finally:
        tear_down(state)
