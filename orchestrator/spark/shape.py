"""Driver side: check what ``transform`` returned and shape it for the stage table.

Checks use only the DataFrame's schema, so a stream job's mistakes are found before its query
reads a single record.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import KappaError
from orchestrator.models import DELETE_COLUMN, JobSpec

# Spark types (their simpleString, before any "(" or "<") that each PostgreSQL column takes.
_SCALARS = {"string", "bigint", "int", "smallint", "tinyint", "double", "float", "decimal",
            "boolean", "timestamp", "timestamp_ntz", "date"}
# PostgreSQL casts or range-checks what Spark's types do not settle (a count() into an integer
# column fails only if a count does not fit).
_ACCEPTS = {
    "text": _SCALARS,
    "bigint": {"bigint", "int", "smallint", "tinyint", "decimal"},
    "integer": {"bigint", "int", "smallint", "tinyint", "decimal"},
    "double precision": {"double", "float", "bigint", "int", "smallint", "tinyint", "decimal"},
    "boolean": {"boolean"},
    "numeric": {"decimal", "bigint", "int", "smallint", "tinyint", "double", "float"},
    "timestamptz": {"timestamp", "timestamp_ntz", "date"},
    "jsonb": {"string", "struct", "array", "map"},
}


class JobError(KappaError):
    """The job's code returned something the orchestrator cannot store: retrying cannot help."""


def shape_output(df: Any, spec: JobSpec) -> Any:
    """The output columns in OUTPUT_SCHEMA order, then ``_delete``; jsonb columns as JSON."""
    from pyspark.sql import functions as F

    where = f"{spec.name} {spec.version}"
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    missing = [c for c in spec.output_columns if c not in types]
    if missing:
        raise JobError(f"{where}: transform() returned no column(s) {', '.join(missing)} of "
                       f"OUTPUT_SCHEMA (it returned {', '.join(types) or 'none'}); return them")
    columns = []
    for name, kind in spec.output_schema:
        spark_type = types[name].split("(")[0].split("<")[0]
        if spark_type not in _ACCEPTS[kind] and spark_type != "void":
            raise JobError(f"{where}: output column {name} is {types[name]} in Spark but "
                           f"{kind} in OUTPUT_SCHEMA; cast it in transform() or change "
                           "OUTPUT_SCHEMA")
        column = F.col(name)
        if kind == "jsonb" and spark_type != "string":
            column = F.to_json(column)
        columns.append(column.alias(name))
    if DELETE_COLUMN in types:
        if types[DELETE_COLUMN] != "boolean":
            raise JobError(f"{where}: column {DELETE_COLUMN} is {types[DELETE_COLUMN]}, but it "
                           "must be boolean (true deletes the row's key); cast it in transform()")
        if spec.output_mode == "append":
            raise JobError(f"{where}: an append job only inserts, so it cannot return "
                           f"{DELETE_COLUMN}; use OUTPUT_MODE = \"upsert\"")
        delete = F.coalesce(F.col(DELETE_COLUMN), F.lit(False))
    else:
        delete = F.lit(False)
    return df.select(*columns, delete.alias(DELETE_COLUMN))
