"""The layering rules of the style guide, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent
REPO = PACKAGE.parent
DRIVERS = ("pyspark", "confluent_kafka", "psycopg", "airflow", "prometheus_client")


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
    """Import-linter keeps plans from importing the facade; this keeps them off its back door."""
    for path in (PACKAGE / "plan").rglob("*.py"):
        assert "._catalog(" not in path.read_text(), path


def test_the_import_contracts_hold() -> None:
    """The layers, the independent siblings and the forbidden driver libraries of
    pyproject.toml's [tool.importlinter], checked by import-linter itself."""
    import subprocess
    import sys

    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and " kept" in done.stdout


@pytest.mark.parametrize("package", ["orchestrator", "bench"])
def test_no_import_circles(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module never imports itself back through others, at any depth, in functions too."""
    monkeypatch.syspath_prepend(str(REPO))
    graph = grimp.build_graph(package)
    assert _circles(graph) == []


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while (member := stack.pop()) != module:
                component.append(member)
            if component:
                circles.append(sorted([module, *component]))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles
