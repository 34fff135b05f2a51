"""Read a job's declarations without running it.

A job is plain Python: module-level literals declare what the job is, and ``transform`` turns the
events into the output DataFrame. A job is one file, or a directory (a package) whose ``job.py``
holds the declarations and which may hold helper modules. Reading the literals with ``ast`` keeps
the CLI free of pyspark and refuses a bad job before anything is registered.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.errors import JobFileError
from orchestrator.event_formats import format_from_json, format_to_json
from orchestrator.job_inputs import JobFiles, topic_inputs
from orchestrator.models import (
    DELETE_COLUMN,
    MERGE_RULES,
    MODES,
    OUTPUT_MODES,
    OUTPUT_TYPES,
    JobSpec,
    TopicInput,
)
from orchestrator.naming import NAME_PATTERN, validate_name
from orchestrator.schema import from_flat

REQUIRED = ("NAME", "VERSION", "TOPICS", "KEY_COLUMNS", "OUTPUT_SCHEMA")
OPTIONAL = ("EVENT_SCHEMA", "EVENT_SCHEMAS", "EVENT_FORMAT", "NON_NEGATIVE", "MERGE",
            "GUARDRAILS", "MODE", "OUTPUT_MODE", "TOMBSTONES")
TRANSFORM = "transform"
ENTRY_FILE = "job.py"  # the declarations of a directory job
# A directory job is code, not data: these bound an accidental deploy of a data folder.
_MAX_FILES = 200
_MAX_BYTES = 10 * 1024 * 1024
_SKIPPED_DIRS = {"__pycache__"}
_NUMERIC_RULES = ("sum", "min", "max", "replace")
_MERGEABLE = {"bigint": _NUMERIC_RULES, "integer": _NUMERIC_RULES,
              "double precision": _NUMERIC_RULES, "numeric": _NUMERIC_RULES,
              "text": ("min", "max", "replace"), "timestamptz": ("min", "max", "replace"),
              "boolean": ("min", "max", "replace")}


def fingerprint(source: str) -> str:
    return "sha256:" + hashlib.sha256(source.encode()).hexdigest()


def files_fingerprint(files: tuple[tuple[str, bytes], ...]) -> str:
    """One digest over every file's path and content, independent of the listing order."""
    digest = hashlib.sha256()
    for path, content in sorted(files):
        digest.update(f"{path}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return "sha256:" + digest.hexdigest()


def load_job_file(path: str | Path) -> JobSpec:
    """Load a job file, or a job directory (a package with ``job.py`` and helper modules)."""
    path = Path(path)
    if path.is_dir():
        return _load_directory(path)
    try:
        data = path.read_bytes()
        source = data.decode("utf-8")
    except FileNotFoundError as exc:
        raise JobFileError(f"job file {path} does not exist: give the path of a job's .py file "
                           "or directory") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"cannot read job file {path}: {exc}") from exc
    spec = parse_job_source(source, str(path), files=((path.name, data),), entry=path.name,
                            beside=path.parent)
    _refuse_relative_imports(spec.source, path)
    return spec


def _refuse_relative_imports(source: str, path: Path) -> None:
    """A file deployed alone has nothing beside it to import: a relative import (often lazy,
    inside transform()) would only fail at the version's first batch, its VERSION spent."""
    found = next((node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.ImportFrom) and node.level), None)
    if found is None:
        return
    imported = "." * found.level + (found.module or "")
    if (path.parent / ENTRY_FILE).is_file():
        todo = f"deploy its directory instead: kappa deploy {path.parent}"
    else:
        todo = (f"make it a directory job ({ENTRY_FILE} with its helpers beside it) and deploy "
                "that directory")
    raise JobFileError(f"{path}:{found.lineno}: `from {imported} import ...` is a relative "
                       f"import, which a job file deployed alone cannot resolve: {todo}")


def _load_directory(root: Path) -> JobSpec:
    entry = root / ENTRY_FILE
    if not entry.is_file():
        raise JobFileError(f"job directory {root} has no {ENTRY_FILE}: put the declarations and "
                           "transform() there, helpers beside it")
    files: list[tuple[str, bytes]] = []
    total = 0
    for file in sorted(root.rglob("*")):
        relative = file.relative_to(root)
        if not file.is_file() or file.suffix == ".pyc" or any(
                part in _SKIPPED_DIRS or part.startswith(".") for part in relative.parts):
            continue
        try:
            content = file.read_bytes()
        except OSError as exc:
            raise JobFileError(f"cannot read {file}: {exc}") from exc
        total += len(content)
        files.append((relative.as_posix(), content))
        if len(files) > _MAX_FILES or total > _MAX_BYTES:
            raise JobFileError(f"job directory {root} holds more than {_MAX_FILES} files or "
                               f"{_MAX_BYTES // 2**20} MiB: keep only the job's code in it")
    source = dict(files)[ENTRY_FILE].decode("utf-8", errors="replace")
    return parse_job_source(source, str(root), files=tuple(files), entry=ENTRY_FILE)


