"""A driver's log: private, and rotated at its cap with nothing lost in the newest part."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys
from pathlib import Path
from orchestrator.logfile import RotatingLog
pump = RotatingLog(Path(sys.argv[1]), 1_000_000)
pump.start()
for i in range(60_000):
    print(f"line {i:08d} " + "x" * 30)
os.system("echo from a child process")  # a JVM writes to the same pipe
pump.finish()
"""


def test_the_log_rotates_at_its_cap_and_is_private(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    subprocess.run([sys.executable, "-c", SCRIPT, str(log)], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
    older = log.with_name("driver.log.1")
    assert log.is_file() and older.is_file()
    for path in (log, older):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.stat().st_size <= 1_000_000
    lines = (older.read_text() + log.read_text()).splitlines()
    assert lines[-1] == "from a child process"
    numbers = [int(line.split()[1]) for line in lines[:-1]]
    assert numbers == list(range(numbers[0], 60_000))  # the newest part, contiguous
