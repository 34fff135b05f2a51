"""Stream-job declarations, directory jobs and replay hazards, read without Spark."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.determinism import replay_hazards
from orchestrator.errors import JobFileError
from orchestrator.jobspec import load_job_file, parse_job_source

ROOT = Path(__file__).resolve().parents[2]
_STREAM = '''
NAME = "s"
VERSION = "v1"
MODE = "stream"
TOPICS = ["a"]
EVENT_SCHEMA = "user_id bigint, address struct<country: string>, amount decimal(10,2)"
KEY_COLUMNS = ["k"]
OUTPUT_SCHEMA = {"k": "bigint", "doc": "jsonb"}


def transform(events):
    return events
'''


def test_shipped_stream_examples_load() -> None:
    visitors = load_job_file(ROOT / "jobs/url_visitors/v1.py")
    assert (visitors.mode, visitors.output_mode, visitors.topics) == \
        ("stream", "upsert", ("pageviews",))
    profiles = load_job_file(ROOT / "jobs/user_profiles/v1.py")
    assert profiles.inputs[0].tombstones == "pass"
    assert "struct<`country`:string,`city`:string>" in profiles.inputs[0].schema
    countries = load_job_file(ROOT / "jobs/country_views/v1")
    assert countries.per_topic and countries.topics == ("pageviews", "profiles")
    assert {p for p, _ in countries.files} == {"job.py", "attribution.py"}
    assert countries.entry == "job.py" and dict(countries.merge) == {"views": "sum",
                                                                      "users": "sum"}
    for spec in (visitors, profiles, countries, load_job_file(ROOT / "jobs/user_profiles/v2.py")):
        assert replay_hazards(spec) == [], spec.name


def test_a_directory_job_is_fingerprinted_by_every_file(tmp_path: Path) -> None:
    job = tmp_path / "country_views"
    shutil.copytree(ROOT / "jobs/country_views/v1", job)
    before = load_job_file(job).fingerprint
    helper = job / "attribution.py"
    helper.write_text(helper.read_text() + "\n# a comment changes the deployed code\n")
    assert load_job_file(job).fingerprint != before
    (job / "job.py").unlink()
    with pytest.raises(JobFileError, match=r"has no job\.py"):
        load_job_file(job)


def test_a_package_job_deployed_by_its_entry_file_is_refused_naming_its_directory(
        tmp_path: Path) -> None:
    """#61 path 12: `kappa deploy jobs/country_views/v1/job.py` loaded the file alone. Its
    relative import is lazy (inside transform), so the deploy was accepted and the version
    failed at its first batch with ModuleNotFoundError, its VERSION spent on a path mistake."""
    entry = ROOT / "jobs/country_views/v1/job.py"
    with pytest.raises(JobFileError) as refused:
        load_job_file(entry)
    message = str(refused.value)
    assert "\n" not in message and "relative import" in message
    assert f"kappa deploy {entry.parent}" in message and "from .attribution" in message
    # A single-file job (no job.py beside it) is told to become a directory job.
    alone = tmp_path / "alone.py"
    alone.write_text(_STREAM.replace("    return events",
                                     "    from ..helpers import f  # noqa\n    return events"))
    with pytest.raises(JobFileError, match=r"alone\.py:\d+: .*from \.\.helpers.*job\.py"):
        load_job_file(alone)
    assert load_job_file(entry.parent).entry == "job.py"  # the directory deploys as ever


@pytest.mark.parametrize(("change", "message"), [
    (("bigint, address", "bigint, address strct<"), "EVENT_SCHEMA"),
    (('"stream"', '"streaming"'), "MODE must be one of"),
    (('MODE = "stream"', 'MODE = "stream"\nOUTPUT_MODE = "merge"'), "OUTPUT_MODE"),
    (('TOPICS = ["a"]', 'TOPICS = ["a"]\nTOMBSTONES = "keep"'), "TOMBSTONES"),
    (('EVENT_SCHEMA = ', 'EVENT_SCHEMAS = {"a": "x bigint", "b": "y string"}\nX = '),
     "EVENT_SCHEMAS names topic 'b' that is not in TOPICS"),
    (('EVENT_SCHEMA = "user_id', 'EVENT_SCHEMA = "kafka_key string, user_id'),
     "Kafka metadata"),
    (('"jsonb"}', '"jsonb", "_delete": "boolean"}'), "_delete is not stored"),
    (('TOPICS = ["a"]', 'TOPICS = ["a"]\nNON_NEGATIVE = ["address.city"]'), "NON_NEGATIVE"),
    (('TOPICS = ["a"]', 'TOPICS = ["a"]\nOUTPUT_MODE = "append"\nMERGE = {"doc": "sum"}'),
     "MERGE applies to"),
    (('TOPICS = ["a"]', 'TOPICS = ["a"]\nMERGE = {"doc": "max"}'),
     "'max' does not apply to a jsonb column"),
])
def test_bad_stream_declarations_get_one_line_errors(change: tuple[str, str], message: str
                                                     ) -> None:
    source = _STREAM.replace(*change)
    assert source != _STREAM
    with pytest.raises(JobFileError) as info:
        parse_job_source(source, "job.py")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_ddl_type_names_the_type() -> None:
    with pytest.raises(JobFileError) as info:
        parse_job_source(_STREAM.replace("decimal(10,2)", "money"), "job.py")
    assert "money" in str(info.value) and "\n" not in str(info.value)


def test_replay_hazards_name_the_construct_and_line() -> None:
    source = _STREAM.replace("    return events", (
        "    from pyspark.sql import functions as F\n"
        "    late = events.withWatermark('kafka_timestamp', '1 minute')\n"
        "    return late.withColumn('at', F.current_timestamp())"))
    hazards = replay_hazards(parse_job_source(source, "job.py"))
    assert [h.split(": ")[1] for h in hazards] == ["withWatermark", "current_timestamp"]
    assert all(h.startswith("job.py:") for h in hazards)
    batch = (ROOT / "jobs/pageview_counts/v1.py").read_text().replace(
        'MERGE = {"views": "sum", "total_duration_ms": "sum"}', 'MERGE = {"views": "sum"}')
    (only,) = replay_hazards(parse_job_source(batch, "v1.py"))
    assert "total_duration_ms" in only and "replace" in only
    assert replay_hazards(load_job_file(ROOT / "jobs/pageview_counts/v2.py")) == []


def test_the_offset_log_of_a_batch_holds_every_topic(tmp_path: Path) -> None:
    from orchestrator.spark.checkpoint import batch_end_offsets

    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(
        'v1\n{"batchWatermarkMs":0}\n{"pageviews": {"0": 10, "1": 12}}\n'
        '{"profiles": {"0": 4}}\n-\n')
    assert batch_end_offsets(tmp_path, 3) == {"pageviews": {"0": 10, "1": 12},
                                              "profiles": {"0": 4}}
    assert batch_end_offsets(tmp_path, 4) is None
