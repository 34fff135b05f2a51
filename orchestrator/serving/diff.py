"""A keyed comparison of two versions' tables, read from one snapshot, plus guardrail checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.catalog import runs
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError
from orchestrator.models import DeployedVersion, Offsets

SAMPLES = 5


@dataclass(frozen=True)
class GuardrailResult:
    name: str
    passed: bool
    detail: str | None = None


@dataclass(frozen=True)
class DiffReport:
    job: str
    a: str
    b: str
    offsets_a: Offsets
    offsets_b: Offsets
    aligned: bool
    offsets_apart: int  # records by which the versions' processed offsets differ
    rows_a: int
    rows_b: int
    only_in_a: int
    only_in_b: int
    differing: dict[str, int]  # column -> rows with the same key and another value
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    guardrails: tuple[GuardrailResult, ...] = ()

    @property
    def passed(self) -> bool:
        """Every guardrail passed. A comparison that ran none proves nothing: not passed."""
        return bool(self.guardrails) and all(g.passed for g in self.guardrails)

    @property
    def verdict(self) -> str:
        if not self.guardrails:
            return f"no guardrails: {self.b} declares none, so nothing was checked"
        failed = [g.name for g in self.guardrails if not g.passed]
        return f"failed: {', '.join(failed)}" if failed else "passed"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed, "verdict": self.verdict}


def _apart(a: Offsets, b: Offsets) -> int:
    keys = {(t, p) for o in (a, b) for t, ps in o.items() for p in ps}
    return sum(abs(a.get(t, {}).get(p, 0) - b.get(t, {}).get(p, 0)) for t, p in keys)


def compare(conn: psycopg.Connection, catalog_schema: str, data_schema: str,
            a: DeployedVersion, b: DeployedVersion) -> DiffReport:
    if a.spec.key_columns != b.spec.key_columns:
        raise KappaError(f"{a.version} and {b.version} have different keys "
                         f"({a.spec.key_columns} vs {b.spec.key_columns}): they cannot be diffed")
    keys = list(a.spec.key_columns)
    b_columns = dict(b.spec.output_schema)
    values = [c for c, kind in a.spec.output_schema if c not in keys and b_columns.get(c) == kind]
    ta, tb = qualified(data_schema, a.output_table), qualified(data_schema, b.output_table)
    on = sql.SQL(" AND ").join(sql.SQL("a.{k} = b.{k}").format(k=sql.Identifier(k)) for k in keys)
    a_missing = sql.SQL("a.{} IS NULL").format(sql.Identifier(keys[0]))
    b_missing = sql.SQL("b.{} IS NULL").format(sql.Identifier(keys[0]))
    both = sql.SQL("NOT ({}) AND NOT ({})").format(a_missing, b_missing)
    differs = {c: sql.SQL("a.{c} IS DISTINCT FROM b.{c}").format(c=sql.Identifier(c))
               for c in values}
    counts = [sql.SQL("count(*) FILTER (WHERE {})").format(b_missing),
              sql.SQL("count(*) FILTER (WHERE {})").format(a_missing)]
    counts += [sql.SQL("count(*) FILTER (WHERE {} AND {})").format(both, d)
               for d in differs.values()]
    join = sql.SQL("{} AS a FULL OUTER JOIN {} AS b ON {}").format(ta, tb, on)
    with conn.transaction():
        # One snapshot for both tables and both versions' offsets: each batch commits its rows
        # and offsets together, so the offsets say exactly what each table reflects.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        offsets_a = runs.processed_offsets(conn, catalog_schema, a.id)
        offsets_b = runs.processed_offsets(conn, catalog_schema, b.id)
        row = conn.execute(sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(counts), join)).fetchone()
        assert row is not None
        rows_a = _count(conn, ta)
        rows_b = _count(conn, tb)
        shown = sql.SQL(", ").join(
            [sql.SQL("coalesce(a.{k}, b.{k})").format(k=sql.Identifier(k)) for k in keys]
            + [sql.SQL("a.{c}, b.{c}").format(c=sql.Identifier(c)) for c in values])
        samples = {}
        for name, condition in [("only_in_a", b_missing), ("only_in_b", a_missing)] + [
                (f"differing_{c}", sql.SQL("{} AND {}").format(both, d))
                for c, d in differs.items()]:
            found = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY 1 LIMIT {}").format(
                shown, join, condition, sql.Literal(SAMPLES))).fetchall()
            labels = keys + [f"{side}.{c}" for c in values for side in ("a", "b")]
            samples[name] = [dict(zip(labels, r, strict=True)) for r in found]
        checks = tuple(_guardrail(conn, name, query, this=tb, other=ta)
                       for name, query in b.spec.guardrails)
    return DiffReport(
        job=a.job, a=a.version, b=b.version, offsets_a=offsets_a, offsets_b=offsets_b,
        aligned=offsets_a == offsets_b, offsets_apart=_apart(offsets_a, offsets_b),
        rows_a=rows_a, rows_b=rows_b, only_in_a=row[0], only_in_b=row[1],
        differing=dict(zip(values, row[2:], strict=True)), samples=samples, guardrails=checks)


def _count(conn: psycopg.Connection, table: sql.Composable) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    return int(row[0]) if row else 0


def _guardrail(conn: psycopg.Connection, name: str, query: str, *, this: sql.Composable,
               other: sql.Composable) -> GuardrailResult:
    try:
        with conn.transaction():  # a savepoint: a broken check does not end the comparison
            row = conn.execute(sql.SQL(query).format(this=this, other=other)).fetchone()
    except psycopg.Error as exc:
        return GuardrailResult(name, False, f"error: {str(exc).strip().splitlines()[0]}")
    if row is None or not isinstance(row[0], bool):
        return GuardrailResult(name, False, f"returned {row!r}, not one boolean")
    return GuardrailResult(name, row[0], None if row[0] else "returned false")
