"""A real Airflow for the DAG tests: its own AIRFLOW_HOME (sqlite), our dags/ folder, and the
catalog and broker given as Airflow Connections (with a password, to check it never leaks)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from conftest import ROOT, env_of_a_user, wait_until
from integration.observability import free_port

BIN = Path(sys.executable).parent
# Trust auth ignores it, so the catalog works, but every place it could leak to is checked.
SECRET = "pw-3f9c-never-print-me"


def airflow_env(settings: Any, home: Path, project: Path) -> dict[str, str]:
    """Environment for `airflow` commands: the DSN and bootstrap only through Connections."""
    from psycopg.conninfo import conninfo_to_dict

    dsn = conninfo_to_dict(settings.pg_dsn)
    host, port = settings.kafka_bootstrap.rsplit(":", 1)
    kappa = {k: v for k, v in settings.driver_environment().items()
             if k not in ("KAPPA_PG_DSN", "KAPPA_KAFKA_BOOTSTRAP")}
    # The driver start log stays: the drivers that Airflow's tasks start count for the test.
    env = {k: v for k, v in env_of_a_user().items() if not k.startswith(("AIRFLOW", "PYTEST"))}
    env.update(kappa)
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "KAPPA_PROJECT_DIR": str(project),
        "AIRFLOW_CONN_KAPPA_POSTGRES": json.dumps({
            "conn_type": "postgres", "host": dsn.get("host"), "port": dsn.get("port"),
            "login": dsn.get("user"), "password": SECRET, "schema": dsn.get("dbname")}),
        "AIRFLOW_CONN_KAPPA_KAFKA": json.dumps({"conn_type": "kafka", "host": host,
                                                "port": int(port)}),
    })
    home.mkdir(parents=True, exist_ok=True)
    return env


def airflow(env: dict[str, str], *args: str, timeout: float = 600
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "airflow"), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=env["AIRFLOW_HOME"], check=False)


def migrate(env: dict[str, str]) -> None:
    """An Airflow database at its current schema in ``AIRFLOW_HOME``: migrated once per
    Airflow version and interpreter (the first test to ask, under a lock), then copied."""
    import fcntl
    import hashlib
    import shutil
    import tempfile
    from importlib.metadata import version

    key = hashlib.sha256(f"{sys.executable} {version('apache-airflow')}".encode()).hexdigest()
    template = Path(tempfile.gettempdir()) / f"kappa-airflow-db-{key[:16]}"
    template.mkdir(exist_ok=True)
    database = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    began = time.monotonic()
    with (template / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (template / "airflow.db").is_file():
            shutil.copyfile(template / "airflow.db", database)
            print(f"airflow db copied from {template}: {time.monotonic() - began:.1f}s")
            return
        done = airflow(env, "db", "migrate")
        print(f"airflow db migrate: {time.monotonic() - began:.1f}s")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        shutil.copyfile(database, template / "airflow.db.tmp")
        os.replace(template / "airflow.db.tmp", template / "airflow.db")


def dags_test(env: dict[str, str], dag_id: str, conf: dict[str, Any]
              ) -> tuple[subprocess.CompletedProcess[str], str]:
    """`airflow dags test` with a conf; returns the process and the run id."""
    began = time.monotonic()
    done = airflow(env, "dags", "test", dag_id, "-c", json.dumps(conf))
    print(f"airflow dags test {dag_id}: {time.monotonic() - began:.1f}s")
    found = re.search(r"DagRun Finished: dag_id=\w+, .*?run_id=([^,\s]+),", done.stdout +
                      done.stderr)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    return done, found.group(1)


@contextmanager
def standalone(env: dict[str, str]) -> Iterator[str]:
    """`airflow standalone` (scheduler, triggerer, DAG processor, API server) on loopback;
    yields its base URL. Its children rename themselves, so it runs in a process group of its
    own, and the whole group is stopped."""
    port = free_port()
    env = dict(env, **{
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
        # A task's calls to the execution API give up after 5 s and 5 tries (~30-40 s in all) by
        # default. On two cores that the suite keeps busy, the one API worker took 20 s to answer
        # a task's first call (PATCH .../run, logged as 400: the client had hung up); a longer
        # stall fails the task before its code runs. 30 s, as the tests' own reads.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
    })
    home = Path(env["AIRFLOW_HOME"])
    with open(home / "standalone.out", "wb") as sink:
        proc = subprocess.Popen([str(BIN / "airflow"), "standalone"], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url) or proc.poll() is not None, 240,
                   "airflow standalone to serve its API")
        assert proc.poll() is None, (home / "standalone.out").read_text()[-3000:]
        yield url
    finally:
        _stop_group(proc)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5) as response:
            health = json.loads(response.read())
    except OSError:
        return False
    return all(health.get(part, {}).get("status") == "healthy"
               for part in ("metadatabase", "scheduler", "triggerer"))


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    def gone() -> bool:
        return proc.poll() is not None and not _group_alive(proc.pid)

    for sig, grace in ((signal.SIGTERM, 40), (signal.SIGKILL, 20)):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with suppress(AssertionError):
            wait_until(gone, grace, "airflow and its children to exit")
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def token(url: str, home: Path) -> str:
    passwords = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
    body = json.dumps({"username": "admin", "password": passwords["admin"]}).encode()
    request = urllib.request.Request(f"{url}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["access_token"])


def api(url: str, tok: str, path: str, body: dict[str, Any] | None = None,
        method: str | None = None) -> Any:
    request = urllib.request.Request(
        f"{url}/api/v2{path}", data=json.dumps(body).encode() if body is not None else None,
        method=method or ("POST" if body is not None else "GET"),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {tok}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # with what the API said, not only its status
        raise urllib.error.HTTPError(
            exc.url, exc.code, f"{exc.reason} ({request.method} {path}): "
            f"{exc.read().decode(errors='replace')[:2000]}", exc.headers, None) from exc
