"""The broker clients a long-running sampler keeps: one log-end probe, one timestamp reader and
one admin client, reused across samples, so that a sample's cost does not include connecting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient

from orchestrator.kafka.admin import admin_client
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import Bounds, LogEndProbe
from orchestrator.kafka.timestamps import Position, TimestampReader


class LogClients:
    """Not thread-safe: one per sampling thread. A failed call leaves clients that reconnect."""

    def __init__(self, bootstrap: Kafka) -> None:
        self.bootstrap = bootstrap
        self._probe = LogEndProbe(bootstrap)
        self._timestamps = TimestampReader(bootstrap)
        self._admin: AdminClient | None = None

    def bounds(self, topics: Sequence[str]) -> Bounds:
        try:
            return self._probe.bounds(topics)
        except BaseException:
            self._probe.close()
            raise

    @property
    def admin(self) -> AdminClient:
        """Reconnects by itself after an outage, so it is kept whatever a call raised."""
        if self._admin is None:
            self._admin = admin_client(self.bootstrap)
        return self._admin

    def timestamps(self, positions: Mapping[Position, int]) -> dict[Position, int]:
        return self._timestamps.read(positions)

    def close(self) -> None:
        try:
            self._probe.close()
        finally:
            self._timestamps.close()
            self._admin = None  # an AdminClient has no close(): dropped, its threads end
