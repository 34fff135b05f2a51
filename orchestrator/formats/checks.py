"""What every format's parser checks after decoding: the NON_NEGATIVE fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NonNegative = tuple[tuple[int, tuple[str, ...], str], ...]


def non_negative_paths(fields: Sequence[str], paths: Sequence[str]) -> NonNegative:
    """(top-level index, keys into nested structs, the dotted path) of each path."""
    return tuple((list(fields).index(path.split(".")[0]), tuple(path.split(".")[1:]), path)
                 for path in paths)


def first_negative(values: tuple[Any, ...], paths: NonNegative) -> str | None:
    """The dead letter's reason if a NON_NEGATIVE field is below zero (a null one is not)."""
    for index, keys, path in paths:
        v: Any = values[index]
        for key in keys:
            v = None if v is None else v[key]
        if v is not None and v < 0:
            return f"field {path} is negative"
    return None
