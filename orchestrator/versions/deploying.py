"""`kappa deploy`: a job version registered and its driver launched, as a plan of named steps.

Deploying the same code under the same label again is a no-op, except that a version whose
deploy crashed before it launched the driver is launched now."""

from __future__ import annotations

from pathlib import Path

import psycopg

from orchestrator.catalog import events, output, runs, versions
from orchestrator.catalog.access import CatalogAccess
from orchestrator.desks.switches import SwitchDesk
from orchestrator.determinism import replay_hazards
from orchestrator.jobspec import load_job_file
from orchestrator.lag import replay_start
from orchestrator.log_identity import LogIdentity
from orchestrator.models import DeployedVersion, JobSpec, Offsets
from orchestrator.naming import consumer_group, dead_letter_table, output_table
from orchestrator.replay_queue.order import parse_priority
from orchestrator.replay_queue.slots import start_or_queue
from orchestrator.states import RunState
from orchestrator.versions import reporting
from orchestrator.versions.lifecycle import DeployResult, checkpoint_location
from orchestrator.versions.registry_formats import refuse_unreadable_writers, registry_formats


def deploy(catalog: CatalogAccess, switches: SwitchDesk, job_file: str | Path,
           allow_gap: bool = False, priority: int | str = 0,
           allow_incompatible: bool = False) -> DeployResult:
    return Deploy(catalog, switches, load_job_file(job_file), allow_gap,
                  parse_priority(priority), allow_incompatible).run()


class Deploy:
    def __init__(self, catalog: CatalogAccess, switches: SwitchDesk, spec: JobSpec,
                 allow_gap: bool, priority: int, allow_incompatible: bool = False):
        self.catalog, self.switches, self.allow_gap = catalog, switches, allow_gap
        self.priority, self.allow_incompatible = priority, allow_incompatible
        self.spec = registry_formats(spec, catalog.settings)
        self.schema = catalog.settings.catalog_schema
        self.hazards = tuple(replay_hazards(self.spec))
        _, self.bootstrap = catalog.settings.require_services()

    def run(self) -> DeployResult:
        self.check_access()
        with self.catalog.connection() as conn:
            existing = versions.find(conn, self.schema, self.spec.name, self.spec.version)
            if existing is not None:
                return self.deployed_before(conn, existing)
            self.check_topics()
            self.check_writer_schemas()
            identity, log_start, gone = self.read_the_log(conn)
            version = self.register(conn, identity, log_start, gone)
            start_or_queue(self.catalog, conn, version, self.priority)
            self.prepare_switches(conn)
            events.prune(conn, self.schema, self.catalog.settings.events_kept)
            status = reporting.status_of(self.catalog, conn, version)
            return DeployResult(True, status, self.hazards)

    def check_access(self) -> None:
        """A refused certificate or password, named before anything runs."""
        from orchestrator.kafka.admin import check_access

        check_access(self.bootstrap)

    def deployed_before(self, conn: psycopg.Connection, existing: DeployedVersion
                        ) -> DeployResult:
        versions.check_same_code(existing, self.spec)
        if runs.get(conn, self.schema, existing.id).state == RunState.REGISTERED:
            # Registered by a deploy that crashed before it launched the driver.
            start_or_queue(self.catalog, conn, existing, self.priority)
        return DeployResult(False, reporting.status_of(self.catalog, conn, existing), self.hazards)

    def check_topics(self) -> None:
        """A clear error for a missing topic."""
        from orchestrator.kafka.admin import topic_partitions

        for topic in self.spec.topics:
            topic_partitions(self.bootstrap, topic)

    def check_writer_schemas(self) -> None:
        """An Avro reader schema that cannot read a writer schema of the log, refused."""
        from orchestrator.kafka.writer_ids import sampled_writer_ids

        if not self.allow_incompatible:
            refuse_unreadable_writers(self.spec, self.catalog.settings, lambda topic: (
                sampled_writer_ids(self.bootstrap, topic, f"kappa-deploy-{self.spec.name}")))

    def read_the_log(self, conn: psycopg.Connection) -> tuple[LogIdentity, Offsets, int]:
        """The log's identity, where the replay starts (below the broker's log start where the
        archive holds what retention took), and the offsets it cannot replay (``--allow-gap``)."""
        from orchestrator.archive.readable import archived_spans, check_archive_readable
        from orchestrator.kafka.admin import log_identity
        from orchestrator.kafka.offsets import log_bounds

        topics = list(self.spec.topics)
        # Before the bounds: a topic recreated in between fails the version, never blesses a
        # log it did not read.
        identity = log_identity(self.bootstrap, topics)
        check_archive_readable(conn, self.catalog.settings, identity, topics)
        broker = log_bounds(self.bootstrap, topics)
        log_start, gone = replay_start(
            broker, allow_gap=self.allow_gap,
            archived=archived_spans(conn, self.catalog.settings, identity, topics, broker))
        return identity, log_start, gone

    def register(self, conn: psycopg.Connection, identity: LogIdentity, log_start: Offsets,
                 gone: int) -> DeployedVersion:
        """The version, its tables, its run and the deploy event, in one transaction."""
        s, spec = self.catalog.settings, self.spec
        out = output_table(spec.name, spec.version)
        dlq = dead_letter_table(spec.name, spec.version)
        with conn.transaction():
            version = versions.insert(
                conn, self.schema, spec, output_table=out, dead_letter_table=dlq,
                checkpoint_dir=checkpoint_location(s, spec.name, spec.version),
                consumer_group=consumer_group(spec.name, spec.version), log_start=log_start,
                log_identity=identity)
            output.create_tables(conn, self.schema, s.data_schema, spec, out, dlq)
            runs.create(conn, self.schema, version.id)
            events.record(conn, self.schema, "deploy", job=spec.name, version=spec.version,
                          fingerprint=spec.fingerprint, file=str(spec.path),
                          log_start=log_start, allow_gap=self.allow_gap,
                          log_identity=identity.to_json(), gap_offsets=gone,
                          files=[p for p, _ in spec.files], replay_hazards=list(self.hazards),
                          allow_incompatible=self.allow_incompatible)
        return version

    def prepare_switches(self, conn: psycopg.Connection) -> None:
        """So that a later switch to this version needs no DDL."""
        self.switches.board(conn).refresh_views(self.spec.name)
