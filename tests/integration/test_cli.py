"""The `kappa` command as users run it: bad input gets one line and leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import job_file, kappa_cli
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
def test_same_label_with_different_code_is_refused(settings, service, topic,
                                                   tmp_path: Path) -> None:
    service.produce_sample(topic, 100, seed=3)
    path = job_file(tmp_path, "v1", topic)
    first = kappa_cli(settings, "deploy", str(path), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["created"] is True
    again = kappa_cli(settings, "deploy", str(path), "--json")  # same code: a no-op
    assert again.returncode == 0 and json.loads(again.stdout)["created"] is False
    path.write_text(path.read_text().replace("F.count(F.lit(1))", "F.count(F.col('url'))"))
    _one_line_error(kappa_cli(settings, "deploy", str(path)), "different code", "new VERSION")
    versions = query(settings, f"SELECT count(*) FROM {settings.catalog_schema}.job_versions")
    assert versions == [(1,)]
    stopped = kappa_cli(settings, "stop", "pageview_counts", "v1", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["state"] == "stopped"


@pytest.mark.spark
def test_status_json_has_the_stable_keys(settings, service, topic, tmp_path: Path) -> None:
    service.produce_sample(topic, 5_000, seed=4)
    service.deploy(job_file(tmp_path, "v1", topic))
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
