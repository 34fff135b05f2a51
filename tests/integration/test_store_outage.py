"""The object store holding the archive (archive_root) goes away while a replay needs it
(README, When things go wrong): the read is retried as an outage, the version shows `stalled`
with the store's error once its offsets have not moved for a window, and it resumes by itself,
with exact output read from the archive. A store that refuses the key stops the version with
that error instead.

Why: a replay of an archived log reads its segments from the store, on the driver (which
segments are there) and in the read tasks (the segments themselves). An outage of the store
must read as one in both places; in a read task the store's error reaches the driver wrapped
in the archive's own error for a segment gone or damaged, which fails a version at once.

The store is a real S3 server (s3rver, the embedded stack's). The test suspends it (SIGSTOP:
requests connect and nothing answers, until the AWS SDK gives up), kills it while the read
tasks are held at the `source.read` fail point (connection refused), and starts it again on
the same port and directory. s3rver checks the access key id but not a V4 signature, so the
refused key is an unknown key id in the driver's own environment, where the SDK reads it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lag import Thresholds

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import (
    assert_batches_tile_the_log,
    dead_letters,
    output,
    query,
    stop_drivers,
)
from reference import Reference, compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
BUCKET = "kappa-archive"
# s3rver's documented key pair: it guards nothing but a port of this test.
S3_KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
RECORDS = 6_000
WINDOW = Thresholds(window_s=5.0)  # `kappa lag --window 5`: a stall shows within seconds
OUTAGE = "retrying after unreachable service"
# One try of a request to a store that does not answer takes the AWS SDK about 100 s, with
# its retries; a driver starts in 10-60 s on a loaded machine.
STALL_TIMEOUT_S = 420


class Store:
    """An s3rver on a port and a directory of its own, which the test takes away."""

    def __init__(self, directory: Path, log: Path):
        from orchestrator.dev.processes import free_port

        self.directory, self.log, self.port = directory, log, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = (f"s3://{BUCKET}/archive?endpoint_override=127.0.0.1:{self.port}"
                     "&scheme=http&region=us-east-1")

    def start(self) -> None:
        from orchestrator.dev.log_store import s3rver_path

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(s3rver_path()), "--directory", str(self.directory), "--port",
                 str(self.port), "--address", "127.0.0.1", "--silent", "--configure-bucket",
                 BUCKET], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._listening, 30, "s3rver to listen", poll_s=0.2)

    def _listening(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None and self.proc.poll() is None, "s3rver is not running"
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        from orchestrator.process import stop_process

        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGCONT)  # a suspended one cannot exit
            stop_process(self.proc)
            self.proc = None


@dataclass(frozen=True)
class Archived:
    store: Store
    settings: Any
    service: Any
    topic: str
    reference: Reference


@pytest.fixture
def archived(settings: Any, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[Archived]:
    """A topic whose whole log the archive holds, in an S3 store; every driver stopped after."""
    from orchestrator.service import Orchestrator

    (tmp_path / "s3").mkdir()
    store = Store(tmp_path / "s3", tmp_path / "s3.log")
    for key, value in S3_KEYS.items():
        monkeypatch.setenv(key, value)
    store.start()
    # No warm spare: one started before this test has not the key pair in its environment
    # (the AWS SDK reads it once per process).
    settings = replace(settings, archive_root=store.root, warm_spares=0)
    service = Orchestrator(settings)
    try:
        service.produce_sample(topic, RECORDS, seed=317)
        done = kappa_cli(settings, "archive", "run", "--once", topic)
        assert done.returncode == 0, done.stderr
        # s3rver keeps an object KEY as the file KEY._S3rver_object.
        assert list((store.directory / BUCKET).rglob("*.parquet._S3rver_object")), \
            "no segment in the store"
        reference = compute(settings.kafka_bootstrap, topic)
        assert reference.records == RECORDS
        yield Archived(store, settings, service, topic, reference)
    finally:
        try:
            stop_drivers(service)
        finally:
            store.stop()


def _archived_offsets(settings: Any, version: str) -> int:
    """Offsets the version's applied batches read from the archive."""
    schema = settings.catalog_schema
    ((total,),) = query(
        settings, f"SELECT coalesce(sum(b.archived_offsets), 0) FROM {schema}.batches b JOIN "
        f"{schema}.job_versions v ON v.id = b.version_id WHERE v.job = %s AND v.version = %s",
        JOB, version)
    return int(total)


