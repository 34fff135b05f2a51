"""Imported at start-up by every Python process that a driver's JVM starts on its host (the
driver puts this directory on their PYTHONPATH): pyspark from its compiled package (see
orchestrator.spark.pyspark_path), then any sitecustomize that this one hides."""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    try:
        # A process the driver's zygote can run for it exits here (spark/launch/zygote.py).
        from orchestrator.spark.launch.zygote_client import hand_over

        hand_over()
    except Exception:
        pass
    try:
        from orchestrator.spark.pyspark_path import use_installed_pyspark

        use_installed_pyspark()
    except Exception:  # a start-up hook must never stop the worker
        pass
    path = sys.path[:]
    sys.path[:] = [p for p in path if os.path.abspath(p or ".") != _HERE]
    # The import system looks this module up in sys.modules once it has run: it goes back.
    ours = sys.modules.pop("sitecustomize")
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = path
        sys.modules["sitecustomize"] = ours


_chain()
