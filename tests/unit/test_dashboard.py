"""The Grafana dashboard generator and the committed dashboard files (pure, no network)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from orchestrator.archive_model.segments import PartitionArchive
from orchestrator.lag import LagState
from orchestrator.metrics import dashboard
from orchestrator.metrics.dashboard_archive import TITLES as ARCHIVE_TITLES
from orchestrator.metrics.dashboard_budget import TITLES as BUDGET_TITLES
from orchestrator.metrics.exporter import KappaCollector, Sampler, Snapshot
from orchestrator.models import PartitionLag, VersionLag, VersionStatus
from orchestrator.states import RunState

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
COMMITTED = DASHBOARDS / "kappa-replay.json"
DASHBOARDS_YAML = DASHBOARDS / "provisioning" / "dashboards" / "kappa.yaml"
DATASOURCES_YAML = DASHBOARDS / "provisioning" / "datasources" / "prometheus.yaml"
# An outcome cutover's last look, as OutcomeDesk.running() gives it.
_ARM = {"count": 900, "mean": 0.3, "interval": [0.25, 0.35]}
EXPERIMENT = {
    "job": "pageview_counts", "alias": "pageview_counts", "version": "v2", "look": 7,
    "share": 30, "verdict": "continue",
    "evidence": {"baseline": "v1", "candidate": "v2", "p_better": 0.2, "share": 30,
                 "strategy": "bandit", "metrics": [{
                     "metric": "converts", "role": "decision", "kind": "proportion",
                     "outcome": "undecided", "baseline": {**_ARM, "version": "v1"},
                     "candidate": {**_ARM, "version": "v2", "mean": 0.28},
                     "difference": -0.02, "interval": [-0.07, 0.03], "statistic": 0.4,
                     "threshold": 3.69, "strata": 3, "margin": 0.0, "alpha": 0.025,
                     "error": None}]}}
# The exporter's own metrics, and the archive's (per topic), carry no job or version.
GLOBAL_PANELS = {"Exporter", *ARCHIVE_TITLES, *BUDGET_TITLES}
ALIAS_METRICS = {"kappa_alias_switches_total", "kappa_alias_target"}  # annotations only


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return dashboard.build_dashboard()


def _panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in model["panels"] if p["type"] != "row"]


def _variables(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in model["templating"]["list"]}


def _yaml_value(text: str, key: str) -> list[str]:
    """Values of ``key: value`` lines (no YAML parser among the dependencies)."""
    return [m.group(1).strip().strip("'\"")
            for m in re.finditer(rf"^\s*-?\s*{key}:\s*(\S.*)$", text, re.MULTILINE)]


def test_committed_json_is_what_the_generator_builds(model: dict[str, Any]) -> None:
    assert COMMITTED.exists(), "run `python -m orchestrator.metrics.dashboard`"
    assert json.loads(COMMITTED.read_text()) == model, \
        "dashboards/ is stale: run `python -m orchestrator.metrics.dashboard` and commit it"


def test_write_reproduces_every_committed_file_byte_for_byte(tmp_path: Path) -> None:
    written = dashboard.write(tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        "kappa-replay.json", "provisioning/dashboards/kappa.yaml",
        "provisioning/datasources/prometheus.yaml"}
    for path in written:
        committed = DASHBOARDS / path.relative_to(tmp_path)
        assert committed.read_text() == path.read_text(), committed
    text = (tmp_path / "kappa-replay.json").read_text()
    assert text.endswith("}\n") and text == json.dumps(json.loads(text), sort_keys=True,
                                                       indent=2) + "\n"


def test_main_writes_into_the_given_directory(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboard.main([str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "kappa-replay.json").is_file()
    assert "kappa-replay.json" in capsys.readouterr().out
    assert dashboard.DASHBOARDS_DIR == DASHBOARDS


def test_identity_time_and_refresh(model: dict[str, Any]) -> None:
    assert model["uid"] == "kappa-replay"
    assert model["title"] == "Kappa reprocessing"
    assert "kappa" in model["tags"]
    assert model["refresh"] == "10s"
    assert model["time"] == {"from": "now-1h", "to": "now"}
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36


def test_variables(model: dict[str, Any]) -> None:
    variables = _variables(model)
    assert list(variables) == ["datasource", "job", "version"]
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    job, version = variables["job"], variables["version"]
    assert job["type"] == version["type"] == "query"
    assert job["query"] == "label_values(kappa_lag_records, kappa_job)"
    assert version["query"] == 'label_values(kappa_lag_records{kappa_job=~"$job"}, version)'
    for var in (job, version):
        assert var["multi"] is True and var["includeAll"] is True
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert var["refresh"] == 2  # on time range change: new versions show up


def test_panels_have_unique_ids_titles_and_fit_the_grid(model: dict[str, Any]) -> None:
    panels = _panels(model)
    assert len({p["id"] for p in panels}) == len(panels)
    assert len({p["title"] for p in panels}) == len(panels)
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
    assert {p["type"] for p in panels} >= {"timeseries", "stat", "state-timeline", "table"}


def test_every_panel_queries_the_datasource_variable_with_job_and_version(
        model: dict[str, Any]) -> None:
    for panel in _panels(model):
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert all(refs) and len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"] == panel["datasource"]
            assert expr.count("(") == expr.count(")"), expr
            if panel["title"] in GLOBAL_PANELS:
                continue
            assert 'kappa_job=~"$job"' in expr and 'version=~"$version"' in expr, expr
            # every selector of the query is filtered, not only the first one
            for name, selector in re.findall(r"\b(kappa_[a-z_]+)(\{[^}]*\})?", expr):
                if name == "kappa_job":  # the label, in `by (...)`
                    continue
                assert 'kappa_job=~"$job"' in selector and 'version=~"$version"' in selector, \
                    expr


def test_panels_use_only_metrics_the_exporter_exports(model: dict[str, Any]) -> None:
    part = PartitionLag("pageviews", 0, 0, 100, 40, 60, 2.5)
    lag = VersionLag("pageview_counts", "v2", "catching_up", RunState.REPLAYING, 60, 2.5, 10.0,
                     12.0, None, (part,))
    status = VersionStatus(
        job="pageview_counts", version="v2", state=RunState.REPLAYING, pid=1, app_id=None,
        output_table="o", dead_letter_table="d", rows=5, dead_letters=1, processed_offsets={},
        lag_records=60, heartbeat_age_s=1.0, reason=None, attempt=1, log_path=None,
        started_at=None)
    archived = PartitionArchive("pageviews", 0, "c-t", True, 0, 90, 1, 88, 2, 4096, 0, 100, 1.5)
    sampler = Sampler(take=lambda: Snapshot((lag,), (status,), 1000.0, archive=(archived,),
                                            experiments=(EXPERIMENT,), replays=(1, 2, 2),
                                            replay_hold=False))
    sampler.refresh()
    registry = CollectorRegistry()
    registry.register(KappaCollector(sampler))
    exported = {line.split("{")[0].split(" ")[0]
                for line in generate_latest(registry).decode().splitlines()
                if line and not line.startswith("#")}
    used = {name for p in _panels(model) for t in p["targets"]
            for name in re.findall(r"\bkappa_[a-z_]+", t["expr"]) if name != "kappa_job"}
    assert used <= exported, f"not exported (renamed?): {used - exported}"
    annotations = model["annotations"]["list"]
    names = {n for a in annotations for n in re.findall(r"\bkappa_[a-z_]+", a["expr"])
             if n != "kappa_job"}
    assert names <= ALIAS_METRICS


def test_state_timeline_names_every_lag_state(model: dict[str, Any]) -> None:
    (panel,) = [p for p in _panels(model) if p["type"] == "state-timeline"]
    (target,) = panel["targets"]
    for state in LagState:
        assert f'state="{state.value}"' in target["expr"]
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    names = {result["text"] for result in mapping["options"].values()}
    assert names >= {state.value for state in LagState}


def test_eta_maps_infinity_to_not_converging(model: dict[str, Any]) -> None:
    (panel,) = [p for p in _panels(model) if "kappa_eta_seconds" in p["targets"][0]["expr"]]
    options = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert options["Infinity"]["text"] == "not converging"  # String(Infinity) in the browser


def test_alias_switches_are_annotations(model: dict[str, Any]) -> None:
    (annotation,) = model["annotations"]["list"]
    assert annotation["expr"] == \
        'changes(kappa_alias_switches_total{kappa_job=~"$job"}[1m]) > 0'
    assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert annotation["enable"] is True


def test_panel_queries_cover_every_target_with_concrete_values(model: dict[str, Any]) -> None:
    queries = dashboard.panel_queries("pageview_counts", "v2")
    targets = [(p["title"], t["expr"]) for p in _panels(model) for t in p["targets"]]
    assert [title for title, _ in queries] == [title for title, _ in targets]
    for (title, expr), (_, template) in zip(queries, targets, strict=True):
        assert "$" not in expr, expr
        if title not in GLOBAL_PANELS:
            assert 'kappa_job=~"pageview_counts"' in expr and 'version=~"v2"' in expr, expr
        expected = (re.sub(r"\$__(rate_interval|interval|range)\b", "1m", template)
                    .replace("$job", "pageview_counts").replace("$version", "v2"))
        assert expr == expected


def test_panel_queries_escape_regex_metacharacters() -> None:
    queries = dashboard.panel_queries("a.b", "v(1)")
    expr = queries[0][1]
    # RE2 literal inside a double-quoted PromQL string: the backslash itself is escaped
    assert 'kappa_job=~"a\\\\.b"' in expr and 'version=~"v\\\\(1\\\\)"' in expr, expr


def test_provisioning_points_at_the_dashboards_and_the_datasource(model: dict[str, Any]) -> None:
    providers = DASHBOARDS_YAML.read_text()
    assert _yaml_value(providers, "type") == ["file"]
    (path,) = _yaml_value(providers, "path")
    assert path.startswith("/") and "dashboards" in path
    assert "ADJUST `path`" in providers  # the comment says which line to change
    sources = DATASOURCES_YAML.read_text()
    assert _yaml_value(sources, "type") == ["prometheus"]
    assert _yaml_value(sources, "url") == ["http://127.0.0.1:9090"]
    (uid,) = _yaml_value(sources, "uid")
    assert uid == dashboard.DATASOURCE_UID == "prometheus"
    # panels use ${datasource}, whose default is the provisioned datasource
    assert _variables(model)["datasource"]["current"]["value"] == uid
    for text in (providers, sources):
        assert _yaml_value(text, "apiVersion") == ["1"]
        assert "\t" not in text
