"""The layering rules of the style guide, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent
DOMAIN = ("errors", "models", "states", "naming", "lag", "jobspec", "parsing", "settings",
          "sample", "sample_profiles", "schema", "determinism", "log_identity",
          "archive/segments", "experiment/attribution", "experiment/bandit", "experiment/design",
          "experiment/look", "experiment/metrics", "experiment/policy", "experiment/sequential",
          "experiment/simulation")
# The modules of orchestrator/spark that the CLI and the service import: no pyspark in them.
SPARK_SERVICE_SIDE = ("__init__.py", "launcher.py", "checkpoint.py")
DRIVERS = ("pyspark", "confluent_kafka", "psycopg", "airflow", "prometheus_client")


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_public_api_is_exactly_all() -> None:
    assert dir(orchestrator) == sorted(orchestrator.__all__)
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name).__name__ == name
    with pytest.raises(AttributeError):
        _ = orchestrator.Nothing  # type: ignore[attr-defined]


def test_importing_a_subpackage_loads_no_driver() -> None:
    """Airflow imports our operators while it parses DAG files: that must stay cheap."""
    import subprocess
    import sys

    drivers = set(DRIVERS) - {"airflow"}
    code = ("import sys, orchestrator.airflow.operators, orchestrator.airflow.sensors, "
            "orchestrator.airflow.tasks; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {drivers!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_cli_and_the_facade_load_nothing_that_only_some_commands_need() -> None:
    """Every `kappa` command and every Airflow task imports these. pyarrow and numpy (drivers,
    the archiver and archive reads use them) were about 40 % of a call's start-up CPU, and rich
    draws only what people read: `kappa status --json` or `kappa promote` pays for neither."""
    import subprocess
    import sys

    deferred = {"pyarrow", "numpy", "pandas", "pyspark", "rich"}
    code = ("import sys, orchestrator.cli.main, orchestrator.service; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {deferred!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_domain_imports_no_driver_library() -> None:
    for name in DOMAIN:
        imported = _imports(PACKAGE / f"{name}.py", top_level_only=False)
        assert not {i for i in imported if i.split(".")[0] in DRIVERS}, name


def test_pyspark_only_inside_the_spark_package() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "spark" and path.name not in SPARK_SERVICE_SIDE:
            continue
        imported = _imports(path, top_level_only=False)
        assert not {i for i in imported if i.startswith("pyspark")}, path


def test_layers_import_downwards_only() -> None:
    upper = {"orchestrator.cli", "orchestrator.service", "orchestrator.demo",
             "orchestrator.airflow"}
    for sub in ("catalog", "kafka", "spark", "dev"):
        for path in (PACKAGE / sub).rglob("*.py"):
            imported = _imports(path, top_level_only=False)
            assert not {i for i in imported if any(i.startswith(u) for u in upper)}, path


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_the_facade_only_delegates_and_fits_on_two_screens() -> None:
    tree = ast.parse((PACKAGE / "service.py").read_text())
    (facade,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Orchestrator"]
    assert facade.end_lineno is not None
    assert facade.end_lineno - facade.lineno + 1 <= 140
    for method in facade.body:
        if isinstance(method, ast.FunctionDef):
            body = [s for s in method.body if not isinstance(s, ast.Expr)]  # docstrings aside
            assert len(body) <= 3, f"Orchestrator.{method.name} does more than delegate"


def test_plans_use_the_catalog_without_reaching_into_the_facade() -> None:
    for path in (PACKAGE / "plan").rglob("*.py"):
        assert "orchestrator.service" not in _imports(path, top_level_only=False), path
        assert "._catalog(" not in path.read_text(), path
