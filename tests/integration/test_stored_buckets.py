"""Each output row carries its A/B bucket, written with it: a split's view reads the stored
bucket and hashes no row, and it serves exactly the keys that the catalog's key_bucket(), the
view's former expression and the Python attribution give each version. A table made before the
column, or keyed by a timestamptz or a double precision (their text follows the session's
settings), is hashed as it is read, beside one that stores it."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from integration.helpers import rows_hashed

pytestmark = [pytest.mark.integration]
ROWS = 3_000
SOURCE = (Path(__file__).resolve().parents[2] / "jobs" / "user_profiles" / "v1.py").read_text()


def _version(spec: Any, vid: int) -> Any:
    from orchestrator.models import DeployedVersion
    from orchestrator.naming import dead_letter_table, output_table

    return DeployedVersion(
        id=vid, spec=spec, output_table=output_table(spec.name, spec.version),
        dead_letter_table=dead_letter_table(spec.name, spec.version), checkpoint_dir="",
        consumer_group="", log_start={}, created_at=datetime.datetime.now(datetime.UTC))


def _spec(name: str, version: str, keys: str, schema: str) -> Any:
    from orchestrator.jobspec import parse_job_source

    source = SOURCE.replace('NAME = "user_profiles"', f'NAME = "{name}"').replace(
        'VERSION = "v1"', f'VERSION = "{version}"').replace(
        'KEY_COLUMNS = ["user_id"]', f"KEY_COLUMNS = {keys}")
    source = source[:source.index("OUTPUT_SCHEMA")] + f"OUTPUT_SCHEMA = {schema}\n" + \
        source[source.index("\n\n\ndef transform"):]
    return parse_job_source(source, f"{name}_{version}.py")


@pytest.fixture
def schemas(settings: Any) -> Any:
    from orchestrator.catalog import migrations

    tag = uuid.uuid4().hex[:8]
    settings = replace(settings, catalog_schema=f"catalog_{tag}", data_schema=f"data_{tag}",
                       serving_schema=f"serving_{tag}")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        migrations.migrate(conn, settings.catalog_schema)
    return settings


def _tables(conn: psycopg.Connection, s: Any, versions: list[Any], rows: str) -> None:
    """Each version's tables, with ROWS rows whose `plan` names the version."""
    from orchestrator.catalog import output

    for v in versions:
        output.create_tables(conn, s.catalog_schema, s.data_schema, v.spec, v.output_table,
                             v.dead_letter_table)
        conn.execute(sql.SQL("INSERT INTO {} (user_id, plan, updated_at) " + rows).format(
            sql.Identifier(s.data_schema, v.output_table)), {"plan": v.version, "n": ROWS})


def _route(conn: psycopg.Connection, s: Any, job: str, primary: str, candidate: str,
           percent: int) -> None:
    routing = sql.Identifier(s.catalog_schema, "aliases")
    conn.execute(sql.SQL("INSERT INTO {} (name) VALUES (%s) ON CONFLICT DO NOTHING").format(
        sql.Identifier(s.catalog_schema, "jobs")), (job,))
    conn.execute(sql.SQL(
        "INSERT INTO {} (name, job, serving_schema, primary_version, candidate_version, percent)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
        "primary_version = EXCLUDED.primary_version, "
        "candidate_version = EXCLUDED.candidate_version, percent = EXCLUDED.percent"
    ).format(routing), (job, job, s.serving_schema, primary, candidate, percent))


def _define(conn: psycopg.Connection, s: Any, job: str, versions: list[Any]) -> None:
    from orchestrator.serving import views

    views.define_view(conn, catalog_schema=s.catalog_schema, data_schema=s.data_schema,
                      serving_schema=s.serving_schema, reader_role=s.reader_role, alias=job,
                      versions=versions)


def _served(conn: psycopg.Connection, s: Any, job: str, key: str) -> dict[str, str]:
    rows = conn.execute(sql.SQL("SELECT {}::text, plan FROM {}").format(
        sql.SQL(key), sql.Identifier(s.serving_schema, job))).fetchall()
    assert len(rows) == len({k for k, _ in rows}), "a key served by two versions"
    return dict(rows)


def test_a_split_reads_stored_buckets_and_hashes_only_tables_made_before_them(schemas) -> None:
    from orchestrator.catalog import output
    from orchestrator.experiment.attribution import key_bucket

    s, job = schemas, "profiles_split"
    schema = ('{"user_id": "bigint", "plan": "text", "country": "text", "city": "text", '
              '"tags": "jsonb", "updated_at": "timestamptz"}')
    v1, v2 = (_version(_spec(job, v, '["user_id"]', schema), n) for n, v in ((1, "v1"),
                                                                            (2, "v2")))
    expected = {str(k): "v2" if key_bucket(str(k)) < 30 else "v1" for k in range(1, ROWS + 1)}
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        _tables(conn, s, [v1, v2], "SELECT g, %(plan)s, now() FROM generate_series(1, %(n)s) g")
        stored = conn.execute(sql.SQL("SELECT user_id::text, {} FROM {}").format(
            sql.Identifier(output.BUCKET_COLUMN),
            sql.Identifier(s.data_schema, v1.output_table))).fetchall()
        assert {k: b for k, b in stored} == {k: key_bucket(k) for k in expected}
        _route(conn, s, job, "v1", "v2", 30)
        _define(conn, s, job, [v1, v2])
        assert _served(conn, s, job, "user_id") == expected
        assert rows_hashed(conn, s.serving_schema, job) == 0
        # v1's table as an earlier release made it: its rows are hashed as they are read.
        conn.execute(sql.SQL("DROP VIEW {}").format(sql.Identifier(s.serving_schema, job)))
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
            sql.Identifier(s.data_schema, v1.output_table), sql.Identifier(output.BUCKET_COLUMN)))
        _define(conn, s, job, [v1, v2])
        assert _served(conn, s, job, "user_id") == expected
        assert rows_hashed(conn, s.serving_schema, job) == ROWS


