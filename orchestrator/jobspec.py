"""Read a job file's declarations without running it.

A job file is plain Python: module-level literals declare what the job is, and ``transform``
turns a DataFrame of parsed events into the output DataFrame. Reading the literals with ``ast``
keeps the CLI free of pyspark and refuses a bad file before anything is registered.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

from orchestrator.errors import JobFileError
from orchestrator.models import EVENT_TYPES, MERGE_RULES, OUTPUT_TYPES, JobSpec
from orchestrator.naming import NAME_PATTERN, validate_name

REQUIRED = ("NAME", "VERSION", "TOPICS", "EVENT_SCHEMA", "KEY_COLUMNS", "OUTPUT_SCHEMA")
OPTIONAL = ("NON_NEGATIVE", "MERGE", "GUARDRAILS")
TRANSFORM = "transform"


def fingerprint(source: str) -> str:
    return "sha256:" + hashlib.sha256(source.encode()).hexdigest()


def load_job_file(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise JobFileError(f"job file {path} does not exist: give the path of a job's .py file") \
            from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"cannot read job file {path}: {exc}") from exc
    return parse_job_source(source, str(path))


def parse_job_source(source: str, path: str) -> JobSpec:
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise JobFileError(
            f"{path}:{exc.lineno}: syntax error ({exc.msg}): fix the file and deploy again"
        ) from exc

    literals: dict[str, Any] = {}
    has_transform = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == TRANSFORM:
            has_transform = len(node.args.args) == 1
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and target.id in REQUIRED + OPTIONAL:
                assert value is not None
                try:
                    literals[target.id] = ast.literal_eval(value)
                except ValueError as exc:
                    raise JobFileError(
                        f"{path}: {target.id} must be a literal (string, list or dict)"
                    ) from exc

    missing = [name for name in REQUIRED if name not in literals]
    if not has_transform:
        missing.append("def transform(events)")
    if missing:
        raise JobFileError(
            f"{path}: missing declaration(s) {', '.join(missing)}: see jobs/pageview_counts/v1.py"
        )
    return _build_spec(literals, source, path)


def _build_spec(lit: dict[str, Any], source: str, path: str) -> JobSpec:
    name = validate_name(_str(lit, "NAME", path), "job name")
    version = validate_name(_str(lit, "VERSION", path), "version")
    topics = tuple(_str_list(lit, "TOPICS", path))
    if not topics:
        raise JobFileError(f"{path}: TOPICS must name at least one topic")
    event_schema = _typed_map(lit, "EVENT_SCHEMA", EVENT_TYPES, path)
    output_schema = _typed_map(lit, "OUTPUT_SCHEMA", OUTPUT_TYPES, path)
    for column, _ in output_schema:
        if NAME_PATTERN.fullmatch(column) is None:
            raise JobFileError(f"{path}: output column {column!r} must match [a-z][a-z0-9_]*")
    columns = [c for c, _ in output_schema]
    keys = tuple(_str_list(lit, "KEY_COLUMNS", path))
    if not keys or any(k not in columns for k in keys):
        raise JobFileError(f"{path}: KEY_COLUMNS must be a non-empty subset of OUTPUT_SCHEMA")
    fields = [f for f, _ in event_schema]
    non_negative = tuple(_str_list(lit, "NON_NEGATIVE", path, default=[]))
    bad = [f for f in non_negative if f not in fields]
    if bad:
        raise JobFileError(f"{path}: NON_NEGATIVE names unknown event field(s) {bad}")
    merge_raw = lit.get("MERGE", {})
    if not isinstance(merge_raw, dict) or any(
        not isinstance(k, str) or v not in MERGE_RULES for k, v in merge_raw.items()
    ):
        raise JobFileError(f"{path}: MERGE maps value columns to one of {', '.join(MERGE_RULES)}")
    values = [c for c in columns if c not in keys]
    unknown = [c for c in merge_raw if c not in values]
    if unknown:
        raise JobFileError(f"{path}: MERGE names column(s) {unknown} that are not value columns")
    # A value column without a rule is replaced by the latest batch's value.
    merge = tuple((c, str(merge_raw.get(c, "replace"))) for c in values)
    guardrails_raw = lit.get("GUARDRAILS", {})
    if not isinstance(guardrails_raw, dict) or any(
        not isinstance(k, str) or not isinstance(v, str) or not v.strip()
        for k, v in guardrails_raw.items()
    ):
        raise JobFileError(f"{path}: GUARDRAILS maps a check's name to SQL returning one boolean")
    for check, query in guardrails_raw.items():
        try:
            query.format(this="t", other="o")
        except (KeyError, IndexError, ValueError) as exc:
            raise JobFileError(
                f"{path}: guardrail {check!r} may use only {{this}} and {{other}} ({exc})"
            ) from exc
    return JobSpec(
        name=name, version=version, topics=topics, event_schema=event_schema,
        non_negative=non_negative, key_columns=keys, output_schema=output_schema, merge=merge,
        source=source, fingerprint=fingerprint(source), path=path,
        guardrails=tuple((str(k), str(v)) for k, v in guardrails_raw.items()),
    )


def _str(lit: dict[str, Any], key: str, path: str) -> str:
    value = lit[key]
    if not isinstance(value, str):
        raise JobFileError(f"{path}: {key} must be a string")
    return value


def _str_list(lit: dict[str, Any], key: str, path: str, default: list[str] | None = None
              ) -> list[str]:
    value = lit.get(key, default)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise JobFileError(f"{path}: {key} must be a list of strings")
    return list(value)


def _typed_map(lit: dict[str, Any], key: str, allowed: tuple[str, ...], path: str
               ) -> tuple[tuple[str, str], ...]:
    value = lit[key]
    if not isinstance(value, dict) or not value:
        raise JobFileError(f"{path}: {key} must be a non-empty dict of column -> type")
    for column, kind in value.items():
        if not isinstance(column, str) or kind not in allowed:
            raise JobFileError(
                f"{path}: {key}[{column!r}] = {kind!r}: types are {', '.join(allowed)}"
            )
    return tuple((str(c), str(t)) for c, t in value.items())


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "version": spec.version, "topics": list(spec.topics),
        "event_schema": [list(p) for p in spec.event_schema],
        "non_negative": list(spec.non_negative), "key_columns": list(spec.key_columns),
        "output_schema": [list(p) for p in spec.output_schema],
        "merge": [list(p) for p in spec.merge],
        "guardrails": [list(p) for p in spec.guardrails],
    }


def spec_from_catalog(doc: dict[str, Any], source: str, fp: str, path: str) -> JobSpec:
    return JobSpec(
        name=doc["name"], version=doc["version"], topics=tuple(doc["topics"]),
        event_schema=tuple((a, b) for a, b in doc["event_schema"]),
        non_negative=tuple(doc["non_negative"]), key_columns=tuple(doc["key_columns"]),
        output_schema=tuple((a, b) for a, b in doc["output_schema"]),
        merge=tuple((a, b) for a, b in doc["merge"]), source=source, fingerprint=fp, path=path,
        guardrails=tuple((a, b) for a, b in doc.get("guardrails", [])),
    )
