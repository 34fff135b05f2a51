"""Read aliases: promote, A/B by key, rollback, history, diff, retire, privileges."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import output, rows_hashed
from reference import compute, normalise, read_log
from reference_streams import valid_pageview as valid_event

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _bucket(key: str) -> int:
    return int(hashlib.md5(key.encode()).hexdigest()[:8], 16) % 100


def _alias_rows(settings, alias: str = JOB, user: str | None = None) -> dict:
    extra = {"user": user} if user else {}
    with psycopg.connect(settings.pg_dsn, autocommit=True, **extra) as conn:
        rows = conn.execute(sql.SQL("SELECT url, views, total_duration_ms FROM {}.{}").format(
            sql.Identifier(settings.serving_schema), sql.Identifier(alias))).fetchall()
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys)), "a key served by two versions"
    return {url: (views, total) for url, views, total in rows}


def _rows_hashed(settings, alias: str = JOB) -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return rows_hashed(conn, settings.serving_schema, alias)


def _workers_of_idle_branches(settings, alias: str = JOB) -> tuple[int, int]:
    """(parallel workers planned for a full read of the alias, workers launched under a Gather
    that scanned no table), with parallel plans made cheap so that these small tables get
    them (EXPLAIN ANALYZE)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for name in ("parallel_setup_cost", "parallel_tuple_cost",
                     "min_parallel_table_scan_size"):
            conn.execute(sql.SQL("SET {} = 0").format(sql.Identifier(name)))
        ((plan,),) = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) "
                                          "FROM {}.{}").format(
            sql.Identifier(settings.serving_schema), sql.Identifier(alias))).fetchall()

    def scanned(node: dict) -> bool:
        return bool(node.get("Relation Name") and node.get("Actual Loops")) or any(
            scanned(child) for child in node.get("Plans", []))

    planned = idle = 0
    pending = [plan[0]["Plan"]]
    while pending:
        node = pending.pop()
        pending += node.get("Plans", [])
        planned += node.get("Workers Planned", 0)
        if not scanned(node):
            idle += node.get("Workers Launched", 0)
    return planned, idle