def parse_job_source(source: str, path: str, *, files: tuple[tuple[str, bytes], ...] = (),
                     entry: str = "", beside: Path | None = None) -> JobSpec:
    """The job's declarations; ``beside``: the directory of a job file deployed alone, where
    the files that its declarations name (an .avsc, a .desc) are read."""
    entry = entry or Path(path).name
    files = files or ((entry, source.encode()),)
    where = path if len(files) == 1 else f"{path}/{entry}"
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise JobFileError(
            f"{where}:{exc.lineno}: syntax error ({exc.msg}): fix the file and deploy again"
        ) from exc
    for name, content in files:
        if name != entry and name.endswith(".py"):
            try:
                ast.parse(content, filename=name)
            except (SyntaxError, ValueError) as exc:
                raise JobFileError(f"{path}/{name}: syntax error ({exc}): fix the file and "
                                   "deploy again") from exc

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
                        f"{where}: {target.id} must be a literal (string, list or dict)"
                    ) from exc

    missing = [name for name in REQUIRED if name not in literals]
    if "EVENT_SCHEMA" not in literals and "EVENT_SCHEMAS" not in literals:
        missing.append("EVENT_SCHEMA")
    if not has_transform:
        missing.append("def transform(events)")
    if missing:
        raise JobFileError(
            f"{where}: missing declaration(s) {', '.join(missing)}: see jobs/pageview_counts/v1.py"
        )
    job_files = JobFiles(files, beside)
    spec = _build_spec(literals, source, where, path, job_files, entry)
    files = (*files, *job_files.read_beside)
    fp = fingerprint(source) if len(files) == 1 else files_fingerprint(files)
    return replace(spec, files=files, fingerprint=fp)


def _build_spec(lit: dict[str, Any], source: str, where: str, path: str, files: JobFiles,
                entry: str) -> JobSpec:
    name = validate_name(_str(lit, "NAME", where), "job name")
    version = validate_name(_str(lit, "VERSION", where), "version")
    mode = _choice(lit, "MODE", MODES, "batch", where)
    output_mode = _choice(lit, "OUTPUT_MODE", OUTPUT_MODES, "upsert", where)
    inputs, per_topic = topic_inputs(lit, _str_list(lit, "TOPICS", where), where, files)

    output_schema = _output_schema(lit, where)
    columns = [c for c, _ in output_schema]
    keys = tuple(_str_list(lit, "KEY_COLUMNS", where))
    if not keys or any(k not in columns for k in keys):
        raise JobFileError(f"{where}: KEY_COLUMNS must be a non-empty subset of OUTPUT_SCHEMA")
    merge_raw = lit.get("MERGE", {})
    if not isinstance(merge_raw, dict) or any(
        not isinstance(k, str) or v not in MERGE_RULES for k, v in merge_raw.items()
    ):
        raise JobFileError(f"{where}: MERGE maps value columns to one of {', '.join(MERGE_RULES)}")
    if merge_raw and output_mode == "append":
        raise JobFileError(f"{where}: MERGE applies to OUTPUT_MODE = \"upsert\"; an append job "
                           "only inserts: remove MERGE or use upsert")
    values = [c for c in columns if c not in keys]
    unknown = [c for c in merge_raw if c not in values]
    if unknown:
        raise JobFileError(f"{where}: MERGE names column(s) {unknown} that are not value columns")
    kinds = dict(output_schema)
    for column, rule in merge_raw.items():
        if rule not in _MERGEABLE.get(kinds[column], ("replace",)):
            raise JobFileError(f"{where}: MERGE {column!r}: {rule!r} does not apply to a "
                               f"{kinds[column]} column; use "
                               f"{' or '.join(_MERGEABLE.get(kinds[column], ('replace',)))}")
    # A value column without a rule is replaced by the latest batch's value.
    merge = tuple((c, str(merge_raw.get(c, "replace"))) for c in values)
    return JobSpec(
        name=name, version=version, inputs=inputs, key_columns=keys, output_schema=output_schema,
        merge=merge, source=source, fingerprint="", path=path,
        guardrails=_guardrails(lit, where), mode=mode, output_mode=output_mode,
        per_topic=per_topic, entry=entry,
    )


