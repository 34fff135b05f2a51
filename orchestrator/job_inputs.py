"""A job's inputs: its topics, how each one's records are encoded (EVENT_FORMAT), the fields
its events are read into (EVENT_SCHEMA, or EVENT_SCHEMAS per topic), NON_NEGATIVE and
TOMBSTONES."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator import event_formats
from orchestrator.errors import JobFileError
from orchestrator.models import RESERVED_FIELDS, TOMBSTONE_RULES, JobSpec, TopicInput
from orchestrator.naming import topic_name_problem
from orchestrator.schema import Struct, check_non_negative, from_flat, parse_ddl


class JobFiles:
    """The job's files by relative path; for a job file deployed alone, also the files beside
    it that its declarations name, which then become part of its deployed code."""

    def __init__(self, files: tuple[tuple[str, bytes], ...], beside: Path | None):
        self.files, self.beside = dict(files), beside
        self.read_beside: list[tuple[str, bytes]] = []

    def read(self, path: str) -> bytes | None:
        if path in self.files:
            return self.files[path]
        if self.beside is None:
            return None
        try:
            content = (self.beside / path).read_bytes()
        except OSError:
            return None
        self.files[path] = content
        self.read_beside.append((path, content))
        return content


def topic_inputs(lit: dict[str, Any], topics: list[str], where: str, files: JobFiles
                 ) -> tuple[tuple[TopicInput, ...], bool]:
    """Each topic's input, and whether the job declared EVENT_SCHEMAS (one schema a topic)."""
    for topic in topics:
        problem = topic_name_problem(topic)
        if problem is not None:
            raise JobFileError(f"{where}: {problem}: fix TOPICS")
    if not topics:
        raise JobFileError(f"{where}: TOPICS must name at least one topic")
    if len(set(topics)) != len(topics):
        raise JobFileError(f"{where}: TOPICS names a topic twice")
    if "EVENT_SCHEMA" in lit and "EVENT_SCHEMAS" in lit:
        raise JobFileError(f"{where}: declare EVENT_SCHEMA (one schema for every topic) or "
                           "EVENT_SCHEMAS (one per topic), not both")
    per_topic = "EVENT_SCHEMAS" in lit
    if per_topic:
        raw = lit["EVENT_SCHEMAS"]
        if not isinstance(raw, dict) or not raw:
            raise JobFileError(f"{where}: EVENT_SCHEMAS maps each topic of TOPICS to its schema")
        for topic in raw:
            if topic not in topics:
                raise JobFileError(f"{where}: EVENT_SCHEMAS names topic {topic!r} that is not in "
                                   "TOPICS: add it to TOPICS or remove its schema")
        lacking = [t for t in topics if t not in raw]
        if lacking:
            raise JobFileError(f"{where}: EVENT_SCHEMAS has no schema for topic(s) {lacking}")
        declared = {t: (raw[t], f"EVENT_SCHEMAS[{t!r}]") for t in topics}
    else:
        declared = dict.fromkeys(topics, (lit["EVENT_SCHEMA"], "EVENT_SCHEMA"))
    kinds = _per_topic(lit, "EVENT_FORMAT", topics, "json", where)
    non_negative = _per_topic(lit, "NON_NEGATIVE", topics, [], where)
    tombstones = _per_topic(lit, "TOMBSTONES", topics, "dead_letter", where)
    inputs = []
    for topic in topics:
        paths = non_negative[topic]
        if not isinstance(paths, list | tuple) or not all(isinstance(p, str) for p in paths):
            raise JobFileError(f"{where}: NON_NEGATIVE must be a list of field paths")
        rule = tombstones[topic]
        if rule not in TOMBSTONE_RULES:
            raise JobFileError(f"{where}: TOMBSTONES must be one of "
                               f"{', '.join(map(repr, TOMBSTONE_RULES))}, not {rule!r}")
        raw_schema, what = declared[topic]
        struct, fmt = event_formats.declared(kinds[topic], raw_schema, what, where, files.read)
        topic_input = TopicInput(topic, "", tuple(paths), str(rule), fmt)
        if fmt.kind == "json":
            struct = _schema(raw_schema, what, where)
        if struct is not None:  # else a registry subject's, checked once pinned at deploy
            struct = checked_fields(struct, topic_input, where, what)
            topic_input = replace(topic_input, schema=struct.ddl())
        inputs.append(topic_input)
    return tuple(inputs), per_topic


def pin_registry_schemas(spec: JobSpec,
                         fetch: Callable[[str, int | str], tuple[str, int]]) -> JobSpec:
    """The spec with its registry subjects' schemas fetched, pinned and checked (deploy)."""
    return event_formats.pin_registry_schemas(
        spec, fetch, lambda struct, topic_input, where: checked_fields(
            struct, topic_input, where, "the reader schema"))


def checked_fields(struct: Struct, topic_input: TopicInput, where: str, what: str) -> Struct:
    """The fields, once no name is reserved and every NON_NEGATIVE path is a numeric field."""
    clashes = [f for f, _ in struct.fields if f.lower() in RESERVED_FIELDS]
    if clashes:
        raise JobFileError(f"{where}: {what} declares {', '.join(map(repr, clashes))}, reserved "
                           "for the Kafka metadata and decoded segments' dead-letter columns "
                           f"({', '.join(RESERVED_FIELDS)}): rename the field(s)")
    try:
        check_non_negative(struct, topic_input.non_negative)
    except JobFileError as exc:
        raise JobFileError(f"{where}: NON_NEGATIVE: {exc}") from exc
    return struct


def _schema(raw: Any, what: str, where: str) -> Struct:
    try:
        if isinstance(raw, str):
            return parse_ddl(raw)
        if isinstance(raw, dict) and raw:
            return from_flat(raw)
        raise JobFileError(f"{what} must be a Spark DDL string such as \"user_id bigint, url "
                           "string\" or a non-empty dict of field -> type")
    except JobFileError as exc:
        message = str(exc)
        raise JobFileError(message if message.startswith(where) else f"{where}: {message}") \
            from exc


def _per_topic(lit: dict[str, Any], key: str, topics: list[str], default: Any, where: str
               ) -> dict[str, Any]:
    """A declaration that applies to every topic, or a dict of it per topic."""
    raw = lit.get(key, default)
    if not isinstance(raw, dict):
        return dict.fromkeys(topics, raw)
    for topic in raw:
        if topic not in topics:
            raise JobFileError(f"{where}: {key} names topic {topic!r} that is not in TOPICS: add "
                               "it to TOPICS or remove it")
    return {t: raw.get(t, default) for t in topics}