def test_promote_ab_rollback_history_diff_retire(service, settings, topic, tmp_path: Path
                                                 ) -> None:
    from orchestrator.errors import InvalidNameError, KappaError, NotFoundError, StateError
    from orchestrator.service import Orchestrator

    tag = uuid.uuid4().hex[:8]
    settings = replace(settings, serving_schema=f"serving_{tag}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 20_000, seed=101)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp_path, version, topic))
    for version in ("v1", "v2"):
        service.wait(JOB, version, timeout_s=300)

    with pytest.raises(NotFoundError, match=f"job '{JOB}' has no version 'v9': `kappa status"):
        service.promote(JOB, "v9")
    with pytest.raises(NotFoundError, match="unknown job 'nosuch': `kappa status` lists"):
        service.ab("nosuch", "v1", 10)
    with pytest.raises(StateError, match="no validation"):
        service.promote(JOB, "v1")
    with pytest.raises(StateError, match="--reason"):
        service.promote(JOB, "v1", force=True)
    unchecked = service.diff(JOB, "v2", "v1")  # v1 declares no guardrails
    assert not unchecked.passed and unchecked.guardrails == ()
    assert "no guardrails" in unchecked.verdict
    with pytest.raises(StateError, match="ran no guardrails"):
        service.promote(JOB, "v1")
    service.promote(JOB, "v1", force=True, reason="first version: nothing served before")
    v1, v2 = output(settings, f"{JOB}__v1"), output(settings, f"{JOB}__v2")
    assert _alias_rows(settings) == v1
    # One version serves every key: no reader pays for a key's bucket, nor for parallel
    # workers of a branch that serves nothing.
    assert _rows_hashed(settings) == 0
    planned, idle = _workers_of_idle_branches(settings)
    assert planned > 0 and idle == 0, (planned, idle)

    report = service.diff(JOB, "v1", "v2")
    assert report.aligned and report.offsets_apart == 0
    # v2 normalises URLs: raw forms exist only in v1, and normalised keys gather more views.
    assert report.only_in_a > 0 and report.differing["views"] > 0
    assert report.samples["only_in_a"] and report.samples["differing_views"]
    assert {g.name for g in report.guardrails} == {
        "no negative counts", "total views within 1 % of the other version"}
    assert report.passed

    for percent in (10, 50):
        service.ab(JOB, "v2", percent)
        expected = {k: v for k, v in v1.items() if _bucket(k) >= percent}
        expected |= {k: v for k, v in v2.items() if _bucket(k) < percent}
        assert _alias_rows(settings) == expected
        # Each row carries its bucket, written with it: a split hashes no row
        # (test_stored_buckets.py: a table made before the column is hashed as it is read).
        assert _rows_hashed(settings) == 0
    # New events during the A/B phase: v1 keeps processing them, so a rollback lands on
    # current data.
    service.produce_sample(topic, 2_000, seed=102)
    service.wait(JOB, "v2", timeout_s=60)  # promote measures the lag: v2 must have read them
    service.promote(JOB, "v2")
    # A rollback to a version that was stopped would serve output that no longer follows the
    # log: refused, naming what to run.
    service.stop(JOB, "v1")
    with pytest.raises(StateError, match="kappa restart pageview_counts v1"):
        service.rollback(JOB, reason="checking rollback")
    service.restart(JOB, "v1")
    service.wait(JOB, "v1", timeout_s=120)
    service.rollback(JOB, reason="checking rollback")
    ref = compute(settings.kafka_bootstrap, topic)
    wait_until(lambda: _alias_rows(settings) == ref.v1, 30,
               "the alias to serve v1's current values after the rollback")
    assert _rows_hashed(settings) == 0
    with pytest.raises(StateError, match="nothing to roll back"):
        service.rollback(JOB)

    history = service.history(JOB)
    assert [(h["action"], h["to"], h["percent"]) for h in history] == [
        ("promote", "v1", 100), ("ab", "v2", 10), ("ab", "v2", 50), ("promote", "v2", 100),
        ("rollback", "v1", 100)]
    assert history[-1]["reason"] == "checking rollback" and history[-1]["who"]
    assert set(history[3]["lag"]) == {"v1", "v2"}

    # Readers get the serving schema and nothing else.
    reader = f"reader_{tag}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(reader), sql.Identifier(settings.reader_role)))
    try:
        assert _alias_rows(settings, user=reader) == output(settings, f"{JOB}__v1")
        with psycopg.connect(settings.pg_dsn, autocommit=True, user=reader) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL("SELECT 1 FROM {}.{}").format(
                sql.Identifier(settings.data_schema), sql.Identifier(f"{JOB}__v2")))
    finally:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(reader)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(reader)))

    for hostile in ('x"; DROP TABLE jobs; --', "Alias", "a b", "serving.x"):
        with pytest.raises(InvalidNameError):
            service.promote(JOB, "v1", alias=hostile, force=True, reason="test")

    with pytest.raises(StateError, match="serves"):
        service.retire(JOB, "v1")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        (checkpoint,) = conn.execute(sql.SQL(
            "SELECT checkpoint_dir FROM {}.job_versions WHERE version = 'v2'").format(
            sql.Identifier(settings.catalog_schema))).fetchone()
    assert Path(checkpoint).is_dir()
    service.retire(JOB, "v2", drop=True)
    assert not Path(checkpoint).exists()
    assert {st.version: st.state.value for st in service.status(JOB)}["v2"] == "retired"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass(%s)",
                            (f"{settings.data_schema}.{JOB}__v2",)).fetchone() == (None,)
    assert _alias_rows(settings) == output(settings, f"{JOB}__v1")  # still served
    with pytest.raises(KappaError):
        service.ab(JOB, "v2", 10)  # retired


