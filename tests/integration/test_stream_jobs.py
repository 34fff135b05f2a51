"""Stream jobs: the shipped examples against plain-Python references, across batch sizes,
SIGKILLs, restarts and live traffic."""

from __future__ import annotations

import os
import random
import signal
import uuid
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_until
from integration.helpers import batches, stop_drivers, test_seed
from integration.stream_helpers import (
    archive_reads,
    dead_letter_offsets,
    example,
    log_end,
    produce_over_minutes,
    read_to,
    table,
    table_rows,
)
from reference_streams import (
    Log,
    country_views,
    read_records,
    url_visitors,
    user_profiles,
    valid_pageview,
    valid_profile,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TOPICS = {"url_visitors": ("pageviews",), "user_profiles": ("profiles",),
          "country_views": ("pageviews", "profiles")}
COLUMNS = {
    "url_visitors": ("url", ["visitors", "first_seen", "last_seen"]),
    "user_profiles": ("user_id", ["plan", "country", "city", "tags", "updated_at"]),
    "user_profiles_v2": ("user_id", ["plan", "country", "city", "region", "tags",
                                     "updated_at"]),
    "country_views": ("country", ["views", "users"]),
}


def _reference(log: Log, which: str) -> dict[Any, tuple[Any, ...]]:
    if which == "url_visitors":
        return url_visitors(log)  # type: ignore[return-value]
    if which == "country_views":
        return country_views(log)  # type: ignore[return-value]
    return user_profiles(log, region=which == "user_profiles_v2")


def _job(which: str) -> str:
    return which.removesuffix("_v2")


def _output(settings: Any, which: str, version: str) -> dict[Any, tuple[Any, ...]]:
    key, columns = COLUMNS[which]
    return table(settings, f"{_job(which)}__{version}", key, columns)


def _processed(service: Any, job: str, version: str) -> tuple[Any, int]:
    st = service.version_status(job, version)
    return st, sum(o for ps in st.processed_offsets.values() for o in ps.values())


def _settle(service: Any, settings: Any, expected: dict[tuple[str, str], Any],
            ends: dict[tuple[str, str], dict[str, dict[str, int]]]) -> None:
    """Wait until each (which, version)'s output equals its reference, its offsets committed
    to ``ends``; then assert each (a timeout shows which differ)."""
    with suppress(AssertionError):
        wait_until(lambda: all(_output(settings, w, v) == want and read_to(
            service, _job(w), v, ends[w, v]) for (w, v), want in expected.items()), 300,
            "every output to equal its reference")
    for (which, version), want in expected.items():
        assert _output(settings, which, version) == want, which
        assert read_to(service, _job(which), version, ends[which, version]), which


# Enough for each small-batch replay to span 3 to 15 batches, so that its kill lands
# mid-replay; more records add CPU time, not cases.
PAGEVIEWS, PROFILES = 49_000, 14_000


def test_examples_replay_exactly_whatever_the_batches_kills_and_live_traffic(
        settings, tmp_path: Path) -> None:
    from orchestrator.kafka.producer import produce
    from orchestrator.service import Orchestrator

    big = Orchestrator(settings)  # catch-up batches of up to 500,000 records
    small = Orchestrator(replace(settings, max_batch_records=5_000, chunk_records=3_000))
    tag = uuid.uuid4().hex[:8]
    topics = {"pageviews": f"pageviews_{tag}", "profiles": f"profiles_{tag}"}
    # 500 users: each small batch touches every user's state, and per-user Python state
    # (country_views) costs about a millisecond per user and batch.
    big.produce_sample(topics["pageviews"], PAGEVIEWS, seed=51, users=500)
    big.produce_sample(topics["profiles"], PROFILES, seed=52, kind="profiles", users=500)
    examples = ("url_visitors", "user_profiles", "country_views")
    try:
        for which in examples:
            big.deploy(example(tmp_path, which, topics))
        # The archiver decodes both topics for the v1s' decodings (#46): the small-batch
        # replays and user_profiles v2 read those decoded segments, across kills and
        # restarts, and must give the tables the v1s give from Kafka.
        big.archive(list(topics.values()), once=True)
        decoded = {p.topic: p for p in big.archive_decodings()}
        assert set(decoded) == set(topics.values()), decoded
        assert all(p.decoded_segments == p.raw_segments > 0 for p in decoded.values()), decoded
        for which in examples:
            small.deploy(example(tmp_path, which, topics, version="small"))
        big.deploy(example(tmp_path, "user_profiles_v2", topics))

        # A SIGKILL of each small-batch replay at a random moment, followed by a restart:
        # stream state and exactly-once must both survive it. (A second kill per replay found
        # nothing the first had not; the chaos test kills a stream job's driver repeatedly.)
        rng = random.Random(test_seed("kill moments"))
        totals = {"url_visitors": PAGEVIEWS, "user_profiles": PROFILES,
                  "country_views": PAGEVIEWS + PROFILES}
        for which in examples:
            target = int(totals[which] * rng.uniform(0.1, 0.85))

            def past(which: str = which, target: int = target) -> object:
                st, done = _processed(small, which, "small")
                return st if st.pid and done >= target else None

            st = wait_until(past, 300, f"{which} small to pass {target}", poll_s=0.25)
            os.kill(st.pid, signal.SIGKILL)
            wait_until(lambda w=which: small.version_status(w, "small").state.value
                       == "failed", 120, "status to report the dead driver")
            small.restart(which, "small")

        log = Log(read_records(settings.kafka_bootstrap, topics["pageviews"]),
                  read_records(settings.kafka_bootstrap, topics["profiles"]))
        for which in examples:
            assert small.wait(which, "small", timeout_s=600).attempt == 2
            big.wait(which, "v1", timeout_s=600)
            reference = _reference(log, which)
            assert reference, which
            assert _output(settings, which, "v1") == reference, which
            assert _output(settings, which, "small") == reference, which
        big.wait("user_profiles", "v2", timeout_s=600)
        assert _output(settings, "user_profiles_v2", "v2") == _reference(log, "user_profiles_v2")

        # Dead letters are exactly the invalid records (tombstones are passed, not dead).
        for job, version in (("url_visitors", "v1"), ("user_profiles", "small"),
                             ("country_views", "v1")):
            dlq = f"{job}__{version}__dead_letters"
            if job != "user_profiles":
                assert dead_letter_offsets(settings, dlq, topics["pageviews"]) == \
                    log.invalid_pageviews
            if job != "url_visitors":
                assert dead_letter_offsets(settings, dlq, topics["profiles"]) == \
                    log.invalid_profiles
        assert log.invalid_pageviews and log.invalid_profiles
        # Every offset of theirs came from the archive's decoded segments: each topic's
        # segments were all decoded before they were deployed, so none was parsed again.
        for which in examples:
            assert archive_reads(settings, which, "small") == (totals[which],) * 2, which
            small.stop(which, "small")
        assert archive_reads(settings, "user_profiles", "v2") == (PROFILES, PROFILES)

        # Live: new page views, profile changes and a tombstone reach every output, once each
        # live version has committed its way to the log end (its output commits with its
        # offsets, in one transaction).
        doomed = next(iter(_output(settings, "user_profiles", "v1")))
        big.produce_sample(topics["pageviews"], 500, seed=53, users=500)
        big.produce_sample(topics["profiles"], 300, seed=54, kind="profiles", users=500)
        produce(settings.kafka_bootstrap, topics["profiles"], [(str(doomed).encode(), None)])
        log = Log(read_records(settings.kafka_bootstrap, topics["pageviews"]),
                  read_records(settings.kafka_bootstrap, topics["profiles"]))
        live = {"url_visitors": "v1", "user_profiles": "v1", "user_profiles_v2": "v2",
                "country_views": "v1"}
        expected = {w: _reference(log, w) for w in live}
        ends = {"pageviews": log_end(log.pageviews), "profiles": log_end(log.profiles)}
        _settle(big, settings, {(w, v): expected[w] for w, v in live.items()}, {
            (w, v): {topics[t]: ends[t] for t in TOPICS[_job(w)]} for w, v in live.items()})
        assert doomed not in _output(settings, "user_profiles", "v1")

        # A restart resumes the state: it reads on from the processed offsets, not offset 0.
        before = batches(settings, "url_visitors", "v1")
        big.restart("url_visitors", "v1")
        wait_until(lambda: big.version_status("url_visitors", "v1").state.value == "live",
                   120, "url_visitors to go live again")
        big.produce_sample(topics["pageviews"], 1_000, seed=55, users=500)
        log = Log(read_records(settings.kafka_bootstrap, topics["pageviews"]), log.profiles)
        _settle(big, settings, {("url_visitors", "v1"): url_visitors(log)},
                {("url_visitors", "v1"): {topics["pageviews"]: log_end(log.pageviews)}})
        after = [b for b in batches(settings, "url_visitors", "v1") if b[1] == 2]
        assert after, "no batch was applied after the restart"
        first_start = sum(after[0][2][topics["pageviews"]].values())
        assert first_start == sum(before[-1][3][topics["pageviews"]].values()) > 0
    finally:
        for service in (big, small):
            stop_drivers(service)


_BAD_STREAM = '''
NAME = "bad"
VERSION = "{version}"
MODE = "stream"
TOPICS = ["{topic}"]
EVENT_SCHEMA = "user_id bigint, url string, ts bigint, duration_ms bigint"
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {{"url": "text", "views": "bigint"}}
{extra}

def transform(events):
    from pyspark.sql import functions as F
{body}
'''
_BAD = {
    # (extra declarations, body, what the one-line reason says)
    "batch": ("", "    return events.sparkSession.range(3).selectExpr('\"/\" AS url', "
              "'id AS views')", "not a streaming DataFrame"),
    "append": ('OUTPUT_MODE = "append"', "    return events.groupBy('url').agg("
               "F.count(F.lit(1)).alias('views'))", 'OUTPUT_MODE "append"'),
    "delete": ("", "    return events.groupBy('url').agg(F.count(F.lit(1)).alias('views'))"
               ".withColumn('_delete', F.lit('yes'))", "_delete is string"),
}


def test_stream_jobs_that_cannot_run_fail_at_once_with_one_line(service, settings, topic,
                                                                 tmp_path: Path) -> None:
    from conftest import kappa_cli

    service.produce_sample(topic, 200, seed=61)
    paths = {}
    for version, (extra, body, _) in _BAD.items():
        paths[version] = tmp_path / f"bad_{version}.py"
        paths[version].write_text(_BAD_STREAM.format(version=version, topic=topic,
                                                     extra=extra, body=body))
    for version in ("append", "delete"):
        service.deploy(paths[version])
    # The CLI's `deploy --wait` says why in one line.
    result = kappa_cli(settings, "deploy", str(paths["batch"]), "--wait", "--timeout", "300")
    assert result.returncode == 1, result.stdout
    # Progress lines may come first; the refusal is one line, the last.
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and _BAD["batch"][2] in errors[0], result.stderr
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    for version, (_, _, says) in _BAD.items():
        st = wait_until(lambda v=version: (s := service.version_status("bad", v)).state.value
                        == "failed" and s, 300, f"bad {version} to fail")
        assert says in st.reason and "\n" not in st.reason, st.reason
        # Failed at once: a mistake in the job is not retried like an outage.
        assert "restarting it from the checkpoint" not in Path(st.log_path).read_text()


_OPERATORS = '''
NAME = "{name}"
VERSION = "v1"
MODE = "stream"
TOPICS = {topics}
EVENT_SCHEMAS = {schemas}
NON_NEGATIVE = {{"{views}": ["duration_ms"]}}
{declarations}
'''
_SCHEMAS = {
    "views": "user_id bigint, url string, ts bigint, duration_ms bigint",
    "profiles": "user_id bigint, plan string, address struct<country: string, city: string>, "
                "tags array<string>, updated_at timestamp",
}
_JOBS = {
    "pairs": '''
OUTPUT_MODE = "append"
KEY_COLUMNS = ["user_id", "url"]
OUTPUT_SCHEMA = {{"user_id": "bigint", "url": "text"}}


def transform(events):
    return events["{views}"].select("user_id", "url").dropDuplicates(["user_id", "url"])
''',
    "joined": '''
OUTPUT_MODE = "append"
KEY_COLUMNS = ["view_partition", "view_offset", "profile_partition", "profile_offset"]
OUTPUT_SCHEMA = {{"view_partition": "integer", "view_offset": "bigint",
                 "profile_partition": "integer", "profile_offset": "bigint", "country": "text"}}


def transform(events):
    from pyspark.sql import functions as F

    views = events["{views}"].select(
        F.col("user_id").alias("v_user"), F.col("kafka_partition").alias("view_partition"),
        F.col("kafka_offset").alias("view_offset"))
    profiles = events["{profiles}"].select(
        F.col("user_id").alias("p_user"), F.col("kafka_partition").alias("profile_partition"),
        F.col("kafka_offset").alias("profile_offset"), F.col("address.country").alias("country"))
    return views.join(profiles, F.col("v_user") == F.col("p_user")).drop("v_user", "p_user")
''',
    "counted": '''
KEY_COLUMNS = ["user_id"]
OUTPUT_SCHEMA = {{"user_id": "bigint", "views": "bigint"}}

from pyspark.sql.streaming import StatefulProcessor


class Counter(StatefulProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", "views bigint")

    def handleInputRows(self, key, rows, timerValues):
        import pandas as pd

        seen = sum(len(frame) for frame in rows)
        total = (self.count.get() or (0,))[0] + seen
        self.count.update((total,))
        yield pd.DataFrame({{"user_id": [key[0]], "views": [total]}})

    def close(self):
        pass


def transform(events):
    return events["{views}"].select("user_id").groupBy("user_id").transformWithStateInPandas(
        statefulProcessor=Counter(), outputStructType="user_id bigint, views bigint",
        outputMode="Update", timeMode="None")
''',
    "windowed": '''
OUTPUT_MODE = "append"
KEY_COLUMNS = ["window_start"]
OUTPUT_SCHEMA = {{"window_start": "timestamptz", "views": "bigint"}}


def transform(events):
    from pyspark.sql import functions as F

    return (events["{views}"].withWatermark("kafka_timestamp", "10 seconds")
            .groupBy(F.window("kafka_timestamp", "1 minute"))
            .agg(F.count(F.lit(1)).alias("views"))
            .select(F.col("window.start").alias("window_start"), "views"))
''',
}


def test_spark_stateful_operators_run_as_stream_jobs(service, settings, tmp_path: Path) -> None:
    """dropDuplicates, a stream-stream join, transformWithStateInPandas and a watermarked
    window, each as a stream job; the watermark is named in a deploy warning."""
    from datetime import UTC, datetime

    tag = uuid.uuid4().hex[:8]
    views, profiles = f"pageviews_{tag}", f"profiles_{tag}"
    produce_over_minutes(settings.kafka_bootstrap, views, 2_000, seed=91, minutes=10)
    service.produce_sample(profiles, 300, seed=92, users=200)
    warnings = {}
    for name, body in _JOBS.items():
        path = tmp_path / f"{name}.py"
        # Every topic a job declares must be read by its query: only the join reads both.
        names = {"views": views, "profiles": profiles}
        read = ("views", "profiles") if name == "joined" else ("views",)
        path.write_text(_OPERATORS.format(
            name=name, views=views, topics=[names[r] for r in read],
            schemas={names[r]: _SCHEMAS[r] for r in read},
            declarations=body.format(views=views, profiles=profiles)))
        warnings[name] = service.deploy(path).warnings
    assert [w.split(": ")[1] for w in warnings["windowed"]] == ["withWatermark"]
    assert not warnings["pairs"] and not warnings["joined"] and not warnings["counted"]
    for name in _JOBS:
        service.wait(name, "v1", timeout_s=600)

    log = Log(read_records(settings.kafka_bootstrap, views),
              read_records(settings.kafka_bootstrap, profiles))
    valid_views = [(p, o, e) for p, o, _, _, v in log.pageviews
                   if (e := valid_pageview(v)) is not None]
    valid_profiles = [(p, o, e) for p, o, _, _, v in log.profiles
                      if v is not None and (e := valid_profile(v)) is not None]
    assert table_rows(settings, "pairs__v1", ["user_id", "url"]) == \
        {(e["user_id"], e["url"]) for _, _, e in valid_views}
    expected_pairs = {(vp, vo, pp, po, pe["address"]["country"])
                      for vp, vo, ve in valid_views for pp, po, pe in valid_profiles
                      if ve["user_id"] == pe["user_id"]}
    assert expected_pairs
    assert table_rows(settings, "joined__v1", ["view_partition", "view_offset",
                                               "profile_partition", "profile_offset",
                                               "country"]) == expected_pairs
    counts: dict[int, int] = {}
    for _, _, e in valid_views:
        counts[e["user_id"]] = counts.get(e["user_id"], 0) + 1
    assert table(settings, "counted__v1", "user_id", ["views"]) == \
        {u: (n,) for u, n in counts.items()}
    # Append mode emits a window once the watermark (10 s behind the newest record) has passed
    # its end: every window but the last, each once, with the reference's count.
    per_window: dict[datetime, int] = {}
    for _, _, ts, _, v in log.pageviews:
        if valid_pageview(v) is not None:
            start = datetime.fromtimestamp(ts // 60_000 * 60, UTC)
            per_window[start] = per_window.get(start, 0) + 1
    closed = dict(sorted(per_window.items())[:-1])
    assert len(closed) >= 9
    emitted = wait_until(
        lambda: (t := table(settings, "windowed__v1", "window_start", ["views"])).keys()
        >= closed.keys() and t, 120, "every closed window to be emitted")
    assert {start: n for start, (n,) in emitted.items()} == closed  # type: ignore[union-attr]
