"""Outcome metrics: what readers of an alias do, declared once per job (pure).

A metric is a SQL query over the application's own tables that returns observations
``(key, value, observed_at)``, limited by a ``{since}`` placeholder, or PromQL over counters
that the application labels by the version that served each reader, each query with a
``{version}`` placeholder: ``promql`` is the sum of the observed values (conversions, for a
proportion), ``promql_count`` the number of observations, and, for a mean, ``promql_squares``
the sum of the squared values, since the test needs each arm's variance (a Summary's ``_sum``
and ``_count`` give no variance). It says which direction is better, whether it is a proportion (0/1
values) or a mean, and whether it decides the test or guards it: a guardrail must not be worse
than the baseline by more than its margin, relative to the baseline's mean."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from orchestrator.errors import StateError
from orchestrator.naming import validate_name

_WRITE = re.compile(r"\b(insert|update|delete|merge|create|drop|alter|truncate|grant|revoke|"
                    r"copy|call|do|vacuum|lock|comment|refresh)\b", re.IGNORECASE)


class Kind(enum.Enum):
    PROPORTION = "proportion"
    MEAN = "mean"


class Role(enum.Enum):
    DECISION = "decision"
    GUARDRAIL = "guardrail"


@dataclass(frozen=True)
class OutcomeMetric:
    name: str
    kind: Kind
    higher_is_better: bool
    role: Role
    margin: float = 0.0  # relative to the baseline's mean: how much worse still passes
    sql: str | None = None
    promql: str | None = None
    promql_count: str | None = None
    promql_squares: str | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, "metric name")
        where = f"metric {self.name}"
        if (self.sql is None) == (self.promql is None):
            raise StateError(f"{where}: give exactly one of sql and promql")
        if not 0 <= self.margin < 1:
            raise StateError(f"{where}: margin must be a fraction in [0, 1), like 0.02 for 2 %; "
                             f"got {self.margin}")
        if self.role == Role.GUARDRAIL and self.margin == 0:
            raise StateError(f"{where}: a guardrail needs a margin above 0 (how much worse than "
                             "the baseline still passes, like --margin 0.02)")
        if self.sql is not None:
            if "{since}" not in self.sql:
                raise StateError(f"{where}: its SQL must limit the rows it reads with a "
                                 "{since} placeholder, e.g. WHERE observed_at >= {since}")
            if ";" in self.sql.strip().rstrip(";") or _WRITE.search(_without_strings(self.sql)):
                raise StateError(f"{where}: its SQL must be one SELECT that changes nothing")
        if self.promql is None:
            if self.promql_count is not None or self.promql_squares is not None:
                raise StateError(f"{where}: --promql-count and --promql-squares go with "
                                 "--promql, not with --sql")
            return
        for flag, text in self.promql_queries().items():
            if "{version}" not in text:
                raise StateError(f"{where}: its {flag} must select the serving version with a "
                                 "{version} placeholder, e.g. "
                                 "clicks_total{served_by=\"{version}\"}")
        if self.promql_count is None:
            raise StateError(f"{where}: a PromQL metric also needs --promql-count, the number "
                             "of observations per version, e.g. "
                             "sum(reads_total{served_by=\"{version}\"})")
        if self.kind == Kind.MEAN and self.promql_squares is None:
            raise StateError(f"{where}: a PromQL mean needs --promql-squares, the sum of the "
                             "squared values per version (the test needs each arm's variance)")
        if self.kind == Kind.PROPORTION and self.promql_squares is not None:
            raise StateError(f"{where}: a proportion's values are 0/1, so its squares are its "
                             "sum: drop --promql-squares")

    def promql_queries(self) -> dict[str, str]:
        """The PromQL metric's queries by their flag: what each arm's figures come from."""
        given = {"--promql": self.promql, "--promql-count": self.promql_count,
                 "--promql-squares": self.promql_squares}
        return {flag: text for flag, text in given.items() if text is not None}

    def improvement(self, difference: float) -> float:
        """A difference (candidate minus baseline) in the direction that is better."""
        return difference if self.higher_is_better else -difference


def _without_strings(text: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", text)
