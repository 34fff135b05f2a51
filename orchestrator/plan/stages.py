"""The stages of a cutover: small frozen records, visited one by one (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StateError
from orchestrator.experiment.design import ExperimentDesign


@dataclass(frozen=True)
class Validate:
    """Diff against the version the alias serves, guardrails included; must pass."""


@dataclass(frozen=True)
class Ramp:
    percent: int  # 100 promotes


@dataclass(frozen=True)
class Soak:
    seconds: float  # wait, watching both versions' health, then re-run the guardrails


@dataclass(frozen=True)
class Experiment:
    """An outcome test (A/B or bandit) that ends in a promote or a rollback."""
    design: ExperimentDesign


Stage = Validate | Ramp | Soak | Experiment


def build(ramp: list[int], soak_seconds: float) -> list[Stage]:
    if not ramp or any(not 1 <= p <= 100 for p in ramp) or ramp != sorted(set(ramp)):
        raise StateError(f"--ramp must be increasing percentages in 1..100, like 10,50,100; "
                         f"got {ramp}")
    if ramp[-1] != 100:
        ramp = [*ramp, 100]
    if soak_seconds < 0:
        raise StateError("--soak must be zero or more seconds")
    stages: list[Stage] = [Validate()]
    for percent in ramp:
        stages.append(Ramp(percent))
        if percent < 100:
            stages.append(Soak(soak_seconds))
    return stages


def to_json(stages: list[Stage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for stage in stages:
        if isinstance(stage, Validate):
            out.append({"kind": "validate"})
        elif isinstance(stage, Ramp):
            out.append({"kind": "ramp", "percent": stage.percent})
        elif isinstance(stage, Experiment):
            out.append({"kind": "experiment", **stage.design.to_json()})
        else:
            out.append({"kind": "soak", "seconds": stage.seconds})
    return out


def from_json(items: list[dict[str, Any]]) -> list[Stage]:
    stages: list[Stage] = []
    for item in items:
        if item["kind"] == "validate":
            stages.append(Validate())
        elif item["kind"] == "ramp":
            stages.append(Ramp(int(item["percent"])))
        elif item["kind"] == "experiment":
            stages.append(Experiment(ExperimentDesign.from_json(item)))
        else:
            stages.append(Soak(float(item["seconds"])))
    return stages
