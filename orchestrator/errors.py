"""One root error for everything the orchestrator refuses or fails to do.

Every message is one line that says what went wrong and what to run next; the CLI prints it as
``Error: <message>`` and exits 1.
"""

from __future__ import annotations


class KappaError(Exception):
    """Root of every error the orchestrator raises on purpose."""


class ConfigError(KappaError):
    """Settings are missing or invalid: set the named flag, KAPPA_* variable or kappa.toml key."""


class InvalidNameError(KappaError):
    """A job, version or alias name breaks the naming rule: rename it and deploy again."""


class JobFileError(KappaError):
    """A job file cannot be loaded: fix the file and run `kappa deploy` again."""


class NotFoundError(KappaError):
    """An unknown job or version: `kappa status` lists what is deployed."""


class ConflictError(KappaError):
    """The request contradicts what is recorded, e.g. different code under a deployed label."""


class StateError(KappaError):
    """A state change that the run's state machine does not allow from its current state."""


class LagRefusedError(StateError):
    """A promote or A/B step refused only for its version's lag, unknown now or too far behind:
    it may pass once the lag is measured or has caught up."""


class ServiceUnavailableError(KappaError):
    """PostgreSQL or the Kafka broker cannot be reached: start them (`kappa dev up`) or fix the
    settings."""


class LaunchError(KappaError):
    """A driver process could not be started (out of processes or memory, say): may pass on a
    retry."""


class LogGapError(KappaError):
    """Retention removed the start of the log: deploy with --allow-gap to replay what is left."""


class LogChangedError(KappaError):
    """The log no longer holds the position a version reached (a topic recreated, retention
    past unread offsets): the version fails; redeploy, or `kappa restart --allow-gap`."""


class RegistryUnavailableError(ServiceUnavailableError):
    """The schema registry cannot be reached or answers with a server error: a version reading
    through it stalls, and resumes once the registry answers; check schema_registry_url."""


class RegistryAuthError(ConfigError):
    """The schema registry refused the credentials (HTTP 401 or 403): set
    KAPPA_SCHEMA_REGISTRY_USER_INFO or KAPPA_SCHEMA_REGISTRY_TOKEN (or their files) and restart
    the version."""
