"""Which writer schemas a topic's records carry, from a sample of its log: a deploy checks that
the reader schema can read each (versions/registry_formats.py). The sample is a few records at
evenly spread places of every partition and its last records; a schema used only between them
is not seen, and its records, if the reader cannot read them, become dead letters."""

from __future__ import annotations

from orchestrator.formats.wire import FrameError, split
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import log_bounds
from orchestrator.kafka.reader import read_range

PLACES = 8  # windows per partition, its last records included
RECORDS_PER_PLACE = 16


def sampled_writer_ids(bootstrap: Kafka, topic: str, group_id: str
                       ) -> dict[int, tuple[int, int]]:
    """{writer schema id: (partition, offset) of the first sampled record that carries it}."""
    found: dict[int, tuple[int, int]] = {}
    for (_, partition), (start, end) in sorted(log_bounds(bootstrap, [topic]).items()):
        for first in places(start, end):
            last = min(end, first + RECORDS_PER_PLACE)
            for records in read_range(bootstrap, topic, partition, first, last, group_id):
                for offset, _ts, _key, value in records:
                    try:
                        schema_id = split(value or b"").schema_id
                    except FrameError:
                        continue  # not framed: a dead letter whatever the reader
                    found.setdefault(schema_id, (partition, offset))
    return found


def places(start: int, end: int) -> list[int]:
    """The first offsets of the windows sampled in [start, end): spread evenly, the last
    window ending at ``end``, none overlapping."""
    if end - start <= PLACES * RECORDS_PER_PLACE:
        return list(range(start, end, RECORDS_PER_PLACE))
    step = (end - start - RECORDS_PER_PLACE) / (PLACES - 1)
    return [start + round(i * step) for i in range(PLACES)]
