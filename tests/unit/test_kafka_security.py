"""Kafka security settings: precedence, the password's only sources, and what each client gets."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.errors import ConfigError
from orchestrator.kafka.admin import base_config
from orchestrator.kafka.endpoint import PASSWORD_VARIABLE, KafkaEndpoint
from orchestrator.settings import load_settings

SASL_ENV = {"KAPPA_KAFKA_BOOTSTRAP": "b:9093", "KAPPA_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "KAPPA_KAFKA_SASL_MECHANISM": "scram-sha-512", "KAPPA_KAFKA_SASL_USERNAME": "alice"}


def test_sasl_settings_reach_every_client_config(tmp_path: Path) -> None:
    (tmp_path / "kappa.toml").write_text(
        '[kappa]\nchunk_records = 5\n[kappa.kafka]\n"ssl.endpoint.identification.algorithm" = '
        '"none"\n"socket.keepalive.enable" = true\n')
    s = load_settings(env={**SASL_ENV, PASSWORD_VARIABLE: "pw-1"}, cwd=tmp_path)
    config = base_config(s.kafka)
    assert config["bootstrap.servers"] == "b:9093"
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (config["sasl.username"], config["sasl.password"]) == ("alice", "pw-1")
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    assert config["socket.keepalive.enable"] == "true"
    assert "pw-1" not in repr(s) and "pw-1" not in repr(s.kafka)
    assert "pw-1" not in str(s.kafka.public_options())


def test_password_comes_from_a_file_when_the_environment_has_none(tmp_path: Path) -> None:
    secret = tmp_path / "kafka.password"
    secret.write_text("from-file\n")
    s = load_settings({"kafka_sasl_password_file": str(secret)}, env=SASL_ENV, cwd=tmp_path)
    assert s.kafka.password == "from-file"
    s = load_settings({"kafka_sasl_password_file": str(secret)},
                      env={**SASL_ENV, PASSWORD_VARIABLE: "from-env"}, cwd=tmp_path)
    assert s.kafka.password == "from-env"


def test_password_is_never_taken_from_a_flag_or_kappa_toml(tmp_path: Path) -> None:
    s = load_settings({"kafka_sasl_password": "flagged"}, env={}, cwd=tmp_path)
    assert s.kafka_sasl_password is None
    (tmp_path / "kappa.toml").write_text('[kappa]\nkafka_sasl_password = "oops"\n')
    with pytest.raises(ConfigError, match="never write the SASL password"):
        load_settings(env={}, cwd=tmp_path)
    (tmp_path / "kappa.toml").write_text('[kappa.kafka]\n"sasl.password" = "oops"\n')
    with pytest.raises(ConfigError, match="is a secret"):
        load_settings(env={}, cwd=tmp_path)


@pytest.mark.parametrize(("env", "names"), [
    ({**SASL_ENV}, "KAPPA_KAFKA_SASL_PASSWORD"),
    ({**SASL_ENV, "KAPPA_KAFKA_SASL_MECHANISM": "GSSAPI", PASSWORD_VARIABLE: "p"},
     "kafka_sasl_mechanism"),
    ({**SASL_ENV, "KAPPA_KAFKA_SASL_USERNAME": "", PASSWORD_VARIABLE: "p"},
     "kafka_sasl_username"),
    ({"KAPPA_KAFKA_BOOTSTRAP": "b:1", "KAPPA_KAFKA_SECURITY_PROTOCOL": "TLS"},
     "kafka_security_protocol"),
    ({"KAPPA_KAFKA_BOOTSTRAP": "b:1", "KAPPA_KAFKA_SECURITY_PROTOCOL": "SSL",
      "KAPPA_KAFKA_SSL_CA_LOCATION": "/nowhere/ca.pem"}, "kafka_ssl_ca_location"),
])
def test_security_settings_that_do_not_fit_fail_at_load_naming_the_setting(
    tmp_path: Path, env: dict[str, str], names: str
) -> None:
    with pytest.raises(ConfigError, match=names):
        load_settings(env=env, cwd=tmp_path)


def test_named_properties_are_refused_in_the_free_form_table(tmp_path: Path) -> None:
    (tmp_path / "kappa.toml").write_text('[kappa.kafka]\n"security.protocol" = "SSL"\n')
    with pytest.raises(ConfigError, match="kafka_security_protocol"):
        load_settings(env={}, cwd=tmp_path)


def test_drivers_get_the_same_endpoint_through_their_environment(tmp_path: Path) -> None:
    (tmp_path / "kappa.toml").write_text('[kappa.kafka]\n"client.rack" = "r1"\n')
    s = load_settings(env={**SASL_ENV, PASSWORD_VARIABLE: "pw"}, cwd=tmp_path)
    env = s.driver_environment()
    assert env[PASSWORD_VARIABLE] == "pw"
    again = load_settings(env=env, cwd=Path("/"))
    assert again.kafka == s.kafka
    assert again.kafka.extra == (("client.rack", "r1"),)


def test_executors_rebuild_the_endpoint_from_options_and_their_environment() -> None:
    endpoint = KafkaEndpoint("b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_username="u", password="pw", extra=(("a.b", "c"),))
    assert KafkaEndpoint.from_options(endpoint.public_options(), "pw") == endpoint


def test_airflow_kafka_connection_carries_security() -> None:
    from orchestrator.airflow.hooks import kafka_security, public_settings

    conn = SimpleNamespace(
        conn_id="kappa_kafka", login="alice", password="conn-pw",
        extra_dejson={"bootstrap.servers": "b:9093", "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanism": "PLAIN", "client.rack": "r2"})
    changes = kafka_security(conn)
    assert changes["kafka_security_protocol"] == "SASL_PLAINTEXT"
    assert changes["kafka_sasl_username"] == "alice"
    assert changes["kafka_sasl_password"] == "conn-pw"
    assert changes["kafka_properties"] == (("client.rack", "r2"),)
    s = load_settings(env={"KAPPA_KAFKA_BOOTSTRAP": "b:9093"}, cwd=Path("/"))
    from dataclasses import replace
    s = replace(s, **changes)
    assert "conn-pw" not in str(public_settings(s))
    assert s.kafka.password == "conn-pw"


def test_a_read_task_pickled_for_the_executors_carries_no_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """#47, path 7: pyspark pickles the stream reader into every read task. The reader held the
    endpoint with its SASL password, so the password travelled in each task and sat in Spark's
    task files, against kafka/endpoint.py's promise. The executor builds it again from its own
    environment."""
    import json

    from pyspark import cloudpickle  # what pyspark pickles read tasks with

    from orchestrator.kafka.endpoint import SECRETS_VARIABLE
    from orchestrator.spark.read.source import KafkaStreamReader

    password, key_secret = "pw-3f9c1e7a", "key-pw-8d2b6c40"
    monkeypatch.setenv(PASSWORD_VARIABLE, password)
    monkeypatch.setenv(SECRETS_VARIABLE, json.dumps({"ssl.key.password": key_secret}))
    endpoint = KafkaEndpoint("b:1", security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                             sasl_username="u", password=password)
    reader = KafkaStreamReader({
        "kafka": json.dumps(endpoint.public_options()), "topic": "t", "group_id": "g",
        "chunk_records": "10", "max_batch_records": "10"})
    assert reader.kafka.password == password  # the driver's reader has it
    pickled = cloudpickle.dumps(reader)
    assert password.encode() not in pickled and key_secret.encode() not in pickled
    executor_side = cloudpickle.loads(pickled)
    assert executor_side.kafka == reader.kafka  # rebuilt from this process's environment
