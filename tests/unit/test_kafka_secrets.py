"""librdkafka properties that carry secrets are treated like the SASL password: never in a file
of settings, a Spark option, the driver's argv, a repr or a Spark conf listing; they reach the
clients through the environment only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.kafka.endpoint import SECRET_PROPERTIES, SECRETS_VARIABLE
from orchestrator.models import TopicInput
from orchestrator.settings import load_settings

SECRETS = {"ssl.key.pem": "-----BEGIN PRIVATE KEY-----\nMIIsecret-key\n",
           "ssl.key.password": "key-pass-7", "ssl.keystore.password": "store-pass-8",
           "sasl.oauthbearer.config": "clientSecret=oauth-9",
           "sasl.oauthbearer.client.secret": "oauth-secret-10"}
ENV = {"KAPPA_KAFKA_BOOTSTRAP": "b:9093", "KAPPA_KAFKA_SECURITY_PROTOCOL": "ssl",
       SECRETS_VARIABLE: json.dumps(SECRETS)}


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_a_secret_property_in_kappa_toml_is_refused(tmp_path: Path, name: str) -> None:
    assert name in SECRET_PROPERTIES
    (tmp_path / "kappa.toml").write_text(f'[kappa.kafka]\n"{name}" = "x"\n')
    with pytest.raises(ConfigError, match=SECRETS_VARIABLE):
        load_settings(env={"KAPPA_KAFKA_BOOTSTRAP": "b:9093"}, cwd=tmp_path)


def test_secrets_from_the_environment_reach_clients_and_nothing_else(tmp_path: Path) -> None:
    from orchestrator.spark.launch.launcher import driver_environment
    from orchestrator.spark.read.source import source_options
    from orchestrator.spark.session import _REDACT, spark_conf

    s = load_settings(env=ENV, cwd=tmp_path)
    config = s.kafka.client_config()
    assert all(config[k] == v for k, v in SECRETS.items())
    options = source_options(
        kafka=s.kafka, source=TopicInput("t", "a bigint", (), "dead_letter"), group_id="g",
        start_offsets={}, chunk_records=1, max_batch_records=1, version_id=1,
        catalog_schema="kappa", job="j", version="v1")
    conf = spark_conf(s, "app", None)
    listed = {k: v for k, v in conf.items() if not k.startswith("spark.executorEnv.")}
    for secret in SECRETS.values():
        for shown in (repr(s), repr(s.kafka), str(s.kafka.public_options()),
                      json.dumps(options), json.dumps(listed)):
            assert secret not in shown
    # Executors get them through their environment, in a key Spark's redaction hides.
    (key,) = [k for k, v in conf.items() if k.startswith("spark.executorEnv.")
              and "key-pass-7" in v]
    import re

    assert re.search(_REDACT, key)
    assert json.loads(driver_environment(s)[SECRETS_VARIABLE]) == SECRETS
