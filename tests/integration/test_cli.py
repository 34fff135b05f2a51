"""The `kappa` command as users run it: bad input gets one line and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, debian_tool, job_file, kappa_cli, wait_until
from integration.helpers import query

pytestmark = [pytest.mark.integration]


def _one_line_error(result, *needles: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def _nothing_registered(settings) -> None:
    listed = kappa_cli(settings, "status", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    tables = query(settings, "SELECT count(*) FROM information_schema.tables "
                             "WHERE table_schema = %s", settings.data_schema)
    assert tables == [(0,)]


def test_bad_job_files_leave_nothing_registered(settings, topic, tmp_path: Path) -> None:
    good = job_file(tmp_path, "v1", topic).read_text()
    cases = {
        "syntax.py": ("def transform(events:\n", ["syntax error"]),
        "missing.py": (good.replace("OUTPUT_SCHEMA", "OUTPUT_COLUMNS"),
                       ["missing declaration(s) OUTPUT_SCHEMA"]),
        "badversion.py": (good.replace('VERSION = "v1"', 'VERSION = "V1"'),
                          ["invalid version 'V1'"]),
        "badname.py": (good.replace('NAME = "pageview_counts"', 'NAME = "x; DROP TABLE y"'),
                       ["invalid job name"]),
        "long.py": (good.replace('VERSION = "v1"', f'VERSION = "{"v" * 42}"'),
                    ["invalid version"]),
        "ddl.py": (good.replace('EVENT_SCHEMA = {', 'EVENT_SCHEMA = "user_id bigint, url strng"\n'
                                'X = {'), ["unknown type", "strng"]),
        "topics.py": (good.replace('EVENT_SCHEMA = {', 'EVENT_SCHEMAS = {"clicks": "x bigint"}\n'
                                   'X = {'), ["'clicks' that is not in TOPICS"]),
    }
    for name, (source, needles) in cases.items():
        path = tmp_path / name
        path.write_text(source)
        _one_line_error(kappa_cli(settings, "deploy", str(path)), *needles)
    _one_line_error(kappa_cli(settings, "deploy", str(tmp_path / "absent.py")), "does not exist")
    _nothing_registered(settings)


def test_unknown_jobs_and_hostile_names(settings) -> None:
    _one_line_error(kappa_cli(settings, "status", "nosuch"), "unknown job 'nosuch'")
    _one_line_error(kappa_cli(settings, "restart", "nosuch", "v1"), "unknown job")
    _one_line_error(kappa_cli(settings, "stop", "Robert'); DROP TABLE jobs;--", "v1"),
                    "invalid job name")
    _one_line_error(kappa_cli(settings, "stop", "pageview_counts", 'v1"; --'), "invalid version")
    _nothing_registered(settings)


def test_missing_topic_is_refused(settings, topic, tmp_path: Path) -> None:
    _one_line_error(kappa_cli(settings, "deploy", str(job_file(tmp_path, "v1", topic))), topic)
    _nothing_registered(settings)


@pytest.mark.spark
def test_status_json_has_the_stable_keys_and_same_label_with_different_code_is_refused(
        settings, service, topic, tmp_path: Path) -> None:
    """One deployment, one driver start, for three checks: `deploy --json` says whether it
    created the version, `status --json` has the stable keys, and other code under the same
    label is refused."""
    service.produce_sample(topic, 5_000, seed=4)
    path = job_file(tmp_path, "v1", topic)
    first = kappa_cli(settings, "deploy", str(path), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["created"] is True
    again = kappa_cli(settings, "deploy", str(path), "--json")  # same code: a no-op
    assert again.returncode == 0 and json.loads(again.stdout)["created"] is False

    service.wait("pageview_counts", "v1", timeout_s=300)
    result = kappa_cli(settings, "status", "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    for key in ("job", "version", "state", "pid", "app_id", "output_table", "dead_letter_table",
                "rows", "processed_offsets", "lag_records", "heartbeat_age_s"):
        assert key in row
    assert row["output_table"] == f"{settings.data_schema}.pageview_counts__v1"
    assert row["dead_letter_table"] == f"{settings.data_schema}.pageview_counts__v1__dead_letters"
    assert sum(row["processed_offsets"][topic].values()) == 5_000
    assert row["lag_records"] == 0 and row["state"] == "live" and isinstance(row["pid"], int)
    table = kappa_cli(settings, "status")
    assert "pageview_counts" in table.stdout and "live" in table.stdout

    path.write_text(path.read_text().replace("F.count(F.lit(1))", "F.count(F.col('url'))"))
    _one_line_error(kappa_cli(settings, "deploy", str(path)), "different code", "new VERSION")
    versions = query(settings, f"SELECT count(*) FROM {settings.catalog_schema}.job_versions")
    assert versions == [(1,)]
    stopped = kappa_cli(settings, "stop", "pageview_counts", "v1", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["state"] == "stopped"


def _in_terminal(settings, command: str, env_changes: dict[str, str] | None = None) -> str:
    """Run ``command`` in a real terminal (a tmux pane, 200 columns) and return the pane as
    drawn, with its escape codes."""
    socket = f"kappa-test-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(settings.driver_environment(), TERM="xterm-256color", **(env_changes or {}))
    tmux = [debian_tool("tmux", "tmux"), "-L", socket]
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "50",
                    f"{command}; echo KAPPA_EXIT=$?; sleep 600"], env=env, check=True, cwd=ROOT)
    try:
        def pane() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-e", "-J", "-S", "-"],
                                  capture_output=True, text=True, check=True).stdout

        wait_until(lambda: "KAPPA_EXIT=" in pane(), 300, f"`{command}` to finish in tmux")
        drawn = pane()
        assert "KAPPA_EXIT=0" in drawn, drawn
        return drawn
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, capture_output=True)


def test_people_get_rich_output_on_a_terminal_and_scripts_plain_lines(
        settings, service, topic, tmp_path: Path) -> None:
    service.produce_sample(topic, 5_000, seed=5)
    kappa = str(Path(sys.executable).with_name("kappa"))
    path = job_file(tmp_path, "v1", topic)
    deployed = _in_terminal(settings, f"{kappa} deploy {path} --wait")
    # rich's progress bar, drawn in place: its bar and the records processed of all
    assert "━" in deployed and "5000/5000" in deployed, deployed
    green = "\x1b[32m"
    for args in ("status", "lag", "history pageview_counts"):
        drawn = _in_terminal(settings, f"{kappa} {args}")
        piped = kappa_cli(settings, *args.split())
        assert piped.returncode == 0, piped.stderr
        assert "\x1b" not in piped.stdout + piped.stderr, piped.stdout
        # The same text on the terminal, with colour where states are
        firsts = {line.split()[0] for line in piped.stdout.splitlines() if line.split()}
        assert not {word for word in firsts if word not in drawn}, (piped.stdout, drawn)
        if args != "history pageview_counts":  # no alias switched yet: no states to colour
            assert green in drawn and ("live" in drawn or "caught_up" in drawn), drawn
            assert green not in _in_terminal(settings, f"{kappa} {args}", {"NO_COLOR": "1"})
    again = kappa_cli(settings, "deploy", str(path), "--wait")  # a no-op, piped
    assert again.returncode == 0 and "\x1b" not in again.stdout + again.stderr, again.stderr
