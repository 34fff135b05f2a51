"""The deploy's compatibility check (#62): whether every record of a writer schema can be read
with the reader schema, decided from the schemas alone, held to fastavro's own resolution of
generated records (readers that drop, add, promote and break fields)."""

from __future__ import annotations

import copy
import io
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.formats.avro_compat import unreadable

from .test_avro_events import _WRITERS, _encoded, _reader_of, _record

_SETTINGS = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


def _reads(writer: Any, reader: Any, record: Any) -> bool:
    body = io.BytesIO(_encoded(writer, record))
    try:
        fastavro.schemaless_reader(body, fastavro.parse_schema(writer),
                                   fastavro.parse_schema(reader))
    except SchemaResolutionError:
        return False
    return True


_MUTATIONS = ("none", "required", "narrowed", "retyped", "renamed", "enum")


def _mutated(reader: dict[str, Any], how: str, at: int) -> dict[str, Any]:
    """The reader broken one way (or not): what a careless edit of a job's schema does."""
    reader = copy.deepcopy(reader)
    fields = reader["fields"]
    written = [f for f in fields if "default" not in f]  # (a default fits its type)
    field = written[at % len(written)] if written else {"type": None}
    if how == "required":
        fields.append({"name": "required_new", "type": "long"})
    elif how == "narrowed" and field["type"] in ("long", "double"):
        field["type"] = {"long": "int", "double": "float"}[field["type"]]
    elif how == "retyped" and written:
        field["type"] = "boolean" if field["type"] != "boolean" else "string"
    elif how == "renamed":
        reader["name"] += "Other"
    elif how == "enum":
        for f in fields:
            if isinstance(f["type"], dict) and f["type"].get("type") == "enum" and \
                    len(f["type"]["symbols"]) > 1:
                f["type"]["symbols"] = f["type"]["symbols"][1:]
                break
    return reader


@_SETTINGS
@given(st.data(), _WRITERS, st.lists(st.booleans(), max_size=5), st.integers(0, 2),
       st.sampled_from(_MUTATIONS), st.integers(0, 9))
def test_the_check_agrees_with_fastavros_resolution_of_every_record(
        data: st.DataObject, writer: tuple[Any, Any], dropped: list[bool], added: int,
        how: str, at: int) -> None:
    schema, records = writer
    reader = _mutated(_reader_of(schema, dropped, added), how, at)
    reason = unreadable(schema, reader)
    drawn = data.draw(st.lists(records, min_size=1, max_size=4))
    read = [_reads(schema, reader, r) for r in drawn]
    if reason is None:  # compatible: every record reads
        assert all(read), (reader, drawn)
    if not all(read):  # a record that fails shows the schemas incompatible
        assert reason is not None
    if how in ("required", "renamed"):  # every record fails these, and the check says so
        assert reason is not None and not any(read)
    if how == "none":
        assert reason is None


def test_each_reason_names_the_field() -> None:
    address = _record("Address", ("city", "string"))
    writer = _record("PageView", ("user_id", "int"), ("home", address),
                     ("tags", {"type": "array", "items": "string"}),
                     ("color", {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]}),
                     ("maybe", ["null", "long"]), namespace="shop")
    assert unreadable(writer, writer) is None
    promoted = _record("PageView", ("user_id", "double"), ("home", address), namespace="other")
    assert unreadable(writer, promoted) is None  # names match unqualified; int reads as double
    cases = [
        (_record("PageView", ("user_id", "int"), ("added", "long")),
         "field added: the writer has no such field, and the reader gives it no default"),
        (_record("PageView", ("home", _record("Address", ("city", "long")))),
         "field home.city: the writer's string cannot be read as long"),
        (_record("PageView", ("tags", {"type": "array", "items": "int"})),
         "field tags[]: the writer's string cannot be read as int"),
        (_record("PageView", ("color", {"type": "enum", "name": "Color",
                                        "symbols": ["RED"]})),
         "field color: the writer's enum symbol BLUE is not one of the reader's, which gives no "
         "default"),
        (_record("PageView", ("maybe", "long")),
         "field maybe: the writer's null cannot be read as long"),
        (_record("PageView", ("home", ["null", "string"])),
         "field home: the writer's record shop.Address matches no branch of the reader's union "
         "of null | string"),
        (_record("PageView", ("home", {"type": "fixed", "name": "Address", "size": 4})),
         "field home: the writer's record shop.Address cannot be read as fixed Address"),
        (_record("View", ("user_id", "int")),
         "the record: the writer's record shop.PageView cannot be read as record View"),
    ]
    for reader, reason in cases:
        assert unreadable(writer, reader) == reason
    # What the reader forgives: a default for a missing field or symbol, an alias, a union.
    forgiving = _record(
        "PageView", ("uid", "long"), ("added", ["null", "long"]),
        ("color", {"type": "enum", "name": "Color", "symbols": ["RED"], "default": "RED"}),
        ("maybe", ["null", "double"]), aliases=["Old"])
    forgiving["fields"][0]["aliases"] = ["user_id"]
    forgiving["fields"][1]["default"] = None
    assert unreadable(writer, forgiving) is None


def test_fixed_types_need_the_same_size() -> None:
    four = _record("R", ("id", {"type": "fixed", "name": "Id", "size": 4}))
    eight = _record("R", ("id", {"type": "fixed", "name": "Id", "size": 8}))
    assert unreadable(four, four) is None
    assert unreadable(four, eight) == \
        "field id: the writer's fixed Id cannot be read as fixed Id"
    assert not _reads(four, eight, {"id": b"abcd"})


def test_a_recursive_type_is_checked_once() -> None:
    node = _record("Node", ("value", "long"), ("next", ["null", "Node"]))
    assert unreadable(node, node) is None
    narrower = _record("Node", ("value", "int"), ("next", ["null", "Node"]))
    with pytest.raises(AssertionError):  # (a long does not read as an int)
        assert unreadable(node, narrower) is None
