from __future__ import annotations

import json
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
