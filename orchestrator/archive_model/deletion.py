"""A topic that a client deleted on the embedded stack's broker, as its ack ledger noted it.

The restore ends the archive's lineages of that topic that the deletion removed, so that a
deletion no archiver pass saw is not undone. Which ones: the lineages whose topic id the ack
proxy read from the broker just before it passed the deletion on. Only where a deletion of
the topic was noted without an id (an older ledger; the broker did not answer in time) does
the restore fall back to time: the lineages it met before the deletion.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Deletion:
    at_ms: int  # when a client last deleted the topic (the proxy's clock, epoch milliseconds)
    topic_ids: frozenset[str] = frozenset()  # the ids of the topics of that name it deleted
    unidentified: bool = True  # some deletion of the topic was noted without its id

    def and_then(self, later: Deletion) -> Deletion:
        """This deletion and a later one of the same topic name."""
        return Deletion(max(self.at_ms, later.at_ms), self.topic_ids | later.topic_ids,
                        self.unidentified or later.unidentified)

    @classmethod
    def noted(cls, at_ms: int, topic_id: str | None) -> Deletion:
        return cls(at_ms, frozenset({topic_id}) if topic_id else frozenset(), not topic_id)

    @property
    def by_id(self) -> bool:
        """Whether the lineages it ended are known by their ids, with no clock involved."""
        return bool(self.topic_ids) and not self.unidentified
