"""What a DAG run asks for, checked before anything is touched (pure: no Airflow, no drivers).

A conf arrives as JSON from a person or a script; each mistake gets one line saying what to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, KappaError
from orchestrator.experiment.design import ExperimentDesign, Strategy
from orchestrator.naming import validate_name
from orchestrator.replay_queue.order import HIGHEST_PRIORITY, LOWEST_PRIORITY, parse_priority

REPROCESS_DEFAULTS: dict[str, Any] = {
    "ramp": [10, 50, 100],
    "soak_seconds": 60,
    "max_lag": 0,
    "retire_previous": False,
    "alias": None,
    "catch_up_timeout_minutes": 720,
    "strategy": None,
    "metrics": [],
    "breaking": False,
    "priority": 0,
    "allow_incompatible": False,
}
# An outcome cutover's options, named as `kappa cutover`'s flags are: conf key -> design field.
EXPERIMENT_OPTIONS = {
    "start_percent": "start_percent", "min_percent": "min_percent",
    "max_percent": "max_percent", "max_step": "max_step", "look_seconds": "look_seconds",
    "max_duration": "max_duration_s", "no_data_timeout": "no_data_timeout_s", "alpha": "alpha",
    "mixture_sd": "mixture_sd", "min_per_arm": "min_per_arm",
    "attribution_delay": "attribution_delay_s", "pre_period": "pre_period_s",
    "allow_non_inferior": "allow_non_inferior",
}
_WHOLE = {"start_percent", "min_percent", "max_percent", "max_step", "min_per_arm"}
EXAMPLE = ('{"job_file": "jobs/pageview_counts/v2.py", "ramp": [10, 50, 100], '
           '"soak_seconds": 60, "max_lag": 0, "retire_previous": false}')


@dataclass(frozen=True)
class ReprocessRequest:
    job_file: Path  # absolute, inside the project
    ramp: tuple[int, ...]  # ends at 100
    soak_seconds: float
    max_lag: int
    retire_previous: bool
    alias: str | None
    catch_up_timeout_minutes: float
    experiment: ExperimentDesign | None = None  # an outcome cutover instead of the ramp
    breaking: bool = False  # the split may remove or retype columns (kappa ab --breaking)
    priority: int = 0  # its place in the replay queue (kappa deploy --priority)
    # An Avro reader that cannot read some writer schemas (kappa deploy --allow-incompatible)
    allow_incompatible: bool = False


@dataclass(frozen=True)
class RollbackRequest:
    job: str
    alias: str | None
    reason: str | None
    force: bool = False  # even to a version that is stopped or failed (recorded as forced)


@dataclass(frozen=True)
class RetireRequest:
    job: str
    version: str
    drop: bool


def _check_keys(conf: Mapping[str, Any], known: set[str], example: str) -> None:
    unknown = sorted(set(conf) - known)
    if unknown:
        raise ConfigError(f"unknown conf key(s) {', '.join(map(repr, unknown))}: known are "
                          f"{', '.join(sorted(known))}, e.g. {example}")


def _number(conf: Mapping[str, Any], key: str, *, integer: bool) -> Any:
    value = conf[key]
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
            or value < 0:
        what = "a whole number" if integer else "a number"
        raise ConfigError(f"conf {key} must be {what}, zero or more; got {value!r}")
    return value


def _flag(conf: Mapping[str, Any], key: str) -> bool:
    if not isinstance(conf[key], bool):
        raise ConfigError(f"conf {key} must be true or false; got {conf[key]!r}")
    return bool(conf[key])


def _optional_name(conf: Mapping[str, Any], key: str, what: str) -> str | None:
    value = conf.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"conf {key} must be a string; got {value!r}")
    return validate_name(value, what)


def parse_ramp(value: Any) -> tuple[int, ...]:
    ok = isinstance(value, list) and value and all(
        isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 100 for p in value)
    if not ok or value != sorted(set(value)):
        raise ConfigError(f"conf ramp must be increasing percentages in 1..100, like "
                          f"[10, 50, 100]; got {value!r}")
    return tuple(value) if value[-1] == 100 else (*value, 100)


def job_file_in(project_dir: Path, value: Any) -> Path:
    """The job file, which must lie inside the project: a conf names code that the drivers
    run, so it may not point anywhere on the worker."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'conf job_file is required: a path relative to {project_dir}, '
                          f'e.g. {EXAMPLE}')
    root = project_dir.resolve()
    path = (root / value).resolve()
    if not path.is_relative_to(root):
        raise ConfigError(f"conf job_file {value!r} is outside the project {root}: "
                          "job files must live in the project (e.g. jobs/...)")
    if not (path.is_file() or path.is_dir()):  # a job directory is a package
        raise ConfigError(f"conf job_file {value!r} does not exist under {root}: "
                          "give a path relative to the project, e.g. jobs/pageview_counts/v2.py")
    return path


