"""The alert rules shipped beside the dashboard: Prometheus's own tool checks them and runs their
unit tests (a case that fires each rule and one that must not), and they use only series the
exporter exports."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import debian_tool

pytestmark = [pytest.mark.integration]
DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULES, RULE_TESTS = DASHBOARDS / "kappa-alerts.yml", DASHBOARDS / "kappa-alerts.test.yml"
# What each rule is about: the suite must keep one rule for each.
EXPECTED = {"KappaVersionStalled", "KappaVersionFallingBehind", "KappaLogGone",
            "KappaVersionFailed", "KappaDriverHeartbeatOld", "KappaExporterStale",
            "KappaDeadLetterSpike", "KappaCutoverHalfway", "KappaArchiveRetentionRisk",
            "KappaArchiveBehind"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([debian_tool("promtool", "prometheus"), *args], cwd=DASHBOARDS,
                          capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    checked = _run("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in checked.stdout, checked.stdout
    tested = _run("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_rule_is_fired_and_held_back_by_a_test() -> None:
    import yaml

    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
             for r in g["rules"]}
    assert set(rules) == EXPECTED
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for name, rule in rules.items():
        evals = [e for case in cases for e in case["alert_rule_test"] if e["alertname"] == name]
        assert any(e["exp_alerts"] for e in evals), f"no test fires {name}"
        assert any(not e["exp_alerts"] for e in evals), f"no test holds {name} back"
        assert "kappa " in rule["annotations"]["description"], f"{name} says nothing to run"


def test_the_rules_use_only_series_and_labels_the_exporter_exports() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from orchestrator.archive_model.segments import PartitionArchive
    from orchestrator.metrics.exporter import KappaCollector, Sampler, Snapshot
    from orchestrator.models import AliasState, PartitionLag, VersionLag, VersionStatus
    from orchestrator.states import RunState

    lag = VersionLag("pageview_counts", "v2", "catching_up", RunState.REPLAYING, 60, 2.5, 10.0,
                     12.0, None, (PartitionLag("pageviews", 0, 0, 100, 40, 60, 2.5),))
    status = VersionStatus("pageview_counts", "v2", RunState.REPLAYING, 1, None, "o", "d", 5, 1,
                           {}, 60, 1.0, None, 1, None, None)
    alias = AliasState("pageview_counts", "pageview_counts", "v1", "v2", 10, 3)
    archived = PartitionArchive("pageviews", 0, "c-t", True, 0, 90, 1, 88, 2, 4096, 0, 100, 4.0)
    sampler = Sampler(take=lambda: Snapshot((lag,), (status,), time.time(), (alias,),
                                            (archived,)))
    sampler.refresh()
    registry = CollectorRegistry()
    registry.register(KappaCollector(sampler))
    exported: dict[str, set[str]] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, labels = line.split(" ")[0].partition("{")
            exported.setdefault(name, set()).update(re.findall(r"(\w+)=", labels))
    text = RULES.read_text()
    used = set(re.findall(r"\b(kappa_[a-z_]+)\{?", text)) - {"kappa_job"}
    assert used <= set(exported), f"not exported (renamed?): {used - set(exported)}"
    labels_by = {label for group in re.findall(r"by \(([^)]*)\)", text)
                 for label in re.split(r",\s*", group)}
    assert labels_by <= set().union(*exported.values()), labels_by
