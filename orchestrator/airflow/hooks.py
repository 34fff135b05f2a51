"""Settings from Airflow Connections: the PostgreSQL catalog and the Kafka cluster.

Passwords stay inside Airflow: the task SDK masks a connection's password in task logs, the DSN
we assemble is masked too, and neither goes to XCom or into a trigger's stored arguments (the
trigger gets connection ids and fetches the connection itself).

The Kafka connection (``kappa_kafka``) is read as the Apache Kafka provider stores it: login and
password are the SASL user and password; the extra holds librdkafka properties
(``bootstrap.servers``, ``security.protocol``, ``ssl.ca.location``, ``sasl.mechanism``, any
other) or our setting names (``kafka_security_protocol``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

if TYPE_CHECKING:
    from orchestrator.service import Orchestrator
    from orchestrator.settings import Settings

POSTGRES_CONN_ID = "kappa_postgres"
KAFKA_CONN_ID = "kappa_kafka"
# Connection extras that are libpq options; anything else in the extra is ignored.
_LIBPQ_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
                  "application_name", "options", "target_session_attrs")


def postgres_conninfo(conn: Any) -> str:
    """A libpq connection string from an Airflow connection (host may be a socket directory)."""
    from psycopg.conninfo import make_conninfo

    extra = conn.extra_dejson or {}
    params = {"host": conn.host, "port": conn.port, "user": conn.login,
              "password": conn.password, "dbname": conn.schema or extra.get("dbname")}
    params.update({k: extra[k] for k in _LIBPQ_OPTIONS if k in extra})
    return make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})


def kafka_bootstrap(conn: Any) -> str:
    """``bootstrap.servers`` from the extra (as the Apache Kafka provider stores it), else
    host[:port]."""
    extra = conn.extra_dejson or {}
    servers = extra.get("bootstrap.servers") or extra.get("bootstrap_servers")
    if servers:
        return str(servers)
    if not conn.host:
        raise ValueError(f"connection {conn.conn_id!r} names no Kafka broker: set its host "
                         "and port, or bootstrap.servers in its extra")
    return f"{conn.host}:{conn.port}" if conn.port else str(conn.host)


# Connection extras (librdkafka names or ours) that map to a named setting.
_KAFKA_SETTINGS = {
    "security.protocol": "kafka_security_protocol",
    "ssl.ca.location": "kafka_ssl_ca_location",
    "sasl.mechanism": "kafka_sasl_mechanism",
    "sasl.mechanisms": "kafka_sasl_mechanism",
    "sasl.username": "kafka_sasl_username",
    "kafka_security_protocol": "kafka_security_protocol",
    "kafka_ssl_ca_location": "kafka_ssl_ca_location",
    "kafka_sasl_mechanism": "kafka_sasl_mechanism",
    "kafka_sasl_username": "kafka_sasl_username",
    "kafka_sasl_password_file": "kafka_sasl_password_file",
}
# Extras that are the provider's own or that we set per client.
_KAFKA_IGNORED = ("bootstrap.servers", "bootstrap_servers", "group.id", "sasl.password")


def kafka_security(conn: Any) -> dict[str, Any]:
    """Setting changes for the Kafka connection's security: login, password and extra."""
    from orchestrator.kafka.endpoint import (
        SECRET_PROPERTIES,
        check_extra_properties,
        check_secret_properties,
    )

    extra = conn.extra_dejson or {}
    changes: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    for key, value in extra.items():
        if key in _KAFKA_SETTINGS:
            changes[_KAFKA_SETTINGS[key]] = str(value)
        elif key in SECRET_PROPERTIES and key not in _KAFKA_IGNORED:
            secrets[key] = value  # a connection is a secret store: kept like the password
        elif "." in key and key not in _KAFKA_IGNORED:
            properties[key] = value
    if properties:
        changes["kafka_properties"] = check_extra_properties(
            properties, f"the extra of Airflow connection {conn.conn_id!r}")
    if secrets:
        changes["kafka_secret_properties"] = check_secret_properties(secrets)
    if conn.login:
        changes["kafka_sasl_username"] = conn.login
    password = conn.password or extra.get("sasl.password")
    if password:
        changes["kafka_sasl_password"] = password
    return changes