def _output_schema(lit: dict[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    value = lit["OUTPUT_SCHEMA"]
    if not isinstance(value, dict) or not value:
        raise JobFileError(f"{where}: OUTPUT_SCHEMA must be a non-empty dict of column -> type")
    for column, kind in value.items():
        if not isinstance(column, str) or kind not in OUTPUT_TYPES:
            raise JobFileError(
                f"{where}: OUTPUT_SCHEMA[{column!r}] = {kind!r}: types are "
                f"{', '.join(OUTPUT_TYPES)}"
            )
        if column == DELETE_COLUMN:
            raise JobFileError(f"{where}: {DELETE_COLUMN} is not stored: return it from "
                               "transform() without declaring it in OUTPUT_SCHEMA")
        if NAME_PATTERN.fullmatch(column) is None:
            raise JobFileError(f"{where}: output column {column!r} must match [a-z][a-z0-9_]*")
    return tuple((str(c), str(t)) for c, t in value.items())


def _guardrails(lit: dict[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    raw = lit.get("GUARDRAILS", {})
    if not isinstance(raw, dict) or any(
        not isinstance(k, str) or not isinstance(v, str) or not v.strip()
        for k, v in raw.items()
    ):
        raise JobFileError(f"{where}: GUARDRAILS maps a check's name to SQL returning one boolean")
    for check, query in raw.items():
        try:
            query.format(this="t", other="o")
        except (KeyError, IndexError, ValueError) as exc:
            raise JobFileError(
                f"{where}: guardrail {check!r} may use only {{this}} and {{other}} ({exc})"
            ) from exc
    return tuple((str(k), str(v)) for k, v in raw.items())


def _choice(lit: dict[str, Any], key: str, allowed: tuple[str, ...], default: str, where: str
            ) -> str:
    value = lit.get(key, default)
    if value not in allowed:
        raise JobFileError(f"{where}: {key} must be one of {', '.join(map(repr, allowed))}, "
                           f"not {value!r}")
    return str(value)


def _str(lit: dict[str, Any], key: str, where: str) -> str:
    value = lit[key]
    if not isinstance(value, str):
        raise JobFileError(f"{where}: {key} must be a string")
    return value


def _str_list(lit: dict[str, Any], key: str, where: str) -> list[str]:
    value = lit.get(key)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise JobFileError(f"{where}: {key} must be a list of strings")
    return list(value)


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "version": spec.version,
        "inputs": [{"topic": i.topic, "schema": i.schema, "non_negative": list(i.non_negative),
                    "tombstones": i.tombstones, "format": format_to_json(i.format)}
                   for i in spec.inputs],
        "key_columns": list(spec.key_columns),
        "output_schema": [list(p) for p in spec.output_schema],
        "merge": [list(p) for p in spec.merge],
        "guardrails": [list(p) for p in spec.guardrails],
        "mode": spec.mode, "output_mode": spec.output_mode, "per_topic": spec.per_topic,
        "entry": spec.entry,
    }


def spec_from_catalog(doc: dict[str, Any], source: str, fp: str, path: str,
                      files: tuple[tuple[str, bytes], ...] = ()) -> JobSpec:
    if "inputs" in doc:
        inputs = tuple(TopicInput(i["topic"], i["schema"], tuple(i["non_negative"]),
                                  i["tombstones"], format_from_json(i.get("format")))
                       for i in doc["inputs"])
    else:  # deployed before nested schemas: one flat schema for every topic
        ddl = from_flat(dict(doc["event_schema"])).ddl()
        inputs = tuple(TopicInput(t, ddl, tuple(doc["non_negative"]), "dead_letter")
                       for t in doc["topics"])
    entry = doc.get("entry") or Path(path).name
    return JobSpec(
        name=doc["name"], version=doc["version"], inputs=inputs,
        key_columns=tuple(doc["key_columns"]),
        output_schema=tuple((a, b) for a, b in doc["output_schema"]),
        merge=tuple((a, b) for a, b in doc["merge"]), source=source, fingerprint=fp, path=path,
        guardrails=tuple((a, b) for a, b in doc.get("guardrails", [])),
        mode=doc.get("mode", "batch"), output_mode=doc.get("output_mode", "upsert"),
        per_topic=bool(doc.get("per_topic", False)),
        files=files or ((entry, source.encode()),), entry=entry,
    )
