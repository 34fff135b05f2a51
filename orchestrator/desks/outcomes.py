"""Outcome metrics and outcome cutovers as the service offers them: define, list and drop a
job's metrics, and show an alias's latest outcome test with its evidence."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from orchestrator.catalog import events, outcomes
from orchestrator.catalog.access import CatalogAccess
from orchestrator.catalog.db import connect, qualified
from orchestrator.experiment.metrics import OutcomeMetric
from orchestrator.metrics.promql import PrometheusOutcomes
from orchestrator.naming import validate_name
from orchestrator.plan.stages import Experiment, from_json


class OutcomeDesk:
    def __init__(self, catalog: CatalogAccess):
        self.catalog = catalog
        self.settings = catalog.settings

    def define(self, job: str, metric: OutcomeMetric) -> dict[str, Any]:
        """Store the metric after its query ran once, read only, against the database it reads
        (Prometheus for PromQL): a query that fails, returns other columns or writes is refused
        in one line."""
        validate_name(job, "job name")
        s = self.settings
        if metric.sql is not None:
            dsn, _ = s.require_services()
            with connect(s.outcomes_pg_dsn or dsn, autocommit=True) as conn:
                outcomes.probe(conn, metric, since=outcomes.now(conn),
                               timeout_ms=s.metric_statement_timeout_ms)
        if metric.promql is not None:
            PrometheusOutcomes.of(s, metric).probe(metric, ["any"], datetime.now(UTC))
        with self.catalog.connection() as conn, conn.transaction():
            replaced = outcomes.define(conn, s.catalog_schema, job, metric)
            events.record(conn, s.catalog_schema, "metric_defined", job=job, replaced=replaced,
                          definition=_describe(metric))
        return {"job": job, **_describe(metric), "replaced": replaced}

    def drop(self, job: str, name: str) -> bool:
        s = self.settings
        with self.catalog.connection() as conn, conn.transaction():
            dropped = outcomes.drop(conn, s.catalog_schema, validate_name(job, "job name"),
                                    validate_name(name, "metric name"))
            if dropped:
                events.record(conn, s.catalog_schema, "metric_dropped", job=job, metric=name)
        return dropped

    def listed(self, job: str | None = None) -> list[dict[str, Any]]:
        with self.catalog.connection() as conn:
            found = outcomes.listed(conn, self.settings.catalog_schema,
                                    validate_name(job, "job name") if job else None)
        return [{"job": j, **_describe(m)} for j, m in found]

    def running(self) -> list[dict[str, Any]]:
        """Every outcome cutover that runs now, with its last look (for the exporter)."""
        schema = self.settings.catalog_schema
        with self.catalog.connection() as conn:
            rows = conn.execute(sql.SQL(
                "SELECT p.job, p.alias, p.version, l.look, l.next_percent, l.verdict, "
                "l.evidence FROM {plans} p JOIN LATERAL (SELECT * FROM {looks} x WHERE "
                "x.plan_id = p.id ORDER BY x.look DESC LIMIT 1) l ON true WHERE p.status = "
                "'running' ORDER BY p.alias").format(
                plans=qualified(schema, "cutover_plans"),
                looks=qualified(schema, "experiment_looks"))).fetchall()
        keys = ("job", "alias", "version", "look", "share", "verdict", "evidence")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def experiment(self, job: str, alias: str | None = None) -> dict[str, Any] | None:
        """The alias's latest outcome cutover: its plan, design and looks (the last one's
        evidence is the current state of the test); None if it never had one."""
        name = validate_name(alias or job, "alias")
        schema = self.settings.catalog_schema
        with self.catalog.connection() as conn:
            rows = conn.execute(sql.SQL(
                "SELECT id, version, status, reason, steps, started_at, updated_at FROM {} "
                "WHERE job = %s AND alias = %s AND steps @> '[{{\"kind\": \"experiment\"}}]' "
                "ORDER BY id DESC LIMIT 1").format(qualified(schema, "cutover_plans")),
                (validate_name(job, "job name"), name)).fetchall()
            if not rows:
                return None
            plan_id, version, status, reason, steps, started, updated = rows[0]
            looks = outcomes.looks(conn, schema, plan_id)
        (design,) = [s.design for s in from_json(steps) if isinstance(s, Experiment)]
        last = looks[-1] if looks else None
        return {"plan": plan_id, "job": job, "alias": name, "version": version,
                "status": status, "reason": reason, "started_at": started,
                "updated_at": updated, "design": design.to_json(),
                "baseline": looks[0]["evidence"]["baseline"] if looks else None,
                "share": last["next_percent"] if last else None,
                "verdict": last["verdict"] if last else None,
                "looks": looks}


def _describe(metric: OutcomeMetric) -> dict[str, Any]:
    return {"metric": metric.name, "kind": metric.kind.value,
            "better": "higher" if metric.higher_is_better else "lower",
            "role": metric.role.value, "margin": metric.margin, "sql": metric.sql,
            "promql": metric.promql, "promql_count": metric.promql_count,
            "promql_squares": metric.promql_squares}
