"""Jobs and their immutable deployed versions."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified
from orchestrator.errors import ConflictError, NotFoundError
from orchestrator.jobspec import spec_from_catalog, spec_to_json
from orchestrator.log_identity import LogIdentity
from orchestrator.models import DeployedVersion, JobSpec, Offsets

_COLUMNS = (
    "id, job, version, fingerprint, source, file_path, spec, output_table, dead_letter_table, "
    "checkpoint_dir, consumer_group, log_start, created_at"
)
# The version (v) and the log it reads (l; kept apart: job_versions is immutable), as
# ``from_row`` reads them.
ROW_COLUMNS = ", ".join(f"v.{c.strip()}" for c in _COLUMNS.split(",")) + ", l.identity"
ROW_WIDTH = len(_COLUMNS.split(",")) + 1
_SELECT = "SELECT " + ROW_COLUMNS + " FROM {} v LEFT JOIN {} l ON l.version_id = v.id "


def _select(schema: str, where: str) -> sql.Composed:
    return sql.SQL(_SELECT + where).format(qualified(schema, "job_versions"),
                                           qualified(schema, "version_logs"))


def from_row(row: tuple[Any, ...]) -> DeployedVersion:
    """The version of a row of ``ROW_COLUMNS``."""
    (vid, _job, _version, fp, source, path, spec, out, dlq, ckpt, group, log_start, created,
     identity) = row
    return DeployedVersion(
        id=vid, spec=spec_from_catalog(spec, source, fp, path), output_table=out,
        dead_letter_table=dlq, checkpoint_dir=ckpt, consumer_group=group,
        log_start=log_start, created_at=created, log_identity=LogIdentity.from_json(identity),
    )


def find(conn: psycopg.Connection, schema: str, job: str, version: str) -> DeployedVersion | None:
    row = conn.execute(_select(schema, "WHERE v.job = %s AND v.version = %s"),
                       (job, version)).fetchone()
    return from_row(row) if row else None


def get(conn: psycopg.Connection, schema: str, job: str, version: str) -> DeployedVersion:
    found = find(conn, schema, job, version)
    if found is not None:
        return found
    known = job_exists(conn, schema, job)
    if not known:
        raise NotFoundError(f"unknown job {job!r}: `kappa status` lists the deployed jobs")
    raise NotFoundError(
        f"job {job!r} has no version {version!r}: `kappa status {job}` lists its versions"
    )


def job_exists(conn: psycopg.Connection, schema: str, job: str) -> bool:
    return conn.execute(sql.SQL("SELECT 1 FROM {} WHERE name = %s")
                        .format(qualified(schema, "jobs")), (job,)).fetchone() is not None


def list_all(conn: psycopg.Connection, schema: str, job: str | None = None
             ) -> list[DeployedVersion]:
    rows = conn.execute(
        _select(schema, "WHERE (%(job)s::text IS NULL OR v.job = %(job)s) ORDER BY v.job, v.id"),
        {"job": job}).fetchall()
    return [from_row(r) for r in rows]


def check_same_code(existing: DeployedVersion, spec: JobSpec) -> None:
    if existing.spec.fingerprint != spec.fingerprint:
        raise ConflictError(
            f"{spec.name} {spec.version} is already deployed with different code "
            f"({existing.spec.fingerprint[:19]}…, file {existing.spec.path}): "
            "give the changed job a new VERSION label"
        )


def insert(conn: psycopg.Connection, schema: str, spec: JobSpec, *, output_table: str,
           dead_letter_table: str, checkpoint_dir: str, consumer_group: str,
           log_start: Offsets, log_identity: LogIdentity | None) -> DeployedVersion:
    conn.execute(sql.SQL("INSERT INTO {} (name) VALUES (%s) ON CONFLICT DO NOTHING")
                 .format(qualified(schema, "jobs")), (spec.name,))
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {} (job, version, fingerprint, source, file_path, spec, output_table, "
            "dead_letter_table, checkpoint_dir, consumer_group, log_start) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING " + _COLUMNS
        ).format(qualified(schema, "job_versions")),
        (spec.name, spec.version, spec.fingerprint, spec.source, spec.path,
         Jsonb(spec_to_json(spec)), output_table, dead_letter_table, checkpoint_dir,
         consumer_group, Jsonb(log_start)),
    ).fetchone()
    assert row is not None
    version = from_row((*row, None))
    if log_identity is not None:
        version = set_log_identity(conn, schema, version, log_identity)
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {} (version_id, path, content, sha256) VALUES (%s, %s, %s, %s)")
            .format(qualified(schema, "job_files")),
            [(version.id, path, content, hashlib.sha256(content).hexdigest())
             for path, content in spec.files])
    return version


def with_code(conn: psycopg.Connection, schema: str, version: DeployedVersion
              ) -> DeployedVersion:
    """The version with every file of its deployed code (loaded only where code runs)."""
    rows = conn.execute(
        sql.SQL("SELECT path, content FROM {} WHERE version_id = %s ORDER BY path")
        .format(qualified(schema, "job_files")), (version.id,)).fetchall()
    if not rows:  # deployed before code files were stored: the source is the whole job
        return version
    files = tuple((str(path), bytes(content)) for path, content in rows)
    return replace(version, spec=replace(version.spec, files=files))


def set_log_identity(conn: psycopg.Connection, schema: str, version: DeployedVersion,
                     identity: LogIdentity) -> DeployedVersion:
    conn.execute(sql.SQL("INSERT INTO {} (version_id, identity) VALUES (%s, %s) "
                         "ON CONFLICT (version_id) DO UPDATE SET identity = EXCLUDED.identity, "
                         "recorded_at = now()").format(qualified(schema, "version_logs")),
                 (version.id, Jsonb(identity.to_json())))
    return replace(version, log_identity=identity)


def by_id(conn: psycopg.Connection, schema: str, version_id: int) -> DeployedVersion:
    row = conn.execute(_select(schema, "WHERE v.id = %s"), (version_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no version with id {version_id}: `kappa status` lists them")
    return from_row(row)
