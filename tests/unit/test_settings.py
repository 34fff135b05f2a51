from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import Settings, load_settings


def _stack(tmp_path: Path) -> None:
    record = tmp_path / ".kappa" / "dev" / "stack.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"pg_dsn": "postgresql:///stack", "kafka_bootstrap": "s:1"}))


def test_precedence_flag_env_file_stack_default(tmp_path: Path) -> None:
    _stack(tmp_path)
    (tmp_path / "kappa.toml").write_text(
        '[kappa]\nkafka_bootstrap = "file:1"\nspark_master = "spark://file:7077"\n'
        'chunk_records = 7\n')
    env = {"KAPPA_KAFKA_BOOTSTRAP": "env:1", "KAPPA_SPARK_MASTER": "spark://env:7077"}
    s = load_settings({"spark_master": "spark://flag:7077"}, env=env, cwd=tmp_path)
    assert s.spark_master == "spark://flag:7077"  # flag beats env
    assert s.kafka_bootstrap == "env:1"  # env beats file and stack
    assert s.chunk_records == 7  # file beats default
    assert s.pg_dsn == "postgresql:///stack"  # stack fills what nothing else set
    assert s.catalog_schema == "kappa"  # default
    assert s.state_dir == (tmp_path / ".kappa").resolve()


def test_external_services_win_over_the_stack(tmp_path: Path) -> None:
    _stack(tmp_path)
    env = {"KAPPA_PG_DSN": "postgresql:///ext", "KAPPA_KAFKA_BOOTSTRAP": "ext:9092"}
    s = load_settings(env=env, cwd=tmp_path)
    assert (s.pg_dsn, s.kafka_bootstrap) == ("postgresql:///ext", "ext:9092")


def test_missing_services_say_what_to_run(tmp_path: Path) -> None:
    s = load_settings(env={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="kappa dev up"):
        s.require_services()


def test_bad_toml_values(tmp_path: Path) -> None:
    (tmp_path / "kappa.toml").write_text("chunk_records = 'many'\n")
    with pytest.raises(ConfigError, match="chunk_records"):
        load_settings(env={}, cwd=tmp_path)
    (tmp_path / "kappa.toml").write_text("nonsense = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(env={}, cwd=tmp_path)


def test_dsn_is_never_in_repr() -> None:
    s = Settings(pg_dsn="postgresql://u:secret@h/db")
    assert "secret" not in repr(s)


def test_settings_round_trip_through_driver_environment(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, pg_dsn="postgresql:///x", kafka_bootstrap="b:1",
                 chunk_records=11, live_trigger_seconds=0.5)
    assert load_settings(env=s.driver_environment(), cwd=Path("/")) == s


def test_a_switch_reads_true_or_false_and_round_trips(tmp_path: Path) -> None:
    assert load_settings(env={"KAPPA_PRUNE_COLUMNS": "false"}, cwd=tmp_path).prune_columns is False
    (tmp_path / "kappa.toml").write_text("[kappa]\nprune_columns = true\n")
    assert load_settings(env={}, cwd=tmp_path).prune_columns is True
    with pytest.raises(ConfigError, match="prune_columns='maybe' is not true or false"):
        load_settings(env={"KAPPA_PRUNE_COLUMNS": "maybe"}, cwd=tmp_path)
    s = Settings(state_dir=tmp_path, prune_columns=False)
    assert load_settings(env=s.driver_environment(), cwd=Path("/")) == s


def test_the_schema_registrys_credentials_come_only_from_the_environment_or_a_file(
        tmp_path: Path) -> None:
    url = {"KAPPA_SCHEMA_REGISTRY_URL": "https://registry.example:8081/"}
    env = {**url, "KAPPA_SCHEMA_REGISTRY_USER_INFO": "reader:pw-from-env",
           "KAPPA_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem"}
    s = load_settings(env=env, cwd=tmp_path)
    registry = s.schema_registry
    assert registry is not None
    assert (registry.url, registry.user_info, registry.ca_location) == (
        "https://registry.example:8081", "reader:pw-from-env", "/etc/ca.pem")
    assert "pw-from-env" not in repr(s) and "pw-from-env" not in repr(registry)
    assert load_settings(env=s.driver_environment(), cwd=Path("/")) == s  # a driver's
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    s = load_settings(env={**url, "KAPPA_SCHEMA_REGISTRY_TOKEN_FILE": str(token)}, cwd=tmp_path)
    assert s.schema_registry is not None and s.schema_registry.token == "t0ken"
    assert load_settings(env={}, cwd=tmp_path).schema_registry is None
    refused = [
        ({**url, "KAPPA_SCHEMA_REGISTRY_USER_INFO": "a:b", "KAPPA_SCHEMA_REGISTRY_TOKEN": "t"},
         "both basic auth"),
        ({**url, "KAPPA_SCHEMA_REGISTRY_USER_INFO": "no-colon-secret"}, "must read user:password"),
        ({"KAPPA_SCHEMA_REGISTRY_URL": "https://u:url-secret@r:8081"}, "holds credentials"),
        ({"KAPPA_SCHEMA_REGISTRY_URL": "registry:8081"}, "is not an http(s) URL"),
        ({**url, "KAPPA_SCHEMA_REGISTRY_USER_INFO_FILE": str(tmp_path / "none")},
         "cannot be read"),
    ]
    for refused_env, says in refused:
        with pytest.raises(ConfigError) as raised:
            load_settings(env=refused_env, cwd=tmp_path)
        assert says in str(raised.value) and "secret" not in str(raised.value), raised.value
    (tmp_path / "kappa.toml").write_text('[kappa]\nschema_registry_user_info = "a:toml-pw"\n')
    with pytest.raises(ConfigError, match=re.escape(
            "never write schema_registry_user_info in kappa.toml: put it in "
            "KAPPA_SCHEMA_REGISTRY_USER_INFO or in a file named by "
            "schema_registry_user_info_file")):
        load_settings(env={}, cwd=tmp_path)
