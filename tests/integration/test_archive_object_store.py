"""The archive on an S3-compatible object store (s3rver, the embedded stack's S3 server): a
segment written there reads back as written.

AWS SDK for C++ releases since early 2025, inside pyarrow, sign every PUT with a trailing
checksum in `aws-chunked` encoding by default. Stores that do not decode it (s3rver, older
MinIO, several clouds' S3 APIs) then keep the chunk framing as the object's bytes: the write
"succeeds", and every later read of the segment fails."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import wait_until

pytestmark = [pytest.mark.integration]
BUCKET = "kappa-archive"


@pytest.fixture
def s3_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import socket

    from orchestrator.dev.log_store import s3rver_path
    from orchestrator.dev.processes import free_port
    from orchestrator.process import stop_process

    port = free_port()
    (tmp_path / "s3").mkdir()
    with open(tmp_path / "s3.log", "wb") as log:
        proc = subprocess.Popen([str(s3rver_path()), "--directory", str(tmp_path / "s3"),
                                 "--port", str(port), "--address", "127.0.0.1", "--silent",
                                 "--configure-bucket", BUCKET], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 30, "s3rver to listen", poll_s=0.2)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")  # s3rver's documented pair
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
        yield (f"s3://{BUCKET}/archive?endpoint_override=127.0.0.1:{port}&scheme=http"
               "&region=us-east-1")
    finally:
        stop_process(proc)


def test_a_segment_written_to_an_s3_store_reads_back_as_written(s3_root: str) -> None:
    """Run in a process of its own: the AWS SDK reads its settings once per process."""
    script = (
        "import sys\n"
        "from orchestrator.archive.parquet_store import ParquetStore\n"
        "from orchestrator.archive_model.segments import checksum\n"
        "records = [(i, 1_700_000_000_000 + i, 1, str(i % 7).encode(), b'{\"n\": %d}' % i,\n"
        "            [('h', b'v')] if i % 100 == 0 else None) for i in range(3_000)]\n"
        "store = ParquetStore(sys.argv[1])\n"
        "store.write('t/p0/seg.parquet', records)\n"
        "back = store.read('t/p0/seg.parquet')\n"
        "assert back == records, 'different records'\n"
        "print(checksum(back) == checksum(records))\n")
    import sys

    done = subprocess.run([sys.executable, "-c", script, s3_root], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
