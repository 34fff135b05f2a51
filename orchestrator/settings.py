"""Settings, resolved as: flag > environment (KAPPA_*) > kappa.toml > `kappa dev up` > default.

The PostgreSQL DSN may hold a password: it is never printed, logged or put in argv (drivers get it
through their environment).
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

STACK_FILE = "dev/stack.json"


@dataclass(frozen=True)
class Settings:
    state_dir: Path = Path(".kappa")
    pg_dsn: str | None = field(default=None, repr=False)
    kafka_bootstrap: str | None = None
    spark_master: str = "local[*]"
    catalog_schema: str = "kappa"
    data_schema: str = "kappa_data"
    serving_schema: str = "serving"  # where aliases live: the only schema readers may read
    reader_role: str = "kappa_reader"  # granted SELECT on the serving schema, nothing else
    spark_driver_memory: str = "1g"
    spark_executor_memory: str = "1g"
    spark_executor_cores: int = 2
    # Catch-up profile: cap records per micro-batch and split each partition's range into chunks
    # of at most this many records, so parallelism is not capped by the partition count.
    max_batch_records: int = 500_000
    chunk_records: int = 125_000
    live_trigger_seconds: float = 1.0
    heartbeat_interval_s: float = 2.0

    @property
    def dev_stack_file(self) -> Path:
        return self.state_dir / STACK_FILE

    def require_services(self) -> tuple[str, str]:
        """Return (pg_dsn, kafka_bootstrap) or say how to get them."""
        if not self.pg_dsn or not self.kafka_bootstrap:
            missing = [
                n for n, v in (("KAPPA_PG_DSN", self.pg_dsn),
                               ("KAPPA_KAFKA_BOOTSTRAP", self.kafka_bootstrap)) if not v
            ]
            raise ConfigError(
                f"no {' and '.join(missing)} configured: run `kappa dev up` in this directory, "
                "or set them (environment or kappa.toml)"
            )
        return self.pg_dsn, self.kafka_bootstrap

    def driver_environment(self) -> dict[str, str]:
        """Everything a detached driver needs, passed by environment (never argv)."""
        env = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                env[f"KAPPA_{f.name.upper()}"] = str(value)
        return env


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in fields(Settings)}[name]
    try:
        if kind in ("int", int):
            return int(raw)
        if kind in ("float", float):
            return float(raw)
        if kind in ("Path", Path):
            return Path(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name}={raw!r} is not a valid {kind}: fix it") from exc
    return str(raw)


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
        section = data.get("kappa", data)
        unknown = sorted(set(section) - set(names))
        if unknown:
            raise ConfigError(f"{toml_path}: unknown setting(s) {', '.join(unknown)}: "
                              f"known are {', '.join(names)}")
        toml_values = dict(section)

    def pick(name: str) -> Any:
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
    return settings


def read_stack_record(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
