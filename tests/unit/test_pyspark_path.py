"""Processes that Spark starts import pyspark from the installed package, not the source zip,
and a sitecustomize of the user's still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.dev.spark_cluster import spark_home
from orchestrator.spark.pyspark_path import WORKER_SITE

PROBE = ("import json, os, sys, pyspark, py4j; print(json.dumps({'pyspark': pyspark.__file__, "
         "'py4j': py4j.__file__, 'path': os.environ['PYTHONPATH'], "
         "'other': os.environ.get('OTHER_SITE')}))")


def spark_zips() -> list[str]:
    lib = spark_home() / "python" / "lib"
    zips = sorted(str(p) for p in lib.glob("*.zip"))
    assert any(z.endswith("pyspark.zip") for z in zips), f"no pyspark.zip in {lib}"
    return zips


def probe(pythonpath: list[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stderr == "", out.stderr
    result: dict[str, str] = json.loads(out.stdout)
    return result


def test_without_the_worker_site_pyspark_comes_from_the_zip() -> None:
    # The premise: what Spark does unless told otherwise.
    assert ".zip" in probe(spark_zips())["pyspark"]


def test_the_worker_site_imports_the_compiled_package_and_chains(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    found = probe([*spark_zips(), WORKER_SITE, str(other)])
    assert ".zip" not in found["pyspark"] and ".zip" not in found["py4j"]
    assert "site-packages" in found["pyspark"]
    # Children inherit the choice; the user's entries stay, in their order.
    assert found["path"] == os.pathsep.join([WORKER_SITE, str(other)])
    assert found["other"] == "ran"


def test_zips_of_another_spark_stay_first(tmp_path: Path) -> None:
    # A SPARK_HOME of another version than the pip package: its zips must keep precedence,
    # or the workers would speak another pyspark than the JVM.
    other = tmp_path / "spark-other" / "python" / "lib"
    other.mkdir(parents=True)
    for zipped in spark_zips():
        (other / Path(zipped).name).write_bytes(Path(zipped).read_bytes())
    copies = sorted(str(p) for p in other.glob("*.zip"))
    found = probe([*copies, WORKER_SITE])
    assert found["pyspark"].startswith(str(other))
    assert found["path"] == os.pathsep.join([*copies, WORKER_SITE])
