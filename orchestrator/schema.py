"""The declared shape of a job's events: a tree of Spark types, read from Spark DDL.

``EVENT_SCHEMA`` is either today's flat dict (``{"user_id": "long"}``, see ``from_flat``) or a
Spark DDL field list (``"user_id bigint, address struct<city: string>"``, see ``parse_ddl``).
Both give a ``Struct``. The parser here is our own so that the CLI and the validation hot path
never import pyspark; ``ddl()`` gives the text Spark itself reads back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn, TypeAlias

from orchestrator.errors import JobFileError

__all__ = [
    "FLAT_TYPES",
    "INTEGER_BITS",
    "PRIMITIVES",
    "Array",
    "DataType",
    "Decimal",
    "Map",
    "Primitive",
    "Struct",
    "check_non_negative",
    "from_flat",
    "is_numeric",
    "parse_ddl",
]

PRIMITIVES = (
    "bigint", "int", "smallint", "tinyint", "double", "float", "string", "boolean", "timestamp",
    "date",
)
INTEGER_BITS = {"bigint": 64, "int": 32, "smallint": 16, "tinyint": 8}
MAX_DECIMAL_PRECISION = 38  # what Spark and Arrow's decimal128 can hold

# Spark's spellings of each primitive, lower case, to the canonical one.
_ALIASES = {
    "string": "string", "long": "bigint", "bigint": "bigint", "int": "int", "integer": "int",
    "short": "smallint", "smallint": "smallint", "byte": "tinyint", "tinyint": "tinyint",
    "double": "double", "float": "float", "real": "float", "boolean": "boolean",
    "timestamp": "timestamp", "date": "date",
}
_DECIMALS = ("decimal", "dec", "numeric")
_TYPE_LIST = (
    "string, long, int, short, byte, double, float, boolean, timestamp, date, decimal(p,s), "
    "array<T>, map<string,T>, struct<name: T, ...>"
)
# The flat dict form keeps exactly the types it always had.
FLAT_TYPES = {"long": "bigint", "string": "string", "double": "double", "boolean": "boolean"}


@dataclass(frozen=True)
class Primitive:
    name: str  # canonical, one of PRIMITIVES

    def __post_init__(self) -> None:
        if self.name not in PRIMITIVES:
            raise ValueError(f"{self.name!r} is not one of {', '.join(PRIMITIVES)}")

    def ddl(self) -> str:
        return self.name


@dataclass(frozen=True)
class Decimal:
    precision: int = 10
    scale: int = 0

    def __post_init__(self) -> None:
        if not (1 <= self.precision <= MAX_DECIMAL_PRECISION and
                0 <= self.scale <= self.precision):
            raise ValueError(f"decimal({self.precision},{self.scale}) needs 1 <= p <= 38, "
                             "0 <= s <= p")

    def ddl(self) -> str:
        return f"decimal({self.precision},{self.scale})"


@dataclass(frozen=True)
class Array:
    element: DataType

    def ddl(self) -> str:
        return f"array<{_nested_ddl(self.element)}>"


@dataclass(frozen=True)
class Map:
    """Keys are always strings: they come from JSON object keys."""

    value: DataType

    def ddl(self) -> str:
        return f"map<string,{_nested_ddl(self.value)}>"


@dataclass(frozen=True)
class Struct:
    fields: tuple[tuple[str, DataType], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)

    def ddl(self) -> str:
        """The field list, as a top-level schema: "`a` bigint, `b` string"."""
        return ", ".join(f"{_quote(n)} {_nested_ddl(t)}" for n, t in self.fields)

    def type_ddl(self) -> str:
        """The struct as a nested type: "struct<`a`:bigint,`b`:string>"."""
        return "struct<" + ",".join(f"{_quote(n)}:{_nested_ddl(t)}" for n, t in self.fields) + ">"

    def field_path(self, path: str) -> DataType | None:
        """The type at a dotted path through nested structs, or None if there is none."""
        found: DataType | None = self
        for part in path.split("."):
            if not isinstance(found, Struct):
                return None
            found = dict(found.fields).get(part)
        return found


DataType: TypeAlias = Primitive | Decimal | Array | Map | Struct

STRING = Primitive("string")


def _nested_ddl(t: DataType) -> str:
    return t.type_ddl() if isinstance(t, Struct) else t.ddl()


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def is_numeric(t: DataType | None) -> bool:
    return isinstance(t, Decimal) or (
        isinstance(t, Primitive) and (t.name in INTEGER_BITS or t.name in ("double", "float"))
    )


def check_non_negative(schema: Struct, paths: Iterable[str]) -> None:
    for path in paths:
        t = schema.field_path(path)
        if t is None:
            raise JobFileError(
                f"NON_NEGATIVE names {path!r}, which is not an event field: name a field of "
                "EVENT_SCHEMA, with dots for fields of nested structs (not arrays or maps)"
            )
        if not is_numeric(t):
            raise JobFileError(
                f"NON_NEGATIVE names {path!r}, a {_nested_ddl(t)} field: only numeric fields "
                "can be checked, remove it from NON_NEGATIVE"
            )


def from_flat(mapping: Mapping[str, str]) -> Struct:
    """Today's flat form: ``{"user_id": "long", "url": "string"}``."""
    if not mapping:
        raise JobFileError("EVENT_SCHEMA must be a non-empty dict of field -> type")
    fields: list[tuple[str, DataType]] = []
    seen: set[str] = set()
    for name, kind in mapping.items():
        if not isinstance(name, str) or not isinstance(kind, str) or kind not in FLAT_TYPES:
            raise JobFileError(
                f"EVENT_SCHEMA[{name!r}] = {kind!r}: types are {', '.join(FLAT_TYPES)}"
            )
        if not name:
            raise JobFileError("EVENT_SCHEMA has a field with an empty name: name every field")
        # Spark resolves column names ignoring case: two such names could not be told apart.
        if name.lower() in seen:
            raise JobFileError(f"EVENT_SCHEMA declares {name!r} twice (ignoring case): "
                               "keep one of them")
        seen.add(name.lower())
        fields.append((name, Primitive(FLAT_TYPES[kind])))
    return Struct(tuple(fields))


