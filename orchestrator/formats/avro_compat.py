"""Whether every record written with one Avro schema can be read with another: Avro's schema
resolution, decided from the two schemas alone, as fastavro applies it record by record.

A deploy asks it of each writer schema that the log's records use (#62), so that a reader
schema which cannot read some of them is refused in one line naming the field, rather than
turning those records into dead letters. The rules, after the Avro specification and fastavro:

- records, enums and fixed types match by unqualified name, or a reader's alias;
- a reader's field that the writer lacks needs a default; a writer's field that the reader
  lacks is skipped; a reader's field alias matches a writer's field of that name;
- an enum symbol of the writer that the reader lacks needs the reader's default;
- fixed types need the same size;
- int reads as long, float or double, long as float or double, float as double, and string
  and bytes as each other;
- every branch of a writer's union must be readable; a reader's union reads with its first
  branch whose type matches.
"""

from __future__ import annotations

from typing import Any

import fastavro

_NAMED = ("record", "enum", "fixed")
_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
               ("long", "double"), ("float", "double"), ("string", "bytes"),
               ("bytes", "string")}


def unreadable(writer: Any, reader: Any) -> str | None:
    """Why some record written with ``writer`` cannot be read with ``reader``, naming the
    field; None if every one can."""
    writers: dict[str, Any] = {}
    readers: dict[str, Any] = {}
    w = fastavro.parse_schema(writer, named_schemas=writers)
    r = fastavro.parse_schema(reader, named_schemas=readers)
    return _Resolution(writers, readers).check(w, r, "")


class _Resolution:
    def __init__(self, writers: dict[str, Any], readers: dict[str, Any]):
        self.writers, self.readers = writers, readers
        self.seen: set[tuple[str, str]] = set()  # named pairs checked or being checked

    def check(self, w: Any, r: Any, path: str) -> str | None:
        w, r = self._named(w, self.writers), self._named(r, self.readers)
        if isinstance(w, list):
            for branch in w:
                reason = self.check(branch, r, path)
                if reason is not None:
                    return reason
            return None
        if isinstance(r, list):
            branch = next((b for b in r if self._matches(w, b)), None)
            if branch is None:
                return (f"{_where(path)}: the writer's {_kind(w)} matches no branch of the "
                        f"reader's union of {' | '.join(_kind(b) for b in r)}")
            return self.check(w, branch, path)
        if not self._matches(w, r):
            return f"{_where(path)}: the writer's {_kind(w)} cannot be read as {_kind(r)}"
        kind = _type(w)
        if kind in _NAMED:
            pair = (w["name"], r["name"])
            if pair in self.seen:  # a recursive type: its check is under way
                return None
            self.seen.add(pair)
        if kind == "record":
            return self._record(w, r, path)
        if kind == "enum":
            lacking = [s for s in w["symbols"] if s not in r["symbols"]]
            if lacking and not r.get("default"):
                return (f"{_where(path)}: the writer's enum symbol {lacking[0]} is not one of "
                        "the reader's, which gives no default")
        if kind == "array":
            return self.check(w["items"], r["items"], f"{path}[]")
        if kind == "map":
            return self.check(w["values"], r["values"], f"{path}[]")
        return None

    def _record(self, w: dict[str, Any], r: dict[str, Any], path: str) -> str | None:
        written = {f["name"]: f for f in w["fields"]}
        for field in r["fields"]:
            name = f"{path}.{field['name']}" if path else field["name"]
            found = next((written[n] for n in (field["name"], *field.get("aliases", ()))
                          if n in written), None)
            if found is None:
                if "default" not in field:
                    return (f"field {name}: the writer has no such field, and the reader "
                            "gives it no default")
                continue
            reason = self.check(found["type"], field["type"], name)
            if reason is not None:
                return reason
        return None

    def _matches(self, w: Any, r: Any) -> bool:
        """fastavro's type-level match: names for named types, promotions for primitives."""
        w, r = self._named(w, self.writers), self._named(r, self.readers)
        if isinstance(w, list) or isinstance(r, list):
            return True
        wt, rt = _type(w), _type(r)
        if wt in _NAMED and rt in _NAMED:
            if wt != rt or (wt == "fixed" and w["size"] != r["size"]):
                return False
            unqualified = w["name"].split(".")[-1]
            return unqualified == r["name"].split(".")[-1] or \
                bool({w["name"], unqualified} & set(r.get("aliases", ())))
        return wt == rt or (wt, rt) in _PROMOTIONS

    @staticmethod
    def _named(schema: Any, names: dict[str, Any]) -> Any:
        return names.get(schema, schema) if isinstance(schema, str) else schema


def _type(schema: Any) -> str:
    return str(schema["type"] if isinstance(schema, dict) else schema)


def _kind(schema: Any) -> str:
    kind = _type(schema)
    return f"{kind} {schema['name']}" if kind in _NAMED else kind


def _where(path: str) -> str:
    return f"field {path}" if path else "the record"