def public_settings(settings: Settings) -> dict[str, str]:
    """Every setting except the secrets, as strings: safe to store with a trigger or in XCom."""
    from orchestrator.settings import SECRET_SETTINGS

    return {f.name: str(getattr(settings, f.name)) for f in fields(settings)
            if f.name not in (*SECRET_SETTINGS, "kafka_properties")
            and getattr(settings, f.name) is not None}


class KappaHook(BaseHook):
    """Builds the orchestrator's settings (and its facade) for a task or a trigger.

    Non-secret settings resolve as they do for the CLI (KAPPA_* environment, kappa.toml in
    ``project_dir``), overridden by ``settings``; the catalog DSN and the Kafka bootstrap come
    from the two connections. A connection that is not defined falls back to the CLI's
    configuration (e.g. `kappa dev up`), and the task log says so.
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = POSTGRES_CONN_ID
    conn_type = "postgres"
    hook_name = "Kappa orchestrator"

    def __init__(self, postgres_conn_id: str = POSTGRES_CONN_ID,
                 kafka_conn_id: str = KAFKA_CONN_ID, project_dir: str | None = None,
                 settings: Mapping[str, Any] | None = None):
        super().__init__()
        self.postgres_conn_id, self.kafka_conn_id = postgres_conn_id, kafka_conn_id
        self.project_dir = Path(project_dir) if project_dir else None
        self.overrides = dict(settings or {})

    def _base(self) -> Settings:
        from orchestrator.settings import load_settings

        return load_settings(self.overrides, cwd=self.project_dir)

    def _merge(self, base: Settings, pg: Any | None, kafka: Any | None) -> Settings:
        from airflow.sdk.log import mask_secret

        from orchestrator.errors import ConfigError

        changes: dict[str, Any] = {}
        if pg is not None:
            changes["pg_dsn"] = postgres_conninfo(pg)
        elif base.pg_dsn:
            self.log.warning("Airflow connection %s is not defined: using the PostgreSQL DSN "
                             "from the kappa configuration (KAPPA_PG_DSN, kappa.toml or `kappa "
                             "dev up`)", self.postgres_conn_id)
        if kafka is not None:
            changes["kafka_bootstrap"] = kafka_bootstrap(kafka)
            changes.update(kafka_security(kafka))
        elif base.kafka_bootstrap:
            self.log.warning("Airflow connection %s is not defined: using the Kafka bootstrap "
                             "from the kappa configuration", self.kafka_conn_id)
        settings = replace(base, **changes)
        from orchestrator.settings import SECRET_SETTINGS

        for name in SECRET_SETTINGS:
            secret = getattr(settings, name)
            for value in dict(secret).values() if isinstance(secret, tuple) else [secret]:
                if value:
                    mask_secret(value)
        missing = [f"{conn_id} ({kind})" for conn_id, kind, value in (
            (self.postgres_conn_id, "PostgreSQL", settings.pg_dsn),
            (self.kafka_conn_id, "Kafka", settings.kafka_bootstrap)) if not value]
        if missing:
            raise ConfigError(f"define the Airflow connection(s) {', '.join(missing)} (an "
                              "AIRFLOW_CONN_<ID> variable or your secrets backend); see the "
                              "README's Airflow section")
        settings.kafka  # noqa: B018 - security settings that do not fit fail here, in one line
        return settings

    def settings(self) -> Settings:
        return self._merge(self._base(), self._connection(self.postgres_conn_id),
                           self._connection(self.kafka_conn_id))

    async def asettings(self) -> Settings:
        return self._merge(self._base(), await self._aconnection(self.postgres_conn_id),
                           await self._aconnection(self.kafka_conn_id))

    def service(self) -> Orchestrator:
        from orchestrator.service import Orchestrator

        return Orchestrator(self.settings())

    async def aservice(self) -> Orchestrator:
        from orchestrator.service import Orchestrator

        return Orchestrator(await self.asettings())

    @classmethod
    def _connection(cls, conn_id: str) -> Any | None:
        try:
            return cls.get_connection(conn_id)
        except AirflowNotFoundException:
            return None

    @classmethod
    async def _aconnection(cls, conn_id: str) -> Any | None:
        try:
            return await cls.aget_connection(conn_id)
        except AirflowNotFoundException:
            return None
