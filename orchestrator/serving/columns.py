"""Which versions one alias view can serve together, and with which columns (pure).

A view has one list of columns. Versions that agree on their key columns and on the type of
every column they share fit in one view: its columns are the primary's, in order, then each
column another version adds, in the order the versions were deployed; a branch without a
column gives NULL for it. Serving a candidate beside the primary (an A/B split) is allowed when
the candidate only adds columns. One that removes or retypes a column needs ``--breaking``:
the removed column reads NULL for its keys, and a retyped one is served as text by every
branch while both versions serve (a view's column has one type), then with the type of the
version that serves alone. Other key columns, or a key column of another type, never split:
a split routes by the key's text, which must be the same in every branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import ConflictError
from orchestrator.models import DeployedVersion

Shape = tuple[tuple[str, str], ...]  # (column, PostgreSQL type)


@dataclass(frozen=True)
class ColumnChange:
    """From one version's output columns to another's."""
    added: tuple[str, ...]
    removed: tuple[str, ...]
    retyped: tuple[tuple[str, str, str], ...]  # (column, type before, type after)
    keys_differ: bool  # other key columns, or a key column of another type

    @property
    def fits_one_view(self) -> bool:
        return not self.retyped and not self.keys_differ


def change(before: DeployedVersion, after: DeployedVersion) -> ColumnChange:
    old, new = dict(before.spec.output_schema), dict(after.spec.output_schema)
    return ColumnChange(
        added=tuple(c for c in new if c not in old),
        removed=tuple(c for c in old if c not in new),
        retyped=tuple((c, old[c], new[c]) for c in new if c in old and old[c] != new[c]),
        # A key's text is what the split hashes: 7 and '007', or 1e+15 as a double, would
        # bucket one key differently in the two branches.
        keys_differ=before.spec.key_columns != after.spec.key_columns or any(
            old.get(k) != new.get(k) for k in after.spec.key_columns))


def fits(primary: DeployedVersion, other: DeployedVersion) -> bool:
    return change(primary, other).fits_one_view


def check_split(primary: DeployedVersion, candidate: DeployedVersion, *, breaking: bool
                ) -> None:
    """Refuse in one line an A/B split that would give readers rows they cannot read alike."""
    c = change(primary, candidate)
    pair = f"{candidate.job} {candidate.version} against {primary.version}"
    if c.keys_differ:
        def keys(v: DeployedVersion) -> str:
            kinds = dict(v.spec.output_schema)
            return ", ".join(f"{k} {kinds.get(k, '?')}" for k in v.spec.key_columns)
        raise ConflictError(f"{pair}: other key columns ({keys(candidate)} instead of "
                            f"{keys(primary)}), so no split can route by key; `kappa "
                            "promote` it instead")
    if c.retyped and not breaking:
        retyped = ", ".join(f"{col} {was} -> {now}" for col, was, now in c.retyped)
        raise ConflictError(f"{pair}: retyped column(s) {retyped}; add --breaking to split "
                            "anyway (readers get them as text while both serve), or `kappa "
                            "promote` it")
    if c.removed and not breaking:
        raise ConflictError(f"{pair}: it removes column(s) {', '.join(c.removed)}, which its "
                            "keys would read as NULL; add --breaking to split anyway, or "
                            "`kappa promote` it")


def shape(versions: Sequence[DeployedVersion]) -> Shape:
    """The view's columns; ``versions[0]`` is the primary. A column whose versions disagree on
    its type (in a ``--breaking`` split) is text."""
    found = dict(versions[0].spec.output_schema)
    for v in versions[1:]:
        for column, kind in v.spec.output_schema:
            if found.setdefault(column, kind) != kind:
                found[column] = "text"
    return tuple(found.items())
