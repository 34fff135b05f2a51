"""Driver side: the deployed code of a version, importable on the driver and on the executors.

The catalog holds every file of the deployed code. They are written out as one package,
``kappa_job__<job>__<version>``, whose module ``job`` is the job file, so that helper modules
import as they would in the job's directory (``from . import helpers``) and that functions and
classes pickle by reference; the package is zipped and added to the Spark context, so that
executors on other hosts import exactly the same code.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.errors import JobFileError
from orchestrator.models import DeployedVersion
from orchestrator.spark.launch.driver_process import is_alive

ENTRY_MODULE = "job"
CODE_PREFIX = "kappa-code-"


def package_name(version: DeployedVersion) -> str:
    return f"kappa_job__{version.job}__{version.version}"


def materialize(version: DeployedVersion) -> Path:
    """Write the deployed files out as the version's package; return the directory holding it.

    Call before the Spark session starts and put the directory on ``PYTHONPATH``: Python
    processes that Spark starts on the driver's host (workers, the state server of
    transformWithStateInPandas) inherit it from the JVM, which inherits it from us.
    """
    package = package_name(version)
    remove_orphaned_code()
    # The driver's PID in the name: a driver that was killed cannot remove its copy, the next
    # one does (remove_orphaned_code).
    root = Path(tempfile.mkdtemp(prefix=f"{CODE_PREFIX}{os.getpid()}-"))
    target = root / package
    target.mkdir()
    spec = version.spec
    for path, content in spec.files:
        name = f"{ENTRY_MODULE}.py" if path == spec.entry else path
        file = (target / name).resolve()
        if target.resolve() not in file.parents:
            raise JobFileError(f"deployed file {path!r} lies outside the job's directory")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(content)
    for directory in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        if directory.name != "__pycache__" and not (directory / "__init__.py").exists():
            (directory / "__init__.py").write_bytes(b"")
    return root


def remove_orphaned_code(directory: Path | None = None) -> int:
    """Remove the code copies of drivers that no longer run; return how many."""
    removed = 0
    for path in Path(directory or tempfile.gettempdir()).glob(f"{CODE_PREFIX}*-*"):
        pid = path.name[len(CODE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not is_alive(int(pid), None) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def load_transform(version: DeployedVersion, root: Path, spark: Any | None = None
                   ) -> Callable[[Any], Any]:
    """Ship the package under ``root`` to the executors, import the job module and return its
    ``transform``."""
    package = package_name(version)
    if spark is not None:
        archive = root / f"{package}.zip"
        with zipfile.ZipFile(archive, "w") as zipped:
            for file in sorted((root / package).rglob("*")):
                if file.is_file():
                    zipped.write(file, file.relative_to(root).as_posix())
        spark.sparkContext.addPyFile(str(archive))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(f"{package}.{ENTRY_MODULE}")
    except Exception as exc:
        raise JobFileError(f"{version.spec.path}: importing the deployed code failed: "
                           f"{type(exc).__name__}: {exc}") from exc
    transform: Callable[[Any], Any] = module.transform
    return transform
