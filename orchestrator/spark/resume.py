"""Where a driver's new checkpoint starts, and the refusals when the log or the checkpoint no
longer fits what the catalog says was applied."""

from __future__ import annotations

import logging

import psycopg
from confluent_kafka.admin import AdminClient

from orchestrator.archive.readable import log_bounds_with_archive
from orchestrator.catalog import runs, tile_plans
from orchestrator.catalog.batches import next_batch_id
from orchestrator.catalog.read_accounting import clear_staged_reads
from orchestrator.kafka.admin import log_identity
from orchestrator.kafka.clients import LogClients
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import Bounds
from orchestrator.lag import log_changed_reason, log_mismatches
from orchestrator.log_identity import log_gone_reason, replaced
from orchestrator.models import DeployedVersion, Offsets
from orchestrator.settings import Settings
from orchestrator.spark.checkpoint import Checkpoint
from orchestrator.spark.shape import JobError
from orchestrator.tiles import past_the_log_end

log = logging.getLogger("kappa.driver")


def resume_point(conn: psycopg.Connection, settings: Settings, version: DeployedVersion,
                 kafka: Kafka, checkpoint: Checkpoint, clients: LogClients, *,
                 after_tiles: bool = False) -> Offsets:
    """Where the first batch of a new checkpoint starts, and a refusal when the log or the
    checkpoint no longer fits what the catalog says was applied.

    A checkpoint with batches carries its own start. Without one, a version that applied
    nothing starts at its log start; a batch job that applied batches resumes at the
    catalog's processed offsets (its output holds everything before them); a stream job's
    state lived only in the lost checkpoint, so it cannot go on exactly. ``after_tiles``: a
    batch phase (batch_phase.py) committed the batches, and this seeds the streaming query's
    checkpoint from them, as a lost one is. ``clients``: the driver's kept broker clients (a
    throw-away probe would list every partition's offsets afresh: on Tansu, every batch)."""
    v, schema = version, settings.catalog_schema
    with conn.transaction():
        processed = runs.processed_offsets(conn, schema, v.id)
        next_id = next_batch_id(conn, schema, v.id)
        last_tile = tile_plans.last_planned(conn, schema, v.id)
    # The tiles keep no streaming checkpoint: none is lost while the last batch is a tile (or
    # the next one is planned as one). Once the streaming query committed batches, one is.
    tiled = last_tile is not None and last_tile >= next_id - 1
    if checkpoint.has_batches():
        start = checkpoint.start_offsets() or v.log_start
    elif next_id == 0:
        start = v.log_start
        checkpoint.start(0, start)
    elif v.spec.mode == "stream":
        raise JobError(
            f"the checkpoint of {v.job} {v.version} ({checkpoint.location}) is gone, and "
            "with it the state of its stream job: its output cannot be continued exactly. "
            "Deploy the job under a new VERSION, which replays from offset 0")
    else:
        if after_tiles:
            log.info("the batch phase ended before batch %d: the streaming query starts from "
                     "the catalog's processed offsets", next_id)
        elif tiled:
            log.info("batch %d is next, after a batch phase's tiles (which keep no streaming "
                     "checkpoint): resuming from the catalog's processed offsets", next_id)
        else:
            log.warning("no checkpoint at %s: resuming from the catalog's processed offsets "
                        "with batch %d", checkpoint.location, next_id)
        start = processed_start(v, processed)
        checkpoint.start(next_id, start)
    topics = list(v.spec.topics)
    bounds = checked_bounds(conn, settings, v, kafka, processed or start,
                            clients.bounds(topics), admin=clients.admin)
    _forget_a_plan_past_the_log_end(conn, schema, v.id, checkpoint, bounds)
    return start


def processed_start(version: DeployedVersion, processed: Offsets) -> Offsets:
    """Where the version's next batch starts: its processed offsets, its log start elsewhere."""
    start = {t: dict(ps) for t, ps in version.log_start.items()}
    for topic, partitions in processed.items():
        start.setdefault(topic, {}).update(partitions)
    return start


def checked_bounds(conn: psycopg.Connection, settings: Settings, version: DeployedVersion,
                   kafka: Kafka, position: Offsets, broker: Bounds, *,
                   admin: AdminClient | None = None) -> Bounds:
    """The readable log's bounds (``broker``'s, reaching down into the archive), once the log
    is the one the version read (the same topics, not recreated) and still holds
    ``position``; a JobError that says what to do otherwise. ``admin``: a client kept by a
    caller that checks every batch."""
    v, topics = version, list(version.spec.topics)
    if v.log_identity is not None:
        gone = replaced(v.log_identity, log_identity(kafka, topics, admin=admin), topics)
        if gone:
            raise JobError(log_gone_reason(gone, v.job, v.version))
    bounds = log_bounds_with_archive(conn, settings, v.log_identity, topics, broker)
    mismatches = log_mismatches(position, bounds)
    if mismatches:
        raise JobError(log_changed_reason(mismatches, v.job, v.version))
    return bounds


def _forget_a_plan_past_the_log_end(conn: psycopg.Connection, schema: str, version_id: int,
                                    checkpoint: Checkpoint, bounds: Bounds) -> None:
    """A batch planned up to an end that the log no longer reaches (a broker that died with
    records the archive did not hold yet, restored shorter) would wait for ever for offsets
    that may never be written. Nothing of it was applied (the catalog's offsets are within the
    log), so its plan goes, and Spark plans it again up to the log's end. What its read tasks
    staged goes too: new records will stand at those offsets, and a stale dead letter or
    count must not be committed against them."""
    plan = checkpoint.unfinished_plan()
    if plan is None:
        return
    unfinished, planned = plan
    past = past_the_log_end(planned, bounds)
    if past:
        log.warning("batch %d was planned past the log end (%s: planned end, log end); it is "
                    "planned again from where the batch before it ended", unfinished,
                    ", ".join(f"{tp} {a}>{b}" for tp, (a, b) in sorted(past.items())))
        with conn.transaction():
            cleared = clear_staged_reads(conn, schema, version_id)
        checkpoint.forget_batch(unfinished)
        if cleared:
            log.warning("cleared %d dead letters and read counts that batch %d had staged",
                        cleared, unfinished)
