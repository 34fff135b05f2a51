"""Driver side: the source columns a version's query reads, so that read tasks neither build
nor move the others.

PySpark's Python data sources get no column pruning from Spark: every column a source
declares is built by the Python workers, streamed to the JVM and turned into rows, and only
then dropped by the Project that Spark's optimizer put above it. The query is planned first on
stand-in sources with every column; the names its optimized plan references are the columns it
reads; the sources are then declared with those columns alone.

The optimizer cannot be asked through ``queryExecution().optimizedPlan()`` on a streaming
plan (Spark refuses it outside ``writeStream.start()``), so this runs the session's optimizer
on the analyzed plan, as the streaming engine does each batch.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.models import KAFKA_COLUMNS

log = logging.getLogger("kappa.driver")

# A quarantined batch is re-run one offset range at a time, filtered on these columns.
QUARANTINE_COLUMNS = frozenset(("kafka_topic", "kafka_partition", "kafka_offset"))


def referenced_names(spark: Any, df: Any) -> frozenset[str] | None:
    """The names of the columns ``df``'s optimized plan reads or returns, or None if it
    cannot be planned here (then nothing is pruned)."""
    try:
        analyzed = df._jdf.queryExecution().analyzed()
        plan = spark._jsparkSession.sessionState().optimizer().execute(analyzed)
        names = set(_names(plan.output()))
        pending = [plan]
        while pending:
            node = pending.pop()
            children = node.children()
            if children.size() == 0:
                continue
            names.update(_names(node.references().toSeq()))
            # Subqueries inside expressions read columns of their own.
            subqueries = node.subqueries()
            pending.extend(children.apply(i) for i in range(children.size()))
            pending.extend(subqueries.apply(i) for i in range(subqueries.size()))
    except Exception as exc:  # a plan this cannot read: read every column, as before
        log.info("columns not pruned: the query's plan could not be read (%s)",
                 type(exc).__name__)
        return None
    return frozenset(names)


def _names(attributes: Any) -> Iterable[str]:
    return (str(attributes.apply(i).name()) for i in range(attributes.size()))


def pruned_columns(read: frozenset[str] | None, event_fields: Iterable[str],
                   always: frozenset[str] = frozenset()) -> tuple[str, ...] | None:
    """The source columns to declare, in the source's order; None to declare them all.

    Names are compared as Spark resolves them by default, without regard to case; a name the
    plan reads that a column of another case would match keeps that column.
    """
    if read is None:
        return None
    wanted = {name.lower() for name in read | always}
    every = (*KAFKA_COLUMNS, *event_fields)
    kept = tuple(name for name in every if name.lower() in wanted)
    if len(kept) == len(every):
        return None
    # A query that reads no column (a count of everything) still needs a row per record.
    return kept or ("kafka_partition",)


Built = tuple[Any, Any]  # the query's DataFrame, and the DataFrame whose plan reads the source


@contextmanager
def stand_in_sources(spark: Any, schemas: dict[str, str]) -> Iterator[dict[str, Any]]:
    """One streaming DataFrame per topic with the source's schema (DDL), read by Spark's own
    Parquet stream source from an empty directory: the job's plan on these is the plan on the
    sources, found without loading a Python data source (a Python process each) twice."""
    empty = tempfile.mkdtemp(prefix="kappa-stand-in-")
    try:
        yield {topic: spark.readStream.schema(ddl).format("parquet").load(empty)
               for topic, ddl in schemas.items()}
    finally:
        shutil.rmtree(empty, ignore_errors=True)


def plan_with_pruning(spark: Any, build: Callable[[dict[str, tuple[str, ...] | None]], Built],
                      planned: Any, fields: dict[str, tuple[str, ...]],
                      always: frozenset[str] = frozenset()) -> Any:
    """The query ``build`` makes on sources that declare only the columns ``planned`` (the
    job's plan on stand-ins with every column; None: it could not be planned) reads
    (``fields``: each topic's event fields). Every column where the plan cannot be read, or
    where the query with fewer does not plan with the same output schema."""
    read = referenced_names(spark, planned) if planned is not None else None
    columns = {topic: pruned_columns(read, names, always) for topic, names in fields.items()}
    if all(kept is None for kept in columns.values()):
        return build({})[0]
    try:
        pruned, pruned_planned = build(columns)
        same = pruned_planned is not None and pruned_planned.schema == planned.schema
    except Exception as exc:
        log.info("columns not pruned: the query did not plan with them alone (%s)",
                 type(exc).__name__)
        return build({})[0]
    if not same:
        log.info("columns not pruned: the query's output differs with them alone")
        return build({})[0]
    log.info("columns read: %s", "; ".join(
        f"{topic}: {', '.join(kept) if kept is not None else 'all'}"
        for topic, kept in sorted(columns.items())))
    return pruned