def test_a_version_that_adds_columns_splits_and_one_that_removes_or_retypes_needs_breaking(
        service, settings, topic, tmp_path: Path) -> None:
    from orchestrator.errors import ConflictError
    from orchestrator.experiment.attribution import key_bucket
    from orchestrator.service import Orchestrator
    from orchestrator.serving import views

    tag = uuid.uuid4().hex[:8]
    # Batches of 2,000 records: v3's max_ms is merged across batches, as MERGE says.
    settings = replace(settings, serving_schema=f"serving_{tag}", max_batch_records=2_000,
                       chunk_records=1_000)
    service = Orchestrator(settings)
    service.produce_sample(topic, 5_000, seed=111)
    v3 = job_file(tmp_path, "v2", topic).read_text()
    v3 = v3.replace('VERSION = "v2"', 'VERSION = "v3"').replace(
        '"total_duration_ms": "bigint"}', '"total_duration_ms": "bigint", "max_ms": "bigint"}'
    ).replace('MERGE = {"views": "sum", "total_duration_ms": "sum"}',
              'MERGE = {"views": "sum", "total_duration_ms": "sum", "max_ms": "max"}').replace(
        'F.sum("duration_ms").alias("total_duration_ms"),',
        'F.sum("duration_ms").alias("total_duration_ms"), F.max("duration_ms").alias("max_ms"),')
    (tmp_path / "v3.py").write_text(v3)
    service.deploy(job_file(tmp_path, "v2", topic))
    service.deploy(tmp_path / "v3.py")
    for version in ("v2", "v3"):
        service.wait(JOB, version, timeout_s=300)
    service.promote(JOB, "v2", force=True, reason="first")
    assert service.diff(JOB, "v2", "v3").passed
    # v3 only adds max_ms: a split serves it for v3's keys and NULL for v2's.
    service.ab(JOB, "v3", 10, reason="split")
    assert _columns(settings) == ["url", "views", "total_duration_ms", "max_ms"]
    v2_rows = {url: (*row, None) for url, row in output(settings, f"{JOB}__v2").items()}
    v3_rows = _v3_reference(settings, topic)
    expected = {url: row for url, row in v2_rows.items() if key_bucket(url) >= 10} | {
        url: row for url, row in v3_rows.items() if key_bucket(url) < 10}
    assert _v3_alias_rows(settings) == expected
    assert any(row[2] is not None for row in expected.values())
    service.promote(JOB, "v3", force=True, reason="new columns")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        granted = conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT')",
                               (settings.reader_role, f"{settings.serving_schema}.{JOB}"))
        assert granted.fetchone() == (True,)
    assert _columns(settings) == ["url", "views", "total_duration_ms", "max_ms"]
    assert _v3_alias_rows(settings) == v3_rows
    # v2 lacks max_ms: a split against v3 is refused in one line unless --breaking.
    assert service.diff(JOB, "v3", "v2").passed
    with pytest.raises(ConflictError, match=r"removes column\(s\) max_ms.*--breaking"):
        service.ab(JOB, "v2", 20, reason="back, partly")
    service.ab(JOB, "v2", 20, reason="back, partly", breaking=True)
    split = _v3_alias_rows(settings)
    assert {url: row for url, row in split.items() if key_bucket(url) < 20} == {
        url: row for url, row in v2_rows.items() if key_bucket(url) < 20}
    service.rollback(JOB, reason="back")
    assert _v3_alias_rows(settings) == v3_rows
    service.promote(JOB, "v2", reason="back")
    assert _alias_rows(settings) == output(settings, f"{JOB}__v2") == compute(
        settings.kafka_bootstrap, topic).v2

    # v4 retypes total_duration_ms: refused in one line unless --breaking; with it, every
    # branch serves the column as text; once the split ends, the column has its type back.
    v4 = job_file(tmp_path, "v2", topic).read_text().replace(
        'VERSION = "v2"', 'VERSION = "v4"').replace(
        '"total_duration_ms": "bigint"}', '"total_duration_ms": "double precision"}')
    (tmp_path / "v4.py").write_text(v4)
    # A view of an earlier release's form (its comment names the form) is redefined by the
    # job's next deploy, even one that gives the view no branch.
    view = sql.Identifier(settings.serving_schema, JOB)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("COMMENT ON VIEW {} IS NULL").format(view))
    service.deploy(tmp_path / "v4.py")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT obj_description(%s::regclass, 'pg_class')",
                            (f"{settings.serving_schema}.{JOB}",)).fetchone() == (views.FORM,)
    service.wait(JOB, "v4", timeout_s=300)
    assert service.diff(JOB, "v2", "v4").passed
    with pytest.raises(ConflictError, match=r"retyped column\(s\) total_duration_ms bigint -> "
                                            r"double precision; add --breaking"):
        service.ab(JOB, "v4", 30, reason="retyped")
    assert _type(settings, "total_duration_ms") == "bigint"
    v2_counts = output(settings, f"{JOB}__v2")
    service.ab(JOB, "v4", 30, reason="retyped", breaking=True)
    assert _type(settings, "total_duration_ms") == "text"
    assert service.serving(JOB).candidate == "v4"
    assert _alias_rows(settings) == {url: (views, str(total))
                                     for url, (views, total) in v2_counts.items()}
    service.ab(JOB, "v4", 60, reason="more")  # the split goes on: no --breaking again
    service.rollback(JOB, reason="back to bigint")
    assert _type(settings, "total_duration_ms") == "bigint"
    assert _alias_rows(settings) == v2_counts
    service.promote(JOB, "v4", reason="retyped, whole")
    assert _type(settings, "total_duration_ms") == "double precision"
    assert _alias_rows(settings) == {url: (views, float(total))
                                     for url, (views, total) in v2_counts.items()}
    # `kappa cutover` back to v2 splits too: refused (and rolled back) unless --breaking.
    ramp = ("cutover", JOB, "v2", "--ramp", "50,100", "--soak", "0")
    refused = kappa_cli(settings, *ramp)
    assert refused.returncode == 1 and "double precision -> bigint; add --breaking" in \
        refused.stderr, refused.stderr
    assert service.serving(JOB).primary == "v4" and service.serving(JOB).candidate is None
    done = kappa_cli(settings, *ramp, "--breaking")
    assert done.returncode == 0, done.stderr
    assert _type(settings, "total_duration_ms") == "bigint"
    assert _alias_rows(settings) == v2_counts