def parse_ddl(text: str) -> Struct:
    """Spark's DDL field list: "user_id bigint, tags array<string>, amount decimal(12,2)"."""
    if not text.strip():
        raise JobFileError(
            "EVENT_SCHEMA is empty: declare at least one field, e.g. 'user_id bigint, url string'"
        )
    return _DdlParser(text).schema()


class _DdlParser:
    """Recursive descent over the text; ``pos`` is the index of the next unread character."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def schema(self) -> Struct:
        fields = self.fields()
        if self.peek():
            self.fail(f"expected ',' or the end of the schema, found {self.found()}",
                      "separate fields with commas")
        return fields

    def fields(self) -> Struct:
        fields: list[tuple[str, DataType]] = []
        seen: set[str] = set()
        while True:
            start = self.skip()
            name = self.name()
            if name.lower() in seen:
                self.fail(f"duplicate field {name!r}", "field names must differ, ignoring case",
                          start)
            seen.add(name.lower())
            self.accept(":")  # Spark allows "a: T" and "a T" alike
            fields.append((name, self.type(f"field {name!r}")))
            self.modifiers()
            if not self.accept(","):
                return Struct(tuple(fields))

    def name(self) -> str:
        start = self.skip()
        if self.accept("`"):
            chars = []
            while True:
                end = self.text.find("`", self.pos)
                if end < 0:
                    self.fail("unclosed backquote", "end the field name with `", start)
                chars.append(self.text[self.pos:end])
                self.pos = end + 1
                if not self.text.startswith("`", self.pos):  # `` is a backquote in the name
                    break
                chars.append("`")
                self.pos += 1
            name = "".join(chars)
            if not name:
                self.fail("empty field name", "give the field a name", start)
            return name
        word = self.word()
        if not word:
            self.fail(f"expected a field name, found {self.found()}",
                      "write 'name type', with `backquotes` around names that are not "
                      "letters, digits and _")
        return word

    def type(self, what: str) -> DataType:
        start = self.skip()
        word = self.word().lower()
        if not word:
            self.fail(f"expected a type for {what}, found {self.found()}",
                      f"types are {_TYPE_LIST}")
        if word in _ALIASES:
            return Primitive(_ALIASES[word])
        if word in _DECIMALS:
            return self.decimal_args()
        if word == "array":
            self.expect("<", "write array<T>")
            element = self.type("the array elements")
            self.expect(">", "close array<T> with >")
            return Array(element)
        if word == "map":
            self.expect("<", "write map<string, T>")
            key_at = self.skip()
            if self.type("the map keys") != STRING:
                self.fail("map keys must be string",
                          "write map<string, T> (JSON object keys are strings)", key_at)
            self.expect(",", "write map<string, T>")
            value = self.type("the map values")
            self.expect(">", "close map<string, T> with >")
            return Map(value)
        if word == "struct":
            self.expect("<", "write struct<name: T, ...>")
            if self.peek() == ">":
                self.fail("empty struct<>", "declare at least one field in it")
            fields = self.fields()
            self.expect(">", "separate struct fields with commas and close struct<...> with >")
            return fields
        self.fail(f"unknown type {word!r}", f"types are {_TYPE_LIST}", start)

    def decimal_args(self) -> Decimal:
        if not self.accept("("):
            return Decimal(10, 0)  # Spark's default
        start = self.skip()
        precision = self.number()
        scale = self.number() if self.accept(",") else 0
        self.expect(")", "write decimal(p,s)")
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            self.fail(f"decimal precision {precision} is out of range",
                      "precision must be 1 to 38", start)
        if scale > precision:
            self.fail(f"decimal scale {scale} is more than its precision {precision}",
                      "write decimal(p,s) with s <= p", start)
        return Decimal(precision, scale)

    def modifiers(self) -> None:
        # NOT NULL changes nothing (every declared field is required) and comments are for
        # readers: both are accepted so that a schema copied from Spark reads as it is.
        while True:
            start = self.skip()
            word = self.word().lower()
            if word == "not":
                after = self.skip()
                if self.word().lower() != "null":
                    self.pos = after
                    self.fail(f"expected NULL after NOT, found {self.found()}",
                              "write NOT NULL or nothing")
            elif word == "comment":
                self.string_literal()
            else:
                self.pos = start
                return

    def string_literal(self) -> None:
        start = self.skip()
        quote = self.peek()
        if quote not in ("'", '"'):
            self.fail(f"expected a quoted comment, found {self.found()}",
                      "write COMMENT 'text'")
        i = self.pos + 1
        while i < len(self.text) and self.text[i] != quote:
            i += 2 if self.text[i] == "\\" else 1
        if i >= len(self.text):
            self.fail("unclosed comment", f"end the comment with {quote}", start)
        self.pos = i + 1

    def number(self) -> int:
        self.skip()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        if start == self.pos:
            self.fail(f"expected a number, found {self.found()}", "write decimal(p,s)")
        return int(self.text[start:self.pos])

    # Scanning ----------------------------------------------------------------------------

    def skip(self) -> int:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.pos

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos:self.pos + 1]

    def word(self) -> str:
        start = self.skip()
        while self.pos < len(self.text) and (
            self.text[self.pos].isascii() and
            (self.text[self.pos].isalnum() or self.text[self.pos] == "_")
        ):
            self.pos += 1
        return self.text[start:self.pos]

    def accept(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def expect(self, char: str, hint: str) -> None:
        if not self.accept(char):
            self.fail(f"expected {char!r}, found {self.found()}", hint)

    def found(self) -> str:
        """What is at the current position, for a message: a word, one character or the end."""
        self.skip()
        if self.pos >= len(self.text):
            return "the end of the schema"
        start = self.pos
        token = self.word() or self.text[self.pos]
        self.pos = start
        return repr(token)

    def fail(self, problem: str, hint: str, at: int | None = None) -> NoReturn:
        at = self.skip() if at is None else at
        raise JobFileError(f"{problem} in EVENT_SCHEMA at position {at + 1}: {hint}")
