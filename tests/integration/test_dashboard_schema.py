"""The generated dashboard against Grafana's own schema: the `Dashboard` type of the npm package
@grafana/schema, checked by TypeScript's `tsc --strict`, so that a field Grafana does not know, or
a value of the wrong type, fails the build. No Grafana server can be installed here.

The schema's string enums are compared by their values (a dashboard file holds "fixed", not
`FieldColorModeId.Fixed`). Two things are wider than the schema, on purpose: a Prometheus
annotation's own fields (`expr`, `step`, `titleFormat`, `textFormat`, `tagKeys`,
`useValueForTime`), which Grafana reads from the annotation but the schema's AnnotationQuery does
not list; and a panel's queries and options, which the schema leaves to each plugin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import missing_tool

pytestmark = [pytest.mark.integration]
NODE_MODULES = Path(sys.prefix) / "node" / "node_modules"
SCHEMA = NODE_MODULES / "@grafana" / "schema" / "dist" / "types" / "raw" / "dashboard" / "x"
TSC = NODE_MODULES / ".bin" / "tsc"

_CHECK = """\
import type {{ AnnotationQuery, Dashboard }} from {schema};

type Json<T> =
  T extends string ? `${{T}}` :
  T extends number | boolean | null | undefined ? T :
  T extends Array<infer U> ? Array<Json<U>> :
  T extends object ? {{ [K in keyof T]: Json<T[K]> }} :
  T;

type PrometheusAnnotation = Json<AnnotationQuery> & {{
  expr: string; step?: string; titleFormat?: string; textFormat?: string; tagKeys?: string;
  useValueForTime?: boolean;
}};
type KappaDashboard = Omit<Json<Dashboard>, "annotations"> & {{
  annotations?: {{ list?: Array<PrometheusAnnotation> }};
}};

const dashboard: KappaDashboard = {model};
export default dashboard;
"""


def _tools() -> None:
    if not TSC.exists() or not (SCHEMA / "types.gen.d.ts").exists():
        missing_tool("@grafana/schema and TypeScript (tsc) are not installed beside the venv: "
                     "run `bash scripts/setup.sh dev` (it needs npm)")


def _write(path: Path, model: dict[str, Any]) -> Path:
    path.write_text(_CHECK.format(schema=json.dumps(str(SCHEMA / "types.gen")),
                                  model=json.dumps(model, indent=1)))
    return path


def test_the_dashboard_type_checks_against_grafanas_schema_and_a_stray_field_fails(
        tmp_path: Path) -> None:
    from orchestrator.metrics.dashboard import DASHBOARD_FILE, DASHBOARDS_DIR

    _tools()
    committed = json.loads((DASHBOARDS_DIR / DASHBOARD_FILE).read_text())
    stray = json.loads(json.dumps(committed))
    stray["panels"][0]["colour"] = "red"  # a field added by hand that Grafana does not know
    wrong = json.loads(json.dumps(committed))
    wrong["refresh"] = 10  # a number where the schema wants a string
    names = [_write(tmp_path / f"{name}.ts", model).name for name, model in
             (("committed", committed), ("stray", stray), ("wrong", wrong))]
    done = subprocess.run([str(TSC), "--strict", "--noEmit", "--target", "es2020", *names],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    errors = [line for line in done.stdout.splitlines() if "error TS" in line]
    by_file = {name: [e for e in errors if e.startswith(f"{name}(")] for name in names}
    assert by_file["committed.ts"] == [], errors
    (stray_error,) = by_file["stray.ts"]
    assert "'\"colour\"' does not exist" in stray_error, stray_error
    (wrong_error,) = by_file["wrong.ts"]
    assert "not assignable to type 'string'" in wrong_error, wrong_error
    assert len(errors) == 2, done.stdout
