"""Decoded segments' domain: a *decoding* is what decides, for one raw record, its row or its
dead letter; a decoded segment is one raw segment's records, decoded once and kept typed.

A topic is replayed once per version, and between two versions the transform changes far more
often than the event schema: every version whose decoding is the same reads the same decoded
segments, with no parse. No driver library here: the fingerprint, the names and the manifest
rows are plain Python, so that the archiver, the read path and the status agree on them.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.archive_model.segments import ArchiveError, Lineage, segment_name
from orchestrator.event_formats import format_from_json, format_to_json
from orchestrator.models import EventFormat, TopicInput

# The modules whose code decides, for one raw record, its row or its dead letter (a parser's
# rule, an error's words, a column's type). Their code is part of every decoding's fingerprint:
# a change to it gives new decodings, decoded anew, and segments of the older code are never
# read for them. (A number bumped by hand was once not bumped where it had to be.)
PARSER_MODULES = (
    "orchestrator/archive/decoder.py",
    "orchestrator/formats/avro_events.py",
    "orchestrator/formats/avro_types.py",
    "orchestrator/formats/checks.py",
    "orchestrator/formats/protobuf_events.py",
    "orchestrator/formats/protobuf_types.py",
    "orchestrator/formats/wire.py",
    "orchestrator/parsing.py",
    "orchestrator/record_parsers.py",
    "orchestrator/schema.py",
    "orchestrator/spark/read/arrow.py",
    "orchestrator/spark/read/arrow_events.py",
    "orchestrator/spark/read/batch_builder.py",
    "orchestrator/spark/read/columnar.py",
)


def parser_digest(sources: Mapping[str, str]) -> str:
    """16 hex digits of SHA-256 over each module's name and tokens, comments and blank lines left
    out: rewording a comment decodes nothing again; any change to the code does."""
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0")
        for token in tokenize.generate_tokens(io.StringIO(sources[name]).readline):
            if token.type not in (tokenize.COMMENT, tokenize.NL):
                digest.update(f"{token.type}:{token.string}\0".encode())
    return digest.hexdigest()[:16]


@functools.cache
def decoder_digest() -> str:
    """The parser's digest, from the installed package's own files (read once per process)."""
    root = Path(__file__).resolve().parents[2]
    return parser_digest({module: (root / module).read_text() for module in PARSER_MODULES})


DECODED_DIRECTORY = "decoded"
# The Kafka metadata a decoding keeps beside the fields. Both always, for now: a version's
# pruned columns are known only once its driver plans its query, and the archiver decodes
# before that. A narrower decoding is another fingerprint, so this can change without harm.
METADATA = ("kafka_key", "kafka_headers")


@dataclass(frozen=True)
class Decoding:
    """The event schema, its validation rules and the metadata kept: equal decodings give
    equal rows and dead letters for every record."""

    schema: str  # canonical Spark DDL (orchestrator.schema)
    non_negative: tuple[str, ...]
    tombstones: str  # TOMBSTONE_RULES
    metadata: tuple[str, ...] = METADATA
    decoder: str = field(default_factory=decoder_digest)  # the parser's code
    # How the values are encoded, with the reader schema (Avro, Protobuf) they are read with.
    format: EventFormat = field(default_factory=EventFormat)

    @classmethod
    def of(cls, source: TopicInput) -> Decoding:
        return cls(source.schema, tuple(sorted(source.non_negative)), source.tombstones,
                   format=source.format)

    def to_json(self) -> dict[str, object]:
        # A JSON decoding's keeps the words it had before formats, so its fingerprint too.
        fmt = format_to_json(self.format)
        return {"schema": self.schema, "non_negative": list(self.non_negative),
                "tombstones": self.tombstones, "metadata": list(self.metadata),
                "decoder": self.decoder, **({} if fmt is None else {"format": fmt})}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Decoding:
        non_negative, metadata = data["non_negative"], data["metadata"]
        assert isinstance(non_negative, list) and isinstance(metadata, list)
        # A decoding recorded before the digest holds the number kept by hand (1): never current.
        fmt = data.get("format")
        assert fmt is None or isinstance(fmt, dict)
        return cls(str(data["schema"]), tuple(map(str, non_negative)), str(data["tombstones"]),
                   tuple(map(str, metadata)), str(data["decoder"]), format_from_json(fmt))

    @property
    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON: a directory name and a key."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DecodedSegment:
    """A manifest row: the raw segment [first_offset, end_offset) of one partition of one
    lineage, decoded under ``decoding``. Its gaps are the raw segment's: every offset is still
    a row, a dead letter or a gap."""

    decoding: str  # fingerprint
    lineage: Lineage
    partition: int
    first_offset: int
    end_offset: int
    rows: int
    dead_letters: int
    bytes: int
    checksum: str  # SHA-256 of the file
    raw_checksum: str  # the raw segment's manifest checksum: what it was decoded from
    path: str  # relative to the archive root

    def __post_init__(self) -> None:
        if self.rows < 0 or self.dead_letters < 0 or \
                self.rows + self.dead_letters > self.end_offset - self.first_offset:
            raise ArchiveError(
                f"decoded segment {self.path}: {self.rows} rows and {self.dead_letters} dead "
                f"letters do not fit the {self.end_offset - self.first_offset} offsets of "
                f"[{self.first_offset}, {self.end_offset})")

    @property
    def records(self) -> int:
        return self.rows + self.dead_letters


def decoded_directory(fingerprint: str, lineage: Lineage) -> str:
    """One decoding's segments of one lineage: pruning them removes this one tree."""
    return f"{DECODED_DIRECTORY}/{fingerprint}/{lineage.topic}/{lineage.folder}"


def decoded_path(fingerprint: str, lineage: Lineage, partition: int, first_offset: int,
                 end_offset: int) -> str:
    return (f"{decoded_directory(fingerprint, lineage)}/p{partition}/"
            f"{segment_name(first_offset, end_offset)}")


@dataclass(frozen=True)
class DecodingProgress:
    """What `kappa archive status` shows of one decoding of one lineage."""

    decoding: str
    root: Lineage
    in_use: bool  # a version that is not retired reads this lineage under this decoding
    raw_segments: int
    decoded_segments: int
    rows: int
    dead_letters: int
    bytes: int

    @property
    def topic(self) -> str:
        return self.root.topic

    @property
    def lineage(self) -> str:
        return f"{self.root.cluster_id}-{self.root.topic_id}"

    @property
    def directory(self) -> str:
        return decoded_directory(self.decoding, self.root)

    @property
    def pending(self) -> int:
        return max(0, self.raw_segments - self.decoded_segments)
