"""Constructs that make a job's output at rest depend on where batches were cut.

A replay cuts the log into large catch-up batches, a live job into small micro-batches, and a
crash into batches replayed from the checkpoint. The output at rest must not depend on those
cuts. Some constructs make it depend on them; ``kappa deploy`` warns about each one it finds in
the job's code (read with ``ast``, never run). The README's table lists the same constructs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from orchestrator.models import JobSpec


@dataclass(frozen=True)
class Hazard:
    names: tuple[str, ...]  # function or method names that use the construct
    why: str
    modes: tuple[str, ...] = ("batch", "stream")


HAZARDS = (
    Hazard(("withWatermark", "dropDuplicatesWithinWatermark"),
           "events later than the watermark are dropped, and the watermark moves at batch "
           "ends, so which events are late depends on where batches are cut"),
    Hazard(("current_timestamp", "current_date", "now", "localtimestamp", "curdate",
            "current_time"),
           "reads the clock: the output depends on when each batch ran; use kafka_timestamp"),
    Hazard(("rand", "randn", "uuid", "shuffle", "random"),
           "random values differ on every replay"),
    Hazard(("monotonically_increasing_id", "spark_partition_id", "input_file_name"),
           "depends on how rows were split into batches and tasks"),
    Hazard(("first", "last", "first_value", "last_value", "any_value", "collect_list"),
           "depends on the order rows reach the aggregate; use max_by/min_by over kafka_offset"),
    Hazard(("limit", "sample", "head", "take", "tail"),
           "keeps an arbitrary subset of each batch"),
    Hazard(("ProcessingTime",),
           "processing-time timers and timeouts fire at wall-clock times, not at positions in "
           "the log; use event time or none"),
    Hazard(("countDistinct", "count_distinct", "approx_count_distinct", "collect_set"),
           "distinct values are counted per batch, and per-batch distinct counts do not add up "
           "across batches; use MODE = \"stream\", whose state spans batches",
           modes=("batch",)),
)


def replay_hazards(spec: JobSpec) -> list[str]:
    """One line per construct found, ``file:line: name: why``, in file and line order."""
    by_name = {name: h for h in HAZARDS if spec.mode in h.modes for name in h.names}
    found: list[str] = []
    for path, content in spec.files:
        if not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(content)
        except (SyntaxError, ValueError):
            continue
        for line, name in sorted(_names_used(tree)):
            if name in by_name:
                found.append(f"{path}:{line}: {name}: {by_name[name].why}")
    if spec.mode == "batch" and spec.output_mode == "upsert":
        replaced = [c for c, rule in spec.merge if rule == "replace"]
        if replaced:
            found.append(f"MERGE: column(s) {', '.join(replaced)} keep the last batch's value "
                         "(rule 'replace'), which depends on where batches are cut unless "
                         "every batch computes the same value; use sum/min/max, or "
                         "MODE = \"stream\" for running state")
    return found


def _names_used(tree: ast.AST) -> set[tuple[int, str]]:
    """(line, name) of every called function or method, and of the processing-time mode."""
    used: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                used.add((node.lineno, func.attr))
            elif isinstance(func, ast.Name):
                used.add((node.lineno, func.id))
        elif _is_processing_time(node):
            used.add((getattr(node, "lineno", 0), "ProcessingTime"))
    return used


def _is_processing_time(node: ast.AST) -> bool:
    names = ("processingtime", "processingtimetimeout")
    if isinstance(node, ast.Attribute):
        return node.attr.lower() in names
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        node.value.lower() in names
