"""Python processes that Spark starts import pyspark from its installed, byte-compiled package.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's PYTHONPATH.
Python caches no bytecode for modules in a zip, so every process (Spark starts one per worker
kind: data source lookup, creation, read planning, the streaming source, the reads' daemon) and
every worker a daemon forks compiled pyspark from source again, about 0.8 s each here: a third
of the Python CPU time of a million-event replay, much of it between deploy and the first batch
(bench/replay.py --profile). Where pyspark is installed as a package (pip, as here) that
package is the same code, already compiled, and the zips are taken off the path. Where it is
not, the path is left as Spark set it.

It runs before pyspark is imported, in every such process: it must stay light.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_SOURCE_ZIPS = ("pyspark.zip", "py4j-")
# On the PYTHONPATH of the processes a driver's JVM starts: its sitecustomize calls
# use_installed_pyspark() in each of them.
WORKER_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")


def pyspark_home() -> str | None:
    """The directory of the pyspark that imports here (Spark's home for a pip install), found
    without importing it."""
    spec = importlib.util.find_spec("pyspark")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def is_source_zip(entry: str) -> bool:
    """Whether ``entry`` is one of Spark's zips of pyspark or py4j sources."""
    name = os.path.basename(entry)
    return name.endswith(".zip") and name.startswith(_SOURCE_ZIPS)


def use_installed_pyspark() -> bool:
    """Takes Spark's source zips off sys.path when they are the installed pyspark's own, so
    that pyspark and py4j import from the package, compiled. Zips of another Spark (a
    SPARK_HOME of a different version than the pip package) are left where they are."""
    zips = [entry for entry in sys.path if is_source_zip(entry)]
    if not zips or "pyspark" in sys.modules:
        return False
    original = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if entry not in zips]
    home = pyspark_home()
    if home is None or importlib.util.find_spec("py4j") is None or any(
            os.path.dirname(os.path.abspath(z)) != os.path.join(home, "python", "lib")
            for z in zips):
        sys.path[:] = original
        return False
    # A zip's importer re-reads its whole directory on every importlib.invalidate_caches(),
    # which pyspark's worker calls for each task: they go too.
    for entry in zips:
        sys.path_importer_cache.pop(entry, None)
    # Processes that this one forks or starts inherit the same choice.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not is_source_zip(entry))
    return True
