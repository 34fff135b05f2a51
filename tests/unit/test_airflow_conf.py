"""A DAG run's conf is checked before anything is touched; connections become settings."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.airflow.hooks import kafka_bootstrap, postgres_conninfo, public_settings
from orchestrator.airflow.run_conf import (
    checked_reprocess,
    parse_ramp,
    parse_reprocess,
    parse_retire,
    parse_rollback,
)
from orchestrator.errors import ConfigError, InvalidNameError
from orchestrator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
V2 = "jobs/pageview_counts/v2.py"


def test_a_minimal_conf_gets_the_defaults() -> None:
    request = parse_reprocess({"job_file": V2}, ROOT)
    assert request.job_file == ROOT / V2
    assert request.ramp == (10, 50, 100)
    assert (request.soak_seconds, request.max_lag, request.retire_previous) == (60.0, 0, False)
    assert request.alias is None


def test_the_checked_conf_names_the_job_and_is_plain_json() -> None:
    checked = checked_reprocess({"job_file": V2, "ramp": [25], "soak_seconds": 5}, ROOT)
    assert (checked["job"], checked["version"]) == ("pageview_counts", "v2")
    assert checked["ramp"] == [25, 100]  # a ramp always ends serving the new version fully
    assert checked["fingerprint"].startswith("sha256:")
    assert json.loads(json.dumps(checked)) == checked  # what XCom stores


@pytest.mark.parametrize(("conf", "says"), [
    ({}, "job_file is required"),
    ({"job_file": V2, "retire_prevous": True}, "unknown conf key(s) 'retire_prevous'"),
    ({"job_file": "jobs/none.py"}, "does not exist"),
    ({"job_file": "../../etc/passwd"}, "outside the project"),
    ({"job_file": "/etc/passwd"}, "outside the project"),
    ({"job_file": V2, "ramp": [50, 10]}, "increasing percentages"),
    ({"job_file": V2, "ramp": [0, 100]}, "increasing percentages"),
    ({"job_file": V2, "ramp": "10,100"}, "increasing percentages"),
    ({"job_file": V2, "ramp": []}, "increasing percentages"),
    ({"job_file": V2, "soak_seconds": -1}, "soak_seconds must be a number"),
    ({"job_file": V2, "soak_seconds": float("nan")}, "soak_seconds must be a number"),
    ({"job_file": V2, "catch_up_timeout_minutes": float("inf")}, "must be a number"),
    ({"job_file": V2, "max_lag": 1.5}, "max_lag must be a whole number"),
    ({"job_file": V2, "max_lag": True}, "max_lag must be a whole number"),
    ({"job_file": V2, "retire_previous": "yes"}, "retire_previous must be true or false"),
    ({"job_file": V2, "metrics": ["converts"]}, 'metrics judge an outcome cutover: add "strategy"'),
    ({"job_file": V2, "look_seconds": 5}, "look_seconds judge an outcome cutover"),
    ({"job_file": V2, "strategy": "canary", "metrics": ["c"]}, 'strategy must be "ab" or'),
    ({"job_file": V2, "strategy": "bandit"}, "needs at least one metric NAME"),
    ({"job_file": V2, "strategy": "bandit", "metrics": "converts"}, "must be a list of metric"),
    ({"job_file": V2, "strategy": "bandit", "metrics": ["c"], "min_percent": 60,
      "max_percent": 40}, "min_percent"),
    ({"job_file": V2, "strategy": "ab", "metrics": ["c"], "max_step": 2.5},
     "max_step must be a whole number"),
    ({"job_file": V2, "strategy": "ab", "metrics": ["c"], "alpha": 0.7}, "alpha must be in"),
    ({"job_file": V2, "strategy": "ab", "metrics": ["c", "c"]}, "metric names repeat"),
    ({"job_file": V2, "strategy": "ab", "metrics": ["no good"]}, "metric name"),
    ({"job_file": V2, "breaking": "yes"}, "breaking must be true or false"),
    ({"job_file": V2, "allow_incompatible": 1}, "allow_incompatible must be true or false"),
    ({"job_file": V2, "priority": 1001}, "priority 1001 is not valid: give an integer from"),
    ({"job_file": V2, "priority": "high"}, "conf priority must be a whole number"),
    ({"job_file": V2, "priority": 2.5}, "conf priority must be a whole number"),
    ({"job_file": V2, "priority": True}, "conf priority must be a whole number"),
])
def test_bad_confs_get_one_line_saying_what_to_fix(conf: dict, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_reprocess(conf, ROOT)
    assert says in str(info.value)
    assert "\n" not in str(info.value)


def test_an_outcome_conf_becomes_the_design_the_cli_would_make() -> None:
    from orchestrator.experiment.design import ExperimentDesign, Strategy

    conf = {"job_file": V2, "strategy": "bandit", "metrics": ["converts", "errors"],
            "start_percent": 20, "min_percent": 10, "max_percent": 60, "max_step": 20,
            "look_seconds": 2, "max_duration": 600, "no_data_timeout": 60, "alpha": 0.05,
            "mixture_sd": 0.2, "min_per_arm": 200, "allow_non_inferior": True}
    checked = checked_reprocess(conf, ROOT)
    assert json.loads(json.dumps(checked)) == checked
    design = ExperimentDesign.from_json(checked["experiment"])
    assert design == ExperimentDesign(
        Strategy.BANDIT, ("converts", "errors"), start_percent=20, min_percent=10,
        max_percent=60, max_step=20, look_seconds=2.0, max_duration_s=600.0,
        no_data_timeout_s=60.0, alpha=0.05, mixture_sd=0.2, min_per_arm=200,
        allow_non_inferior=True)
    assert checked_reprocess({"job_file": V2}, ROOT)["experiment"] is None
    assert checked["breaking"] is False
    assert checked_reprocess({"job_file": V2, "breaking": True}, ROOT)["breaking"] is True
    # Its place in the replay queue, as `kappa deploy --priority`.
    assert checked["priority"] == 0
    assert checked_reprocess({"job_file": V2, "priority": -7}, ROOT)["priority"] == -7
    # An Avro reader that cannot read some writer schemas, as `kappa deploy --allow-incompatible`.
    assert checked["allow_incompatible"] is False
    assert checked_reprocess({"job_file": V2, "allow_incompatible": True},
                             ROOT)["allow_incompatible"] is True


def test_a_hostile_alias_is_refused() -> None:
    with pytest.raises(InvalidNameError):
        parse_reprocess({"job_file": V2, "alias": 'x"; drop table y'}, ROOT)


def test_ramp_parsing() -> None:
    assert parse_ramp([100]) == (100,)
    assert parse_ramp([1, 2, 3]) == (1, 2, 3, 100)
    with pytest.raises(ConfigError):
        parse_ramp([10, 10, 100])
    with pytest.raises(ConfigError):
        parse_ramp([True, 100])


def test_rollback_and_retire_confs() -> None:
    assert parse_rollback({"job": "pageview_counts"}).job == "pageview_counts"
    assert not parse_rollback({"job": "pageview_counts"}).force
    assert parse_rollback({"job": "pageview_counts", "force": True, "reason": "why"}).force
    with pytest.raises(ConfigError, match="force must be true or false"):
        parse_rollback({"job": "a", "force": "yes"})
    with pytest.raises(ConfigError, match="job is required"):
        parse_rollback({})
    with pytest.raises(ConfigError, match="unknown conf key"):
        parse_rollback({"job": "a", "version": "v1"})
    retire = parse_retire({"job": "pageview_counts", "version": "v1", "drop": True})
    assert (retire.version, retire.drop) == ("v1", True)
    with pytest.raises(ConfigError, match="job and version are required"):
        parse_retire({"job": "pageview_counts"})
    with pytest.raises(ConfigError, match="drop must be true or false"):
        parse_retire({"job": "a", "version": "v1", "drop": "no"})


def _conn(**fields: object) -> SimpleNamespace:
    base = {"conn_id": "c", "host": None, "port": None, "login": None, "password": None,
            "schema": None, "extra_dejson": {}}
    return SimpleNamespace(**{**base, **fields})


def test_a_postgres_connection_becomes_a_libpq_string() -> None:
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(postgres_conninfo(_conn(
        host="db.example", port=5433, login="kappa", password="p w'x", schema="catalog",
        extra_dejson={"sslmode": "require", "unrelated": "ignored"})))
    assert info == {"host": "db.example", "port": "5433", "user": "kappa", "password": "p w'x",
                    "dbname": "catalog", "sslmode": "require"}
    socket = conninfo_to_dict(postgres_conninfo(_conn(host="/run/pg", login="postgres")))
    assert socket == {"host": "/run/pg", "user": "postgres"}


def test_a_kafka_connection_becomes_bootstrap_servers() -> None:
    assert kafka_bootstrap(_conn(extra_dejson={"bootstrap.servers": "a:9092,b:9092"})) == \
        "a:9092,b:9092"
    assert kafka_bootstrap(_conn(host="broker", port=9092)) == "broker:9092"
    with pytest.raises(ValueError, match="names no Kafka broker"):
        kafka_bootstrap(_conn())


def test_public_settings_leave_out_every_secret() -> None:
    settings = Settings(pg_dsn="postgresql://u:secret@h/db", kafka_bootstrap="b:1",
                        kafka_sasl_password="secret-sasl",
                        kafka_secret_properties=(("ssl.key.password", "secret-key"),),
                        schema_registry_url="https://r:8081",
                        schema_registry_user_info="u:secret-registry",
                        schema_registry_token="secret-token")
    public = public_settings(settings)
    assert "pg_dsn" not in public and "secret" not in json.dumps(public), public
    assert public["kafka_bootstrap"] == "b:1"
    assert public["schema_registry_url"] == "https://r:8081"


def test_missing_connections_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.airflow.hooks import KappaHook

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    for name in ("KAPPA_PG_DSN", "KAPPA_KAFKA_BOOTSTRAP", "KAPPA_CONFIG", "KAPPA_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as info:
        KappaHook("no_such_pg", "no_such_kafka", project_dir=str(tmp_path)).settings()
    assert "no_such_pg (PostgreSQL), no_such_kafka (Kafka)" in str(info.value)
