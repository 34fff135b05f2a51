"""The broker clients a long-running sampler keeps: one log-end probe and one timestamp reader,
reused across samples, so that a sample's cost does not include connecting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import Bounds, LogEndProbe
from orchestrator.kafka.timestamps import Position, TimestampReader


class LogClients:
    """Not thread-safe: one per sampling thread. A failed call leaves clients that reconnect."""

    def __init__(self, bootstrap: Kafka) -> None:
        self.bootstrap = bootstrap
        self._probe = LogEndProbe(bootstrap)
        self._timestamps = TimestampReader(bootstrap)

    def bounds(self, topics: Sequence[str]) -> Bounds:
        try:
            return self._probe.bounds(topics)
        except BaseException:
            self._probe.close()
            raise

    def timestamps(self, positions: Mapping[Position, int]) -> dict[Position, int]:
        return self._timestamps.read(positions)

    def close(self) -> None:
        try:
            self._probe.close()
        finally:
            self._timestamps.close()