def test_a_timestamptz_key_is_hashed_as_read_and_a_key_of_two_columns_is_stored_alike(
        schemas) -> None:
    from orchestrator.catalog import output

    s = schemas
    by_time = ('{"user_id": "bigint", "plan": "text", "country": "text", "city": "text", '
               '"tags": "jsonb", "updated_at": "timestamptz"}')
    timed = [_version(_spec("by_time", v, '["updated_at"]', by_time), n)
             for n, v in ((3, "v1"), (4, "v2"))]
    assert not output.stores_bucket(timed[0].spec)
    pair = [_version(_spec("by_pair", v, '["user_id", "plan"]', by_time), n)
            for n, v in ((5, "v1"), (6, "v2"))]
    assert output.stores_bucket(pair[0].spec)
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        _tables(conn, s, timed, "SELECT g, %(plan)s, timestamptz '2026-01-01 00:00+00' + "
                                "g * interval '1 second' FROM generate_series(1, %(n)s) g")
        assert output.tables_storing_bucket(
            conn, s.data_schema, [v.output_table for v in timed]) == set()
        _route(conn, s, "by_time", "v1", "v2", 40)
        _define(conn, s, "by_time", timed)
        served = _served(conn, s, "by_time", "updated_at")
        wanted = dict(conn.execute(sql.SQL(
            "SELECT updated_at::text, CASE WHEN {}.key_bucket(updated_at::text) < 40 THEN 'v2' "
            "ELSE 'v1' END FROM {}").format(sql.Identifier(s.catalog_schema),
                                            sql.Identifier(s.data_schema, timed[0].output_table)))
            .fetchall())
        assert served == wanted and set(served.values()) == {"v1", "v2"}
        assert rows_hashed(conn, s.serving_schema, "by_time") == 2 * ROWS

        # Two key columns: the stored bucket is the one the view computed from concat_ws.
        for v in pair:
            output.create_tables(conn, s.catalog_schema, s.data_schema, v.spec, v.output_table,
                                 v.dead_letter_table)
            conn.execute(sql.SQL("INSERT INTO {} (user_id, plan) SELECT g, 'p' || (g %% 7) "
                                 "FROM generate_series(1, %s) g").format(
                sql.Identifier(s.data_schema, v.output_table)), (ROWS,))
        mismatched = conn.execute(sql.SQL(
            "SELECT count(*) FROM {t} WHERE {b} IS DISTINCT FROM "
            "{c}.key_bucket(concat_ws(E'\\x1f', user_id::text, plan::text))").format(
            t=sql.Identifier(s.data_schema, pair[0].output_table), c=sql.Identifier(
                s.catalog_schema), b=sql.Identifier(output.BUCKET_COLUMN))).fetchone()
        assert mismatched == (0,)
        _route(conn, s, "by_pair", "v1", "v2", 50)
        _define(conn, s, "by_pair", pair)
        assert len(_served(conn, s, "by_pair", "user_id")) == ROWS
        assert rows_hashed(conn, s.serving_schema, "by_pair") == 0


KEY_VALUES = {  # each key type and ROWS distinct keys of it (boolean has two)
    "text": "'k' || g", "integer": "g", "bigint": "g::bigint * 1000000007", "numeric": "g * 1.25",
    "jsonb": "jsonb_build_object('g', g, 'f', g / 7.0)", "boolean": "g = 1",
    "double precision": "g / 3.0::float8",
}


@pytest.mark.parametrize("kind", sorted(KEY_VALUES))
def test_a_key_is_bucketed_alike_whatever_the_readers_settings(schemas, kind: str) -> None:
    """A stored bucket is the one a reader's session computes under any setting; a double
    precision key, whose text follows extra_float_digits, is hashed as read instead."""
    from orchestrator.catalog import output

    s, job = schemas, "by_" + kind.replace(" ", "_")
    schema = f'{{"k": "{kind}", "plan": "text"}}'
    pair = [_version(_spec(job, v, '["k"]', schema), n) for n, v in ((7, "v1"), (8, "v2"))]
    assert output.stores_bucket(pair[0].spec) == (kind != "double precision")
    keys = 2 if kind == "boolean" else ROWS
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        for v in pair:
            output.create_tables(conn, s.catalog_schema, s.data_schema, v.spec, v.output_table,
                                 v.dead_letter_table)
            conn.execute(sql.SQL("INSERT INTO {} (k, plan) SELECT " + KEY_VALUES[kind]
                                 + ", %s FROM generate_series(1, %s) g").format(
                sql.Identifier(s.data_schema, v.output_table)), (v.version, keys))
        _route(conn, s, job, "v1", "v2", 50)
        _define(conn, s, job, pair)
        conn.execute("SET extra_float_digits = 0")
        conn.execute("SET DateStyle = 'SQL, DMY'")
        conn.execute("SET TimeZone = 'Asia/Kathmandu'")
        served = _served(conn, s, job, "k")
        assert len(served) == keys
        wanted = dict(conn.execute(sql.SQL(
            "SELECT k::text, CASE WHEN {}.key_bucket(k::text) < 50 THEN 'v2' ELSE 'v1' END "
            "FROM {}").format(sql.Identifier(s.catalog_schema),
                              sql.Identifier(s.data_schema, pair[0].output_table))).fetchall())
        assert served == wanted
        assert rows_hashed(conn, s.serving_schema, job) == (0 if output.stores_bucket(pair[0].spec)
                                              else 2 * keys)