def parse_reprocess(conf: Mapping[str, Any], project_dir: Path) -> ReprocessRequest:
    _check_keys(conf, {"job_file", *REPROCESS_DEFAULTS, *EXPERIMENT_OPTIONS}, EXAMPLE)
    merged = {**REPROCESS_DEFAULTS, **conf}
    return ReprocessRequest(
        job_file=job_file_in(project_dir, merged.get("job_file")),
        ramp=parse_ramp(merged["ramp"]),
        soak_seconds=float(_number(merged, "soak_seconds", integer=False)),
        max_lag=int(_number(merged, "max_lag", integer=True)),
        retire_previous=_flag(merged, "retire_previous"),
        alias=_optional_name(merged, "alias", "alias"),
        catch_up_timeout_minutes=float(_number(merged, "catch_up_timeout_minutes",
                                               integer=False)),
        experiment=parse_experiment(merged),
        breaking=_flag(merged, "breaking"),
        priority=_priority(merged["priority"]),
        allow_incompatible=_flag(merged, "allow_incompatible"),
    )


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"conf priority must be a whole number from {LOWEST_PRIORITY} to "
                          f"{HIGHEST_PRIORITY} (higher replays first); got {value!r}")
    return parse_priority(value)


def parse_experiment(conf: Mapping[str, Any]) -> ExperimentDesign | None:
    """The outcome cutover a conf asks for with ``strategy`` and ``metrics``; None for a
    ramp. Whether the metrics exist is checked when the cutover starts, before any switch."""
    strategy, metrics = conf.get("strategy"), conf.get("metrics", [])
    options = sorted(k for k in EXPERIMENT_OPTIONS if k in conf)
    if strategy is None:
        if metrics or options:
            raise ConfigError(f"conf {', '.join(['metrics'] * bool(metrics) + options)} judge "
                              'an outcome cutover: add "strategy": "ab" or "bandit"')
        return None
    if strategy not in {s.value for s in Strategy}:
        raise ConfigError(f'conf strategy must be "ab" or "bandit" (or null for the ramp); '
                          f"got {strategy!r}")
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise ConfigError('conf metrics must be a list of metric names, like ["converts"] '
                          f"(`kappa metric list`); got {metrics!r}")
    given: dict[str, Any] = {}
    for key in options:
        field = EXPERIMENT_OPTIONS[key]
        given[field] = _flag(conf, key) if key == "allow_non_inferior" \
            else _number(conf, key, integer=key in _WHOLE)
    try:
        return ExperimentDesign(Strategy(strategy), tuple(metrics), **given)
    except KappaError as exc:  # its words name the CLI's flags: say the conf's keys
        flags = re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), str(exc))
        raise ConfigError(f"conf: {flags}") from exc


def parse_rollback(conf: Mapping[str, Any]) -> RollbackRequest:
    _check_keys(conf, {"job", "alias", "reason", "force"}, '{"job": "pageview_counts"}')
    job = _optional_name(conf, "job", "job name")
    if job is None:
        raise ConfigError('conf job is required, e.g. {"job": "pageview_counts"}')
    reason = conf.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ConfigError(f"conf reason must be a string; got {reason!r}")
    force = _flag(conf, "force") if "force" in conf else False
    return RollbackRequest(job, _optional_name(conf, "alias", "alias"), reason, force)


def parse_retire(conf: Mapping[str, Any]) -> RetireRequest:
    example = '{"job": "pageview_counts", "version": "v1", "drop": false}'
    _check_keys(conf, {"job", "version", "drop"}, example)
    job = _optional_name(conf, "job", "job name")
    version = _optional_name(conf, "version", "version")
    if job is None or version is None:
        raise ConfigError(f"conf job and version are required, e.g. {example}")
    return RetireRequest(job, version, _flag({"drop": conf.get("drop", False)}, "drop"))


def checked_reprocess(conf: Mapping[str, Any], project_dir: Path) -> dict[str, Any]:
    """The conf, checked and completed with the job file's name, version and fingerprint: the
    values later tasks read (from XCom, so nothing secret belongs here)."""
    from orchestrator.jobspec import load_job_file

    request = parse_reprocess(conf, project_dir)
    spec = load_job_file(request.job_file)
    return {"job": spec.name, "version": spec.version, "fingerprint": spec.fingerprint,
            "job_file": str(request.job_file), "ramp": list(request.ramp),
            "soak_seconds": request.soak_seconds, "max_lag": request.max_lag,
            "retire_previous": request.retire_previous, "alias": request.alias,
            "catch_up_timeout_minutes": request.catch_up_timeout_minutes,
            "experiment": request.experiment.to_json() if request.experiment else None,
            "breaking": request.breaking, "priority": request.priority,
            "allow_incompatible": request.allow_incompatible}


def checked(kind: str, conf: Mapping[str, Any], project_dir: Path) -> dict[str, Any]:
    """The checked conf of a ``reprocess``, ``rollback`` or ``retire`` run, as XCom values."""
    from dataclasses import asdict

    if kind == "reprocess":
        return checked_reprocess(conf, project_dir)
    if kind == "rollback":
        return asdict(parse_rollback(conf))
    return asdict(parse_retire(conf))
