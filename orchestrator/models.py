"""Frozen domain objects. No driver library is imported here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from orchestrator.log_identity import LogIdentity
from orchestrator.states import Expected, RunState

# Offsets as Kafka tools show them: {"<topic>": {"<partition>": next offset to read}}
Offsets = dict[str, dict[str, int]]

OUTPUT_TYPES = (
    "text", "bigint", "integer", "double precision", "boolean", "numeric", "timestamptz",
    "jsonb",
)
MERGE_RULES = ("sum", "min", "max", "replace")
MODES = ("batch", "stream")  # per-batch transform and merge | a Structured Streaming query
OUTPUT_MODES = ("upsert", "append")
TOMBSTONE_RULES = ("dead_letter", "pass")
EVENT_FORMATS = ("json", "avro", "protobuf")
# Columns every events DataFrame carries beside the declared fields.
KAFKA_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp",
                 "kafka_key", "kafka_headers")
# Columns a decoded segment holds beside the fields: whether the record is a dead letter, and a
# dead letter's reason, and its key and value as the log held them.
DEAD, DEAD_REASON, DEAD_KEY, DEAD_VALUE = "_dead", "_dead_reason", "_dead_key", "_dead_value"
# The one list of names that an event field cannot take (compared case-insensitively, as Spark
# resolves columns): a field of such a name would make the decode, or every read of its
# segments, fail on a duplicate column.
RESERVED_FIELDS = (*KAFKA_COLUMNS, DEAD, DEAD_REASON, DEAD_KEY, DEAD_VALUE)
DELETE_COLUMN = "_delete"  # an upsert output row whose _delete is true deletes its key


@dataclass(frozen=True)
class EventFormat:
    """How a topic's record values are encoded (orchestrator.event_formats)."""

    kind: str = "json"  # in EVENT_FORMATS
    # avro: the reader schema, canonical JSON ("" until a registry subject is pinned);
    # protobuf: the descriptor set, base64
    reader: str = ""
    message: str = ""  # protobuf: the message's full name
    # where the reader came from: a file of the job, "inline", or "subject@version"
    source: str = ""


@dataclass(frozen=True)
class TopicInput:
    """One topic a job reads, with the schema its events are validated against."""

    topic: str
    # canonical Spark DDL of the event fields (orchestrator.schema); "" until the format's
    # registry schema is pinned at deploy
    schema: str
    non_negative: tuple[str, ...]  # dotted field paths
    tombstones: str  # in TOMBSTONE_RULES: a null value is a dead letter, or a row with null fields
    format: EventFormat = EventFormat()


@dataclass(frozen=True)
class JobSpec:
    """What a job file declares, read without executing it."""

    name: str
    version: str
    inputs: tuple[TopicInput, ...]  # in TOPICS order
    key_columns: tuple[str, ...]
    output_schema: tuple[tuple[str, str], ...]  # (column, PostgreSQL type in OUTPUT_TYPES)
    merge: tuple[tuple[str, str], ...]  # (value column, rule in MERGE_RULES)
    source: str = field(repr=False)  # the entry file's source
    fingerprint: str
    path: str
    # (name, SQL returning one boolean); {this} and {other} name the two versions' tables
    guardrails: tuple[tuple[str, str], ...] = ()
    mode: str = "batch"  # in MODES
    output_mode: str = "upsert"  # in OUTPUT_MODES
    per_topic: bool = False  # EVENT_SCHEMAS: transform gets {topic: DataFrame}
    # Every file of the deployed code, (path relative to the job, bytes); the entry file is
    # ENTRY_FILE for a directory job, or the one file of a single-file job.
    files: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    entry: str = ""

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(i.topic for i in self.inputs)

    @property
    def unpinned(self) -> tuple[str, ...]:
        """The topics whose reader schema is a registry subject not fetched yet."""
        return tuple(i.topic for i in self.inputs if i.format.kind == "avro"
                     and not i.format.reader)

    @property
    def output_columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.output_schema)


@dataclass(frozen=True)
class PartitionOffsets:
    topic: str
    partition: int
    log_start: int
    log_end: int
    processed: int | None  # next offset to read, None before the first batch

    @property
    def lag_records(self) -> int:
        done = self.log_start if self.processed is None else self.processed
        return max(0, self.log_end - max(done, self.log_start))


