"""Naming rules for jobs, versions and the tables derived from them."""

from __future__ import annotations

import re

from orchestrator.errors import InvalidNameError

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,40}")
# PostgreSQL truncates identifiers at 63 bytes; two names of 41 plus separators and a suffix stay
# under it only if we refuse a table name that would be cut (the truncated names could collide).
_PG_MAX_IDENTIFIER = 63
DEAD_LETTER_SUFFIX = "__dead_letters"
STAGE_SUFFIX = "__stage"


def validate_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it matches ``[a-z][a-z0-9_]{0,40}``, else raise a one-line error."""
    if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
        raise InvalidNameError(
            f"invalid {what} {value!r}: use 1-41 characters of [a-z0-9_], starting with a letter"
        )
    if "__" in value:
        raise InvalidNameError(
            f"invalid {what} {value!r}: '__' is reserved as the job/version separator; "
            "use a single underscore"
        )
    return value


# Kafka's own rule for a topic name (clients and brokers refuse any other): a name kappa uses
# as a path component of the archive can then never climb out of it.
TOPIC_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def topic_name_problem(topic: object) -> str | None:
    """Why ``topic`` is not a name Kafka would accept, in one line; None if it is one."""
    if not isinstance(topic, str) or TOPIC_PATTERN.fullmatch(topic) is None \
            or topic in (".", ".."):
        return (f"invalid topic name {topic!r}: Kafka's rule is 1-249 characters of "
                "[a-zA-Z0-9._-], not '.' or '..'")
    return None


def output_table(job: str, version: str) -> str:
    """The physical output table of one job version: ``<job>__<version>``."""
    return _checked(f"{validate_name(job, 'job name')}__{validate_name(version, 'version')}")


def dead_letter_table(job: str, version: str) -> str:
    return _checked(output_table(job, version) + DEAD_LETTER_SUFFIX)


def stage_table(job: str, version: str) -> str:
    """Where executors write a batch's output before its commit moves it into the output table.
    Shorter than the dead-letter table's name, so it fits wherever that one does."""
    return _checked(output_table(job, version) + STAGE_SUFFIX)


def consumer_group(job: str, version: str) -> str:
    """The Kafka consumer group that belongs to one job version (never shared)."""
    return f"kappa.{validate_name(job, 'job name')}.{validate_name(version, 'version')}"


def _checked(identifier: str) -> str:
    if len(identifier.encode()) > _PG_MAX_IDENTIFIER:
        raise InvalidNameError(
            f"table name {identifier!r} is longer than PostgreSQL's 63 bytes: "
            "use a shorter job name or version label"
        )
    return identifier