def _type(settings, column: str) -> str:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = %s AND column_name = %s", (settings.serving_schema, JOB, column))
        return str(found.fetchone()[0])


def _columns(settings) -> list[str]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s ORDER BY ordinal_position", (settings.serving_schema, JOB))]


def _v3_alias_rows(settings) -> dict[str, tuple[int, int, int]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT url, views, total_duration_ms, max_ms FROM {}.{}")
                            .format(sql.Identifier(settings.serving_schema),
                                    sql.Identifier(JOB))).fetchall()
    return {url: (views, total, longest) for url, views, total, longest in rows}


def _v3_reference(settings, topic: str) -> dict[str, tuple[int, int, int]]:
    """v2's normalised counts plus the longest duration, from the log with plain Python."""
    folded: dict[str, tuple[int, int, int]] = {}
    for _, _, value in read_log(settings.kafka_bootstrap, topic):
        event = valid_event(value)
        if event is not None:
            url, ms = normalise(event["url"]), event["duration_ms"]
            views, total, longest = folded.get(url, (0, 0, -1))
            folded[url] = (views + 1, total + ms, max(longest, ms))
    return folded


def test_user_profiles_v2_splits_beside_v1_and_readers_see_no_error(
        service, settings, tmp_path: Path) -> None:
    """v2 adds `region`: an A/B split serves it for v2's keys and NULL for v1's, while readers
    query the alias the whole time."""
    import threading

    from orchestrator.experiment.attribution import key_bucket
    from orchestrator.service import Orchestrator

    from integration.stream_helpers import example

    tag = uuid.uuid4().hex[:8]
    settings = replace(settings, serving_schema=f"serving_{tag}")
    service = Orchestrator(settings)
    topics = {"profiles": f"profiles_{tag}"}
    service.produce_sample(topics["profiles"], 4_000, seed=113, kind="profiles", users=400)
    service.deploy(example(tmp_path, "user_profiles", topics))
    service.deploy(example(tmp_path, "user_profiles_v2", topics))
    for version in ("v1", "v2"):
        service.wait("user_profiles", version, timeout_s=300)
    service.promote("user_profiles", "v1", force=True, reason="first")
    assert service.diff("user_profiles", "v1", "v2").passed
    view = sql.SQL("{}.user_profiles").format(sql.Identifier(settings.serving_schema))
    errors: list[BaseException] = []
    reads = [0]
    stop = threading.Event()

    def reader() -> None:
        try:
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                while not stop.is_set():
                    conn.execute(sql.SQL("SELECT * FROM {} WHERE user_id = ANY(%s)").format(
                        view), (list(range(1, 401)),)).fetchall()
                    reads[0] += 1
        except BaseException as exc:  # any error a reader sees fails the test
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: reads[0] >= 20, 60, "readers reading the alias")
        service.ab("user_profiles", "v2", 30, reason="regions for 30 %")
        counted = reads[0]
        wait_until(lambda: reads[0] >= counted + 20, 60, "readers reading the split")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT user_id, region FROM {}").format(view)).fetchall()
        v2 = dict(conn.execute(sql.SQL("SELECT user_id, region FROM {}.{}").format(
            sql.Identifier(settings.data_schema),
            sql.Identifier("user_profiles__v2"))).fetchall())
    split = dict(rows)
    assert len(split) == len(rows)  # no key served twice
    assert {k: r for k, r in split.items() if key_bucket(str(k)) < 30} == {
        k: r for k, r in v2.items() if key_bucket(str(k)) < 30}
    assert all(r is None for k, r in split.items() if key_bucket(str(k)) >= 30)
    assert any(r is not None for r in split.values())
