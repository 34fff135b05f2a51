"""Reads Spark's offset log, the write-ahead record of each micro-batch's source offsets.

Spark writes ``<checkpoint>/offsets/<batch id>`` before it runs the batch, so inside
``foreachBatch`` the batch's end offsets are known exactly, and the previous entry gives its start.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.models import Offsets


def batch_end_offsets(checkpoint_dir: str | Path, batch_id: int) -> Offsets | None:
    path = Path(checkpoint_dir) / "offsets" / str(batch_id)
    if not path.is_file():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    # Line 0 is the log version, line 1 the batch metadata, then one line per source: a job
    # reads each topic through its own source, and each source's offsets name their topic.
    offsets: Offsets = {}
    for line in lines[2:]:
        if line.strip() == "-":  # a source with no offset yet
            continue
        for topic, partitions in json.loads(line).items():
            offsets.setdefault(topic, {}).update({str(p): int(o) for p, o in partitions.items()})
    return offsets
