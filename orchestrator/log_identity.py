"""Which log a version read: the broker's cluster id and each topic's id.

Offsets alone cannot tell one log from another: a volatile broker that restarted, or a topic
deleted and created again, can hold as many offsets as the log a version read, or more. The
cluster id changes when the bootstrap address reaches another cluster (the embedded memory
broker takes a new one at every start); a topic's id changes when the topic is recreated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What brokers without topic ids (before KIP-516) answer.
_NO_TOPIC_ID = frozenset({"", "AAAAAAAAAAAAAAAAAAAAAA"})


@dataclass(frozen=True)
class LogIdentity:
    cluster_id: str | None
    # topic -> id; None: the broker gives no topic ids
    topics: Mapping[str, str | None] = field(default_factory=dict)
    missing: tuple[str, ...] = ()  # topics asked about that the broker does not know

    def to_json(self) -> dict[str, Any]:
        return {"cluster_id": self.cluster_id, "topics": dict(self.topics),
                "missing": list(self.missing)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> LogIdentity | None:
        if not data:
            return None
        return cls(cluster_id=data.get("cluster_id"), topics=dict(data.get("topics") or {}),
                   missing=tuple(data.get("missing") or ()))

    def with_topics(self, other: LogIdentity) -> LogIdentity:
        """This identity with ``other``'s topic ids added or replaced (a new topic read)."""
        return LogIdentity(self.cluster_id, {**self.topics, **other.topics})


def topic_id_text(raw: object) -> str | None:
    text = str(raw) if raw is not None else ""
    return None if text in _NO_TOPIC_ID else text


@dataclass(frozen=True)
class LogChange:
    """How the log now differs from the one a version read."""

    kind: str  # "cluster", "recreated" or "gone"
    was: str
    now: str | None
    topic: str | None = None

    def describe(self) -> str:
        if self.kind == "cluster":
            return (f"the broker is another cluster now (id {self.now}, was {self.was}): a "
                    "broker that keeps its log in memory restarted and lost it, or the bootstrap "
                    "address reaches another cluster")
        if self.kind == "recreated":
            return (f"topic {self.topic} was deleted and recreated (topic id {self.now}, was "
                    f"{self.was})")
        return f"topic {self.topic} no longer exists"


def changes(recorded: LogIdentity, current: LogIdentity, topics: Sequence[str]) -> list[LogChange]:
    """Where ``current`` is not the log ``recorded`` describes, for the topics a version reads.
    Ids that either side lacks (a broker without them) are not evidence of a change."""
    if recorded.cluster_id and current.cluster_id and recorded.cluster_id != current.cluster_id:
        return [LogChange("cluster", recorded.cluster_id, current.cluster_id)]
    found = []
    for topic in topics:
        if topic not in recorded.topics:
            continue  # never recorded: nothing to compare with
        was = recorded.topics[topic] or "(no id)"
        if topic in current.missing:
            found.append(LogChange("gone", was, None, topic))
            continue
        now = current.topics.get(topic)
        if recorded.topics[topic] is not None and now is not None and now != was:
            found.append(LogChange("recreated", was, now, topic))
    return found


def replaced(recorded: LogIdentity, current: LogIdentity, topics: Sequence[str]
             ) -> list[LogChange]:
    """The changes that are conclusive at once: another cluster, another topic id. A topic
    missing for a moment may be a broker still starting; the bounds wait that out."""
    return [c for c in changes(recorded, current, topics) if c.kind != "gone"]


GONE_PREFIX = "the log this version read is gone: "


def log_gone_reason(found: Sequence[LogChange], job: str, version: str) -> str:
    text = (GONE_PREFIX + "; ".join(c.describe() for c in found)
            + ". Its output describes that log; deploy the job under a new VERSION to replay "
            "the log as it is now")
    if any(c.kind == "gone" for c in found):
        return text
    return (text + f" (for a batch job, `kappa restart --allow-gap {job} {version}` goes on "
            "from the new log's start, on top of the old output)")


_LOST = " were lost with the broker before the archive held them"


def lost_records_reason(ranges: str) -> str:
    """Why a version that read records a crash took from a volatile broker fails for good: its
    output counts them, and the restored log will give their offsets to other records."""
    return (f"{GONE_PREFIX}offsets {ranges}{_LOST}, and this version had read them. Deploy the "
            "job under a new VERSION to replay the log as it is now")


def read_lost_records(reason: str | None) -> bool:
    return is_log_gone(reason) and _LOST in str(reason)


def is_log_gone(reason: str | None) -> bool:
    """Whether a run's reason says its log is gone (a restart cannot help it)."""
    return bool(reason) and str(reason).startswith(GONE_PREFIX)


__all__ = ["GONE_PREFIX", "LogChange", "LogIdentity", "changes", "is_log_gone",
           "log_gone_reason", "lost_records_reason", "read_lost_records", "replaced",
           "topic_id_text"]
