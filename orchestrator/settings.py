"""Settings, resolved as: flag > environment (KAPPA_*) > kappa.toml > `kappa dev up` > default.

The PostgreSQL DSN and the Kafka SASL password are never printed, logged or put in argv (drivers
get them through their environment). The SASL password comes only from the environment
(``KAPPA_KAFKA_SASL_PASSWORD``), a file named by ``kafka_sasl_password_file``, or an Airflow
connection; free-form librdkafka properties come from a ``[kappa.kafka]`` table.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.kafka.endpoint import (
    PASSWORD_VARIABLE,
    SECRETS_VARIABLE,
    KafkaEndpoint,
    check_extra_properties,
    check_secret_properties,
)
from orchestrator.kafka.registry_endpoint import (
    TOKEN_VARIABLE,
    USER_INFO_VARIABLE,
    RegistryEndpoint,
    registry_endpoint,
)

STACK_FILE = "dev/stack.json"
# The settings that hold secrets: never stored, shown or logged (Airflow masks them).
SECRET_SETTINGS = ("pg_dsn", "kafka_sasl_password", "kafka_secret_properties",
                   "schema_registry_user_info", "schema_registry_token")
# Secrets read only from these variables (or a file that a setting names), never kappa.toml.
_SECRETS_FROM_ENV = {"schema_registry_user_info": USER_INFO_VARIABLE,
                     "schema_registry_token": TOKEN_VARIABLE}
# The catalog's DSN in the environment: the drivers' setting, and what executors write with.
DSN_VARIABLE = "KAPPA_PG_DSN"


@dataclass(frozen=True)
class Settings:
    state_dir: Path = Path(".kappa")  # drivers' logs, checkpoints, the embedded stack's state
    # The catalog's PostgreSQL (libpq DSN): versions, offsets, aliases, outputs.
    pg_dsn: str | None = field(default=None, repr=False)
    kafka_bootstrap: str | None = None  # the Kafka cluster's bootstrap servers, host:port,...
    # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_ssl_ca_location: str | None = None  # PEM file of the CA that signed the brokers' certs
    kafka_sasl_mechanism: str | None = None  # PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    kafka_sasl_username: str | None = None  # the SASL user
    # A file holding the SASL password (instead of KAPPA_KAFKA_SASL_PASSWORD).
    kafka_sasl_password_file: str | None = None
    # The SASL password: only from the environment, a file, or an Airflow connection.
    kafka_sasl_password: str | None = field(default=None, repr=False)
    # Any other librdkafka property, e.g. ssl.endpoint.identification.algorithm.
    kafka_properties: tuple[tuple[str, str], ...] = ()
    # librdkafka properties that carry secrets (ssl.key.pem, ssl.key.password, ...): only from
    # the environment (KAPPA_KAFKA_SECRET_PROPERTIES, a JSON object), like the SASL password.
    kafka_secret_properties: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # The schema registry of Avro and Protobuf events (Confluent's REST API, which Karapace,
    # Redpanda and Apicurio also serve); its TLS trusts kafka_ssl_ca_location.
    schema_registry_url: str | None = None
    schema_registry_user_info_file: str | None = None  # a file holding its "user:password"
    schema_registry_token_file: str | None = None  # a file holding its bearer token
    # Its basic auth, "user:password": only from the environment or the file above.
    schema_registry_user_info: str | None = field(default=None, repr=False)
    # Its bearer token: only from the environment or the file above.
    schema_registry_token: str | None = field(default=None, repr=False)
    spark_master: str = "local[*]"  # where drivers run Spark: local[N] or spark://HOST:PORT
    # Where versions' checkpoints live: a path, or any URI Spark accepts (hdfs://, s3a://), so
    # that a driver can move hosts. Default: <state_dir>/checkpoints.
    checkpoint_root: str | None = None
    # Where the archive of the log keeps its segments: a path, or any URI that pyarrow's
    # filesystems accept (s3://, gs://, hdfs://). Default: <state_dir>/archive.
    archive_root: str | None = None
    archive_segment_records: int = 100_000  # records (and gaps) a segment holds at most
    # The archiver decodes each segment once per decoding that a version reads it with, and
    # replays read those typed segments with no parse; false: neither (raw segments only).
    decoded_segments: bool = True
    # Records per catch-up batch where the sink reads decoded segments with Spark's Parquet
    # reader: no record passes through Python, so a batch's size costs no driver memory, and
    # fewer batches cost fewer fixed costs (a Spark job and a commit each).
    decoded_batch_records: int = 10_000_000
    # Such a catch-up of a batch job runs as plain Spark batch jobs, tile by tile (at most
    # decoded_batch_records each), before the streaming query starts (spark/batch_phase.py);
    # false: as a streaming query from its first batch.
    batch_phase: bool = True
    catalog_schema: str = "kappa"  # the orchestrator's own tables
    data_schema: str = "kappa_data"  # the versions' output and dead-letter tables
    serving_schema: str = "serving"  # where aliases live: the only schema readers may read
    reader_role: str = "kappa_reader"  # granted SELECT on the serving schema, nothing else
    spark_driver_memory: str = "1g"  # each driver's JVM heap (spark.driver.memory)
    spark_executor_memory: str = "1g"  # each executor's heap on a cluster
    spark_executor_cores: int = 2  # cores per executor on a cluster
    # Cores a version may take on a standalone cluster (spark.cores.max); None: all it offers.
    spark_cores_max: int | None = None
    # The address executors on other hosts reach the driver at, and the one it listens on.
    spark_driver_host: str = "127.0.0.1"
    spark_driver_bind_address: str = "127.0.0.1"  # where the driver listens (see above)
    # Catch-up profile: cap records per micro-batch and split each partition's range into chunks
    # of at most this many records, so parallelism is not capped by the partition count.
    max_batch_records: int = 500_000
    chunk_records: int = 125_000  # records a read task takes at most (see above)
    # Read tasks build and move only the source columns the job's plan reads (see
    # spark/read/pruning.py); false: every column, as before.
    prune_columns: bool = True
    live_trigger_seconds: float = 1.0  # a live version's micro-batch interval
    # Warm spare drivers kept on this host: a JVM, a session and Python workers started and
    # waiting for a deploy to adopt one (spark/launch/spares.py); 0 turns them off. Each holds about
    # spark_driver_memory plus 640 MiB, and is started only while twice that is available.
    warm_spares: int = 1
    # Where spares wait; default <tmp>/kappa-spares-<uid>, shared by this user's deployments on
    # this host (a deploy adopts only a spare whose settings fingerprint matches its own).
    spare_dir: Path | None = None
    spare_idle_s: float = 3600.0  # a spare nobody adopted for this long exits
    # The Python processes a driver's JVM starts on its host are forked from a process that has
    # imported pyspark and the log source once (spark/launch/zygote.py); false: each starts afresh.
    python_fork_server: bool = True
    # Catch-ups (versions replaying toward the log end, not yet caught up) that run at once; a
    # deploy over it waits in the replay queue (`kappa queue`) until one catches up. None: half
    # this host's cores, at least 2 (a catch-up's driver keeps two cores busy); 0: no budget.
    replay_slots: int | None = None
    # Live first: while versions catch up, the live versions stay within this many seconds of
    # the log end. One half of it behind holds the replay queue and pauses the lowest-priority
    # catch-up (one more per half while it stays behind), which resumes from its checkpoint
    # once every live version is back under a quarter. Only `kappa agent` measures and
    # pauses. 0: off.
    live_lag_protect_s: float = 60.0
    heartbeat_interval_s: float = 2.0  # how often a driver records that it is alive
    # A driver on another host that has not beaten for this long counts as dead.
    heartbeat_timeout_s: float = 30.0
    # A version is caught up, and may be served, when the *measured* lag is at most this.
    max_lag_records: int = 1000
    # A switch judges a version by its latest lag sample (agent, `kappa lag`, `kappa wait`) when
    # it is at most this old; otherwise it asks the broker before taking any lock.
    lag_sample_max_age_s: float = 15.0
    # Batch records kept per version in full; older ones are folded into a summary.
    batches_kept: int = 1000
    # Events kept in the event log (`kappa events`); older ones are deleted.
    events_kept: int = 100_000
    # A driver's log is rotated at this size (one older file is kept).
    driver_log_max_bytes: int = 50_000_000
    # The exporter's label naming a kappa job: "kappa_job", or "job" as before this release
    # (scraped with honor_labels: true; the dashboard and the alert rules use kappa_job).
    metrics_job_label: str = "kappa_job"
    # Where outcome metrics' SQL runs (the application's own database); default: pg_dsn.
    outcomes_pg_dsn: str | None = field(default=None, repr=False)
    metric_statement_timeout_ms: int = 10_000  # an outcome metric's query is cancelled after it
    # A column of every alias view that names the version serving the row (e.g. "served_by"),
    # for applications that label their outcomes by it; None: no such column.
    alias_version_column: str | None = None
    # Prometheus's base URL (e.g. http://127.0.0.1:9090), where PromQL outcome metrics are read.
    prometheus_url: str | None = None

    @property
    def replay_budget(self) -> int | None:
        """Catch-ups that may run at once; None: no budget (replay_slots = 0)."""
        if self.replay_slots is None:
            return max(2, (os.cpu_count() or 2) // 2)
        if self.replay_slots < 0:
            raise ConfigError(f"setting replay_slots={self.replay_slots} is negative: give the "
                              "number of catch-ups that may run at once, or 0 for no budget")
        return self.replay_slots or None

    @property
    def live_lag_limit_s(self) -> float | None:
        """The live lag that pauses catch-ups; None: no protection (live_lag_protect_s = 0)."""
        if self.live_lag_protect_s < 0:
            raise ConfigError(f"setting live_lag_protect_s={self.live_lag_protect_s:g} is "
                              "negative: give the seconds a live version may fall behind "
                              "before catch-ups pause, or 0 for no protection")
        return self.live_lag_protect_s or None

    @property
    def dev_stack_file(self) -> Path:
        return self.state_dir / STACK_FILE

    @property
    def kafka(self) -> KafkaEndpoint:
        """The Kafka cluster with its security settings (ConfigError if they do not fit)."""
        if not self.kafka_bootstrap:
            raise ConfigError("no KAPPA_KAFKA_BOOTSTRAP configured: run `kappa dev up` in this "
                              "directory, or set it (environment or kappa.toml)")
        return KafkaEndpoint(
            bootstrap=self.kafka_bootstrap, security_protocol=self.kafka_security_protocol,
            ssl_ca_location=self.kafka_ssl_ca_location, sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username, password=self._sasl_password(),
            extra=self.kafka_properties, secrets=self.kafka_secret_properties,
        )

    @property
    def schema_registry(self) -> RegistryEndpoint | None:
        """The schema registry, None if none is configured (ConfigError if it cannot be)."""
        if not self.schema_registry_url:
            return None
        return registry_endpoint(
            self.schema_registry_url, user_info=self.schema_registry_user_info,
            user_info_file=self.schema_registry_user_info_file,
            token=self.schema_registry_token, token_file=self.schema_registry_token_file,
            ca_location=self.kafka_ssl_ca_location)

    def _sasl_password(self) -> str | None:
        if self.kafka_sasl_password:
            return self.kafka_sasl_password
        if not self.kafka_sasl_password_file:
            return None
        path = Path(self.kafka_sasl_password_file)
        try:
            return path.read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"kafka_sasl_password_file={path} cannot be read "
                              f"({exc.strerror}): fix the path or its permissions") from exc

    def require_services(self) -> tuple[str, KafkaEndpoint]:
        """Return (pg_dsn, the Kafka endpoint) or say how to get them."""
        if not self.pg_dsn or not self.kafka_bootstrap:
            missing = [
                n for n, v in (("KAPPA_PG_DSN", self.pg_dsn),
                               ("KAPPA_KAFKA_BOOTSTRAP", self.kafka_bootstrap)) if not v
            ]
            raise ConfigError(
                f"no {' and '.join(missing)} configured: run `kappa dev up` in this directory, "
                "or set them (environment or kappa.toml)"
            )
        return self.pg_dsn, self.kafka

    def driver_environment(self) -> dict[str, str]:
        """Everything a detached driver needs, passed by environment (never argv)."""
        env = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("kafka_properties", "kafka_secret_properties"):
                if value:
                    env[f"KAPPA_{f.name.upper()}"] = json.dumps(dict(value))
            elif value is not None:
                env[f"KAPPA_{f.name.upper()}"] = str(value)
        return env


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if name == "kafka_secret_properties":
        try:
            secrets = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            secrets = None  # the error must not quote the secret
        if not isinstance(secrets, Mapping):
            raise ConfigError(f"{SECRETS_VARIABLE} must be a JSON object of secret librdkafka "
                              "properties: fix it")
        return check_secret_properties(secrets)
    if name == "kafka_properties":
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigError("KAPPA_KAFKA_PROPERTIES must be a JSON object of librdkafka "
                                  f"properties ({exc}): fix it") from exc
        if not isinstance(raw, Mapping):
            raise ConfigError("kafka properties must be a table of librdkafka properties "
                              "([kappa.kafka] in kappa.toml): fix it")
        return check_extra_properties(raw, "[kappa.kafka]")
    try:
        if kind in ("bool", bool):
            return _boolean(name, raw)
        if kind in ("int", int):
            return int(raw)
        if kind in ("int | None", int | None):
            return None if raw in (None, "", "None") else int(raw)
        if kind in ("float", float):
            return float(raw)
        if kind in ("Path", Path, "Path | None"):
            return Path(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name}={raw!r} is not a valid {kind}: fix it") from exc
    return str(raw)


def _boolean(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    word = str(raw).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"setting {name}={raw!r} is not true or false: fix it")


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Resolve settings for a command run in ``cwd``."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    names = [f.name for f in fields(Settings)]

    toml_values: dict[str, Any] = {}
    toml_path = Path(env.get("KAPPA_CONFIG", cwd / "kappa.toml"))
    if toml_path.is_file():
        try:
            data = tomllib.loads(toml_path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{toml_path} is not valid TOML ({exc}): fix it") from exc
        section = dict(data.get("kappa", data))
        if "kafka" in section:  # the [kappa.kafka] table of librdkafka properties
            section["kafka_properties"] = section.pop("kafka")
        if "kafka_secret_properties" in section:
            raise ConfigError(f"{toml_path}: never write secrets in kappa.toml: put them in "
                              f"{SECRETS_VARIABLE} (a JSON object in the environment)")
        if "kafka_sasl_password" in section:
            raise ConfigError(f"{toml_path}: never write the SASL password in kappa.toml: put it "
                              f"in {PASSWORD_VARIABLE} or in a file named by "
                              "kafka_sasl_password_file")
        written = sorted(set(section) & set(_SECRETS_FROM_ENV))
        if written:
            raise ConfigError(f"{toml_path}: never write {written[0]} in kappa.toml: put it in "
                              f"{_SECRETS_FROM_ENV[written[0]]} or in a file named by "
                              f"{written[0]}_file")
        unknown = sorted(set(section) - set(names))
        if unknown:
            raise ConfigError(f"{toml_path}: unknown setting(s) {', '.join(unknown)}: "
                              f"known are {', '.join(names)}")
        toml_values = dict(section)

    def pick(name: str) -> Any:
        if name == "kafka_sasl_password":  # a secret: only from the environment
            return env.get(PASSWORD_VARIABLE) or None
        if name == "kafka_secret_properties":  # secrets too
            return env.get(SECRETS_VARIABLE) or None
        if name in _SECRETS_FROM_ENV:
            return env.get(_SECRETS_FROM_ENV[name]) or None
        if name in flags:
            return flags[name]
        env_name = f"KAPPA_{name.upper()}"
        if env.get(env_name):
            return env[env_name]
        return toml_values.get(name)

    values: dict[str, Any] = {}
    for name in names:
        raw = pick(name)
        if raw is not None:
            values[name] = _coerce(name, raw)
    settings = Settings(**values)
    if not settings.state_dir.is_absolute():
        settings = replace(settings, state_dir=(cwd / settings.state_dir).resolve())

    # Services started by `kappa dev up` fill in only what nothing above configured.
    if settings.pg_dsn is None or settings.kafka_bootstrap is None:
        stack = read_stack_record(settings.dev_stack_file)
        if stack:
            settings = replace(
                settings,
                pg_dsn=settings.pg_dsn or stack.get("pg_dsn"),
                kafka_bootstrap=settings.kafka_bootstrap or stack.get("kafka_bootstrap"),
            )
    settings.replay_budget  # noqa: B018 - refuse a budget that cannot be, at load
    settings.live_lag_limit_s  # noqa: B018 - likewise a live lag limit
    if settings.kafka_bootstrap:
        settings.kafka  # noqa: B018 - refuse security settings that do not fit, at load
    settings.schema_registry  # noqa: B018 - likewise the registry's
    return settings


def read_stack_record(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
