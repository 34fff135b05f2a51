"""Where an alias sends its readers, and the rules for changing it (pure; no driver library).

A key is served by the candidate when its bucket (0..99, a hash of the key) is below
``percent``, otherwise by the primary: each key is served by exactly one version, and raising the
percentage only moves keys towards the candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.errors import StateError


@dataclass(frozen=True)
class Routing:
    alias: str
    primary: str | None = None
    candidate: str | None = None
    percent: int = 0
    rollback_to: str | None = None  # served entirely before the current cutover began

    @property
    def in_cutover(self) -> bool:
        return self.candidate is not None

    def serves(self) -> set[str]:
        return {v for v in (self.primary, self.candidate) if v is not None}

    def _start(self) -> str | None:
        """The version to return to if the cutover that this step belongs to is rolled back."""
        return self.rollback_to if self.in_cutover else self.primary

    def promote(self, version: str) -> Routing:
        if self.primary == version and not self.in_cutover:
            raise StateError(f"alias {self.alias} already serves {version} entirely")
        return Routing(self.alias, primary=version, candidate=None, percent=0,
                       rollback_to=self._start())

    def ab(self, version: str, percent: int) -> Routing:
        if not 1 <= percent <= 99:
            raise StateError(f"--percent must be 1..99, not {percent}: `kappa promote` sends "
                             "all keys, `kappa rollback` none")
        if self.primary is None:
            raise StateError(f"alias {self.alias} serves nothing yet: `kappa promote` a version "
                             "first")
        if version == self.primary:
            raise StateError(f"{version} already is the primary of alias {self.alias}: A/B "
                             "needs another version")
        if self.candidate not in (None, version):
            raise StateError(f"an A/B of {self.candidate} is in progress on alias {self.alias}: "
                             "`kappa promote` or `kappa rollback` it first")
        return Routing(self.alias, primary=self.primary, candidate=version, percent=percent,
                       rollback_to=self._start())

    def rollback(self) -> Routing:
        target = self._start() if self.in_cutover else self.rollback_to
        if target is None or (target == self.primary and not self.in_cutover):
            raise StateError(f"alias {self.alias} has nothing to roll back to")
        return replace(self, primary=target, candidate=None, percent=0, rollback_to=None)

    def served_fraction(self, version: str) -> int:
        """Percent of the key space this routing sends to ``version``."""
        if version == self.candidate:
            return self.percent
        if version == self.primary:
            return 100 - self.percent if self.in_cutover else 100
        return 0