def _stalled(service: Any, version: str, *phrases: str) -> Any:
    """The version's lag once it is stalled with a reason that has all of ``phrases``; the
    version must neither fail nor retry the store's error as anything but an outage."""
    def look() -> Any:
        st = service.version_status(JOB, version)
        assert st.state.value != "failed", f"{version} failed: {st.reason}"
        assert not (st.reason or "").startswith("retrying after failure"), st.reason
        (lag,) = service.lag(JOB, version, WINDOW)
        ok = lag.state == "stalled" and all(p in (lag.reason or "") for p in phrases)
        return lag if ok else None

    lag = wait_until(look, STALL_TIMEOUT_S, f"{version} to be stalled with {phrases}",
                     poll_s=1.0)
    print(f"{version} stalled: {lag.reason}")
    return lag


def test_a_store_away_stalls_the_replay_with_its_error_and_it_resumes_by_itself(
        archived: Archived, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.failpoints import release

    store, settings, service = archived.store, archived.settings, archived.service
    released = tmp_path / "released"
    released.mkdir()
    driver_log = settings.state_dir / "logs" / f"{JOB}__v1.log"

    def logged(text: str) -> bool:
        return driver_log.exists() and text in driver_log.read_text(errors="replace")

    # The read tasks wait at the fail point until released: the store can go away while they
    # are about to read their segments, not only before the driver plans them.
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "source.read=pause")
    monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(released))
    store.signal(signal.SIGSTOP)  # away: connections are accepted, and nothing answers
    try:
        service.deploy(job_file(tmp_path, "v1", archived.topic))
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        # The driver's look at which segments the store holds times out.
        lag = _stalled(service, "v1", f"{OUTAGE}: ", "AWS Error NETWORK_CONNECTION",
                       "Timeout was reached")
        assert lag.reason.startswith(OUTAGE), lag.reason
        assert lag.lag_records == RECORDS and lag.run_state.value == "replaying", lag
        assert service.version_status(JOB, "v1").reason == lag.reason  # `kappa status` too
    finally:
        store.signal(signal.SIGCONT)

    # Back: the batch is planned, and its read tasks are held before they read a segment.
    wait_until(lambda: logged("fail point source.read: paused"), 240,
               "the read tasks to reach the archive's segments")
    assert _archived_offsets(settings, "v1") == 0
    store.stop()  # gone: connections are refused
    release(released, "source.read")
    # The read tasks' error, relayed from the executor, is taken for the outage it is.
    def retried() -> bool:
        st = service.version_status(JOB, "v1")
        assert st.state.value != "failed", f"v1 failed: {st.reason}"
        return logged("query failed (unreachable service: ArchiveError: cannot read a segment: ")

    wait_until(retried, 240, "the failed read of a segment to be retried", poll_s=1.0)
    _stalled(service, "v1", f"{OUTAGE}: ", "AWS Error NETWORK_CONNECTION",
             "Could not connect to server")

    # The store starts again on its port, with its directory: the version resumes by itself.
    store.start()

    def progressed() -> bool:
        st = service.version_status(JOB, "v1")
        assert st.state.value != "failed", f"v1 failed: {st.reason}"
        return st.caught_up(0) or not (st.reason or "").startswith("retrying after")

    wait_until(progressed, 240, "v1 to make progress once the store is back", poll_s=1.0)
    service.wait(JOB, "v1", timeout_s=300)
    reference = archived.reference
    assert output(settings, f"{JOB}__v1") == reference.v1
    assert dead_letters(settings, f"{JOB}__v1__dead_letters") == reference.invalid_offsets
    assert_batches_tile_the_log(settings, JOB, "v1", archived.topic, reference.log_end)
    assert _archived_offsets(settings, "v1") == reference.records  # all from the archive


def test_a_store_that_refuses_the_key_fails_the_version_with_its_error(
        archived: Archived, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = archived.service
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NOT-A-KEY-OF-THIS-STORE")
    service.deploy(job_file(tmp_path, "v2", archived.topic))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEYS["AWS_ACCESS_KEY_ID"])
    reasons: list[str] = []

    def ended() -> Any:
        st = service.version_status(JOB, "v2")
        reasons.append(st.reason or "")
        assert not st.caught_up(0), "v2 read the archive with a key the store refuses"
        return st if st.state.value == "failed" else None

    # A refusal is no outage, and asking again cannot help: the version fails at once.
    st = wait_until(ended, 300, "v2 to fail on the refused key", poll_s=1.0)
    print(f"v2 failed: {st.reason}")
    assert st.reason is not None and "AWS Error ACCESS_DENIED" in st.reason, st.reason
    assert "refused this driver" in st.reason and "kappa restart" in st.reason, st.reason
    assert not any(r.startswith("retrying after") for r in reasons), reasons
    log = (archived.settings.state_dir / "logs" / f"{JOB}__v2.log").read_text(errors="replace")
    assert "restarting it from the checkpoint" not in log, log[-3000:]
    assert _archived_offsets(archived.settings, "v2") == 0
