"""What every format checks: the NON_NEGATIVE fields and a decimal's fit after decoding, and
the one-line refusal of a type that has no Spark type at deploy."""

from __future__ import annotations

import decimal
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.errors import JobFileError
from orchestrator.schema import Decimal

# Quantizing under this context fails, rather than rounds, a value that Spark could not hold.
_EXACT = decimal.Context(prec=38, traps=[decimal.Inexact, decimal.InvalidOperation])

NonNegative = tuple[tuple[int, tuple[str, ...], str], ...]


def non_negative_paths(fields: Sequence[str], paths: Sequence[str]) -> NonNegative:
    """(top-level index, keys into nested structs, the dotted path) of each path."""
    return tuple((list(fields).index(path.split(".")[0]), tuple(path.split(".")[1:]), path)
                 for path in paths)


def first_negative(values: Sequence[Any], paths: NonNegative) -> str | None:
    """The dead letter's reason if a NON_NEGATIVE field is below zero (a null one is not)."""
    for index, keys, path in paths:
        v: Any = values[index]
        for key in keys:
            v = None if v is None else v[key]
        if v is not None and v < 0:
            return f"field {path} is negative"
    return None


Fit = Callable[[decimal.Decimal | int | float | str], decimal.Decimal | None]


def decimal_fitter(t: Decimal) -> Fit:
    """A function giving a decimal quantized to t's scale, or None if t cannot hold it exactly
    (more fractional digits than the scale, trailing zeros aside, or too many whole digits)."""
    quantum = decimal.Decimal(1).scaleb(-t.scale)
    max_whole = t.precision - t.scale

    def fit(v: decimal.Decimal | int | float | str) -> decimal.Decimal | None:
        try:
            d = decimal.Decimal(v).quantize(quantum, context=_EXACT)
        except decimal.DecimalException:  # Inexact, or too many digits for any decimal(38, s)
            return None
        return d if d.adjusted() < max_whole else None
    return fit


def no_spark_type(where: str, path: str, whole: str, what: Any, what_to_do: str) -> JobFileError:
    """The deploy's one-line refusal of a field (or the whole record or message) whose type
    has no Spark type."""
    return JobFileError(f"{where}: field {path or f'(the {whole})'} is {what}, which has no "
                        f"Spark type here: {what_to_do}")