@dataclass(frozen=True)
class VersionStatus:
    job: str
    version: str
    state: RunState
    pid: int | None
    app_id: str | None
    output_table: str
    dead_letter_table: str
    rows: int | None
    dead_letters: int | None
    processed_offsets: Offsets
    lag_records: int | None
    heartbeat_age_s: float | None
    reason: str | None
    attempt: int
    log_path: str | None
    started_at: datetime | None
    log_tail: tuple[str, ...] = ()
    # The log it read is gone: its processed offsets describe that log, not the one there now.
    log_gone: bool = False
    # (segments decoded under its decodings, segments archived) of the log it reads; None:
    # unknown, or the archive holds nothing of it. Its replay reads the raw ones meanwhile.
    decoded: tuple[int, int] | None = None

    def caught_up(self, max_lag: int = 0) -> bool:
        """Replayed to the log end, give or take ``max_lag`` records."""
        return self.state in (RunState.CAUGHT_UP, RunState.LIVE) and \
            self.lag_records is not None and self.lag_records <= max_lag

    def to_json(self) -> dict[str, object]:
        return {
            "job": self.job,
            "version": self.version,
            "state": self.state.value,
            "pid": self.pid,
            "app_id": self.app_id,
            "output_table": self.output_table,
            "dead_letter_table": self.dead_letter_table,
            "rows": self.rows,
            "dead_letters": self.dead_letters,
            "processed_offsets": self.processed_offsets,
            "lag_records": self.lag_records,
            "heartbeat_age_s": self.heartbeat_age_s,
            "reason": self.reason,
            "attempt": self.attempt,
            "log_path": self.log_path,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "log_tail": list(self.log_tail),
            "log_gone": self.log_gone,
            "decoded_segments": None if self.decoded is None else self.decoded[0],
            "archived_segments": None if self.decoded is None else self.decoded[1],
        }


@dataclass(frozen=True)
class DeployedVersion:
    id: int
    spec: JobSpec
    output_table: str
    dead_letter_table: str
    checkpoint_dir: str
    consumer_group: str
    log_start: Offsets
    created_at: datetime
    log_identity: LogIdentity | None = None  # None: deployed before it was recorded

    @property
    def job(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version


@dataclass(frozen=True)
class RunRecord:
    version_id: int
    state: RunState
    attempt: int
    pid: int | None
    pid_started: float | None  # process create time, to tell a reused PID from our driver
    host: str | None
    app_id: str | None
    log_path: str | None
    reason: str | None
    started_at: datetime | None
    heartbeat_at: datetime | None
    caught_up_at: datetime | None
    busy_since: datetime | None = None  # when the driver's current batch began
    priority: int = 0  # its place in the replay queue: higher first, then queued_at
    queued_at: datetime | None = None  # when it joined the replay queue (None: never queued)

    def as_seen(self) -> Expected:
        """A state change decided on this reading of the run applies only to the run as read."""
        return Expected.seen(self.attempt, self.state)


@dataclass(frozen=True)
class ReplayHold:
    """Live first's hold on the replay queue: while it lasts, no catch-up starts."""
    reason: str  # which live version is how far behind
    since: datetime
    since_last_pause_s: float | None  # None: this hold has paused no catch-up yet


@dataclass(frozen=True)
class QueueKeeper:
    """A process that hands out replay slots at a steady interval: `kappa agent`, or the
    embedded stack's queue keeper."""
    keeper: str  # what it is and where: "kappa agent on HOST (pid N)"
    every_s: float  # how often it looks
    looked_s_ago: float  # since its last look, by the catalog's clock

    @property
    def keeping(self) -> bool:
        """Whether it still looks: a few intervals may pass unseen (a slow look, a short
        outage), not more."""
        return self.looked_s_ago <= max(KEEPER_MISSED_LOOKS * self.every_s, KEEPER_GRACE_S)


# A keeper counts as gone once this many of its intervals, or this many seconds, passed with
# no look.
KEEPER_MISSED_LOOKS, KEEPER_GRACE_S = 3, 15.0


@dataclass(frozen=True)
class AliasState:
    job: str
    alias: str
    primary: str | None
    candidate: str | None
    percent: int
    switches: int  # switches recorded in the alias's history
    rollback_to: str | None = None  # what `rollback` would serve

    def share(self, version: str) -> int:
        """Percent of the keys the alias sends to ``version``."""
        from orchestrator.routing import Routing

        routing = Routing(self.alias, self.primary, self.candidate, self.percent)
        return routing.served_fraction(version)


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    log_start: int
    log_end: int
    processed: int  # next offset to read
    lag_records: int
    lag_seconds: float | None  # age of the oldest unprocessed record; 0 when caught up, None
    # when unknown (no timestamp could be read)

    def to_json(self) -> dict[str, object]:
        return {"topic": self.topic, "partition": self.partition, "log_start": self.log_start,
                "log_end": self.log_end, "processed": self.processed,
                "lag_records": self.lag_records, "lag_seconds": self.lag_seconds}


@dataclass(frozen=True)
class VersionLag:
    job: str
    version: str
    state: str  # a LagState value
    run_state: RunState
    lag_records: int | None  # None: the log it read is gone (state log_gone)
    lag_seconds: float | None
    processing_rate: float  # records/s over the evaluation window
    produce_rate: float
    eta_seconds: float | None  # None: not converging
    partitions: tuple[PartitionLag, ...]
    reason: str | None = None  # why a stalled version makes no progress (the driver's error)

    def to_json(self) -> dict[str, object]:
        return {
            "job": self.job, "version": self.version, "state": self.state,
            "run_state": self.run_state.value, "lag_records": self.lag_records,
            "lag_seconds": self.lag_seconds, "processing_rate": self.processing_rate,
            "produce_rate": self.produce_rate, "eta_seconds": self.eta_seconds,
            "partitions": [p.to_json() for p in self.partitions], "reason": self.reason,
        }
