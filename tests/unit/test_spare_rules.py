"""The README's promises about warm spares, on real files, sockets and processes (a sleeper
stands for the spare's driver; the JVM is not the point): two deploys never adopt one spare, a
host keeps at most three spares per `warm_spares`, a spare is started only when memory allows
two of it, and a deploy that found no spare starts none (#47)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from orchestrator.settings import Settings
from orchestrator.spark.launch import launcher, spares

ENV = {"PATH": "/usr/bin"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    state = tmp_path / "state"
    state.mkdir()
    return Settings(state_dir=state, pg_dsn="postgresql://u@h/db",
                    kafka_bootstrap="127.0.0.1:9092", spare_dir=tmp_path / "spares")


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(10)


def _sleeper(sleepers: list[subprocess.Popen[bytes]]) -> int:
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    sleepers.append(proc)
    return proc.pid


def _ready_spare(settings: Settings, pid: int, answers: list[int]) -> threading.Thread:
    """A warm spare's files, as spare.py leaves them: its record and a socket that says yes to
    every deploy that reaches it (each noted in ``answers``), for 3 s: only the claim, the
    socket's atomic rename, keeps a second deploy from reaching it."""
    directory = spares.spare_dir(settings)
    (directory / f"{pid}.json").write_text(json.dumps({
        "pid": pid, "started": psutil.Process(pid).create_time(),
        "fingerprint": spares.fingerprint(settings, ENV), "state_dir": str(settings.state_dir)}))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / f"{pid}.sock"))
    server.listen(4)

    def serve() -> None:
        server.settimeout(3.0)
        try:
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.makefile("rb").readline()
                    answers.append(pid)
                    conn.sendall(b'{"adopted": true}\n')
        except TimeoutError:
            server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_two_deploys_at_once_never_adopt_one_spare(settings: Settings, sleepers: list,
                                                   tmp_path: Path) -> None:
    pid = _sleeper(sleepers)
    answers: list[int] = []
    serving = _ready_spare(settings, pid, answers)
    results: list[object] = []
    go = threading.Barrier(8)

    def deploy(n: int) -> None:
        go.wait()
        results.append(spares.adopt(settings, ENV, "job", f"v{n}", 1, tmp_path / f"{n}.log"))

    threads = [threading.Thread(target=deploy, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    serving.join(10)
    assert answers == [pid]
    assert sorted(map(str, results)) == sorted([str((pid, psutil.Process(pid).create_time())),
                                                *["None"] * 7])


def test_a_host_keeps_at_most_three_spares_per_warm_spares(
        settings: Settings, sleepers: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spares, "spawn_detached", lambda *a, **k: _sleeper(sleepers))
    monkeypatch.setattr(spares, "memory_allows", lambda s: True)
    kept = [spares.keep(settings, {**ENV, "JAVA_HOME": f"/jdk{n}"}) for n in range(5)]
    assert [pid is not None for pid in kept] == [True, True, True, False, False]
    assert spares.keep(settings, {**ENV, "JAVA_HOME": "/jdk0"}) is None  # one fits already
    two = replace(settings, warm_spares=2)
    assert spares.keep(two, {**ENV, "JAVA_HOME": "/jdk9"}) is not None  # 3 x 2 = 6 now


def test_a_spare_starts_only_where_memory_holds_two_of_it(
        settings: Settings, sleepers: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spares, "spawn_detached", lambda *a, **k: _sleeper(sleepers))
    cost = spares.cost_bytes(settings)
    for available, started in ((2 * cost - 1, False), (2 * cost, True)):
        monkeypatch.setattr(spares.psutil, "virtual_memory",
                            lambda a=available: SimpleNamespace(available=a))
        assert (spares.keep(settings, ENV) is not None) is started, available


def test_a_deploy_that_found_no_spare_starts_none(
        settings: Settings, sleepers: list, monkeypatch: pytest.MonkeyPatch) -> None:
    kept: list[object] = []
    monkeypatch.setattr(spares, "keep", lambda *a, **k: kept.append(a) or None)
    monkeypatch.setattr(launcher, "spawn_detached", lambda *a, **k: _sleeper(sleepers))
    monkeypatch.setattr(launcher.cds, "build_in_background", lambda: None)
    monkeypatch.setattr(launcher, "driver_environment", lambda s: dict(ENV))
    driver = launcher.launch(settings, "job", "v1", 1)
    assert driver.pid and kept == []
    assert os.path.exists(driver.log_path)
