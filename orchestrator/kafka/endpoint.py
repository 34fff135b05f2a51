"""Where the Kafka cluster is and how to authenticate to it: one value every client is built from.

Domain code: no driver library. ``orchestrator.kafka`` turns an endpoint into a librdkafka
configuration; Spark sources get the non-secret part as an option and the password through the
executors' environment (:data:`PASSWORD_VARIABLE`), never through argv or a Spark conf listing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError

# The client id of every client a restore uses: the embedded stack's ack proxy lets only the
# restore through while it runs, and does not take the restore's own deletions (a topic whose
# check failed) for a user's.
RESTORE_CLIENT_ID_PREFIX = "kappa-restore-"

__all__ = [
    "PASSWORD_VARIABLE",
    "SASL_MECHANISMS",
    "SECRETS_VARIABLE",
    "SECRET_PROPERTIES",
    "SECURITY_PROTOCOLS",
    "Kafka",
    "KafkaEndpoint",
    "as_endpoint",
    "check_extra_properties",
]

PASSWORD_VARIABLE = "KAPPA_KAFKA_SASL_PASSWORD"
# The other secret-bearing librdkafka properties, as a JSON object: only ever in the environment.
SECRETS_VARIABLE = "KAPPA_KAFKA_SECRET_PROPERTIES"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# librdkafka properties that have a named setting (one place of truth, and one that names the
# setting in errors), and the secret that must never sit in a file of settings.
_NAMED = {
    "bootstrap.servers": "kafka_bootstrap",
    "security.protocol": "kafka_security_protocol",
    "ssl.ca.location": "kafka_ssl_ca_location",
    "sasl.mechanism": "kafka_sasl_mechanism",
    "sasl.mechanisms": "kafka_sasl_mechanism",
    "sasl.username": "kafka_sasl_username",
}
# librdkafka's properties that carry a secret (its CONFIGURATION.md marks them sensitive).
SECRET_PROPERTIES = ("sasl.password", "ssl.key.password", "ssl.key.pem", "ssl_key",
                     "ssl.keystore.password", "sasl.oauthbearer.config",
                     "sasl.oauthbearer.client.secret", "ssl.engine.id", "ssl_engine_callback_data")


def check_extra_properties(
    properties: Mapping[str, Any], where: str
) -> tuple[tuple[str, str], ...]:
    """Validate the free-form librdkafka properties of ``where`` and return them as strings."""
    out: list[tuple[str, str]] = []
    for key, value in properties.items():
        if key in _NAMED:
            raise ConfigError(f"{where}: set {key!r} with the setting {_NAMED[key]}, not as a "
                              "librdkafka property")
        if key in SECRET_PROPERTIES:
            raise ConfigError(f"{where}: {key!r} is a secret and must not be written in settings: "
                              f"put it in {SECRETS_VARIABLE} (a JSON object in the environment), "
                              f"or the SASL password in {PASSWORD_VARIABLE} or in a file named "
                              "by kafka_sasl_password_file")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: librdkafka property {key!r} must be a string, number or "
                              f"boolean, not {type(value).__name__}")
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out.append((str(key), text))
    return tuple(sorted(out))


def check_secret_properties(properties: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Validate the secret librdkafka properties given in :data:`SECRETS_VARIABLE`."""
    for key in properties:
        if key == "sasl.password":
            raise ConfigError(f"{SECRETS_VARIABLE}: put the SASL password in "
                              f"{PASSWORD_VARIABLE} or a file named by kafka_sasl_password_file")
        if key not in SECRET_PROPERTIES:
            raise ConfigError(f"{SECRETS_VARIABLE}: {key!r} is no secret: set it in the "
                              "[kappa.kafka] table of kappa.toml (or KAPPA_KAFKA_PROPERTIES)")
    return tuple(sorted((str(k), str(v)) for k, v in properties.items()))


@dataclass(frozen=True)
class KafkaEndpoint:
    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    ssl_ca_location: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    password: str | None = field(default=None, repr=False)
    extra: tuple[tuple[str, str], ...] = ()
    # Secret librdkafka properties: in client configurations, never in options or reprs.
    secrets: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        protocol = self.security_protocol.upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"kafka_security_protocol={self.security_protocol!r} is not one of "
                              f"{', '.join(SECURITY_PROTOCOLS)}: fix it")
        object.__setattr__(self, "security_protocol", protocol)
        if self.sasl:
            if (self.sasl_mechanism or "").upper() not in SASL_MECHANISMS:
                raise ConfigError(f"kafka_security_protocol={protocol} needs kafka_sasl_mechanism,"
                                  f" one of {', '.join(SASL_MECHANISMS)} (now "
                                  f"{self.sasl_mechanism!r}): set it")
            object.__setattr__(self, "sasl_mechanism", (self.sasl_mechanism or "").upper())
            if not self.sasl_username:
                raise ConfigError(f"kafka_security_protocol={protocol} needs kafka_sasl_username:"
                                  " set it")
            if not self.password:
                raise ConfigError(f"kafka_security_protocol={protocol} needs the SASL password: "
                                  f"set {PASSWORD_VARIABLE} or kafka_sasl_password_file")
        if self.ssl_ca_location and not Path(self.ssl_ca_location).is_file():
            raise ConfigError(f"kafka_ssl_ca_location={self.ssl_ca_location!r} is not a readable "
                              "file: point it at the PEM file of the CA that signed the brokers' "
                              "certificates")

    def __str__(self) -> str:
        return self.bootstrap

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def client_config(self) -> dict[str, str]:
        """The librdkafka properties every client of this cluster starts from."""
        config = dict(self.extra)
        config["bootstrap.servers"] = self.bootstrap
        if self.security_protocol != "PLAINTEXT":
            config["security.protocol"] = self.security_protocol
        if self.tls and self.ssl_ca_location:
            config["ssl.ca.location"] = self.ssl_ca_location
        if self.sasl:
            config["sasl.mechanism"] = self.sasl_mechanism or ""
            config["sasl.username"] = self.sasl_username or ""
            config["sasl.password"] = self.password or ""
        config.update(self.secrets)
        return config

    def public_options(self) -> dict[str, Any]:
        """Everything but the secrets: safe for a Spark option (see :meth:`from_options`)."""
        return {"bootstrap": self.bootstrap, "security_protocol": self.security_protocol,
                "ssl_ca_location": self.ssl_ca_location, "sasl_mechanism": self.sasl_mechanism,
                "sasl_username": self.sasl_username, "extra": [list(p) for p in self.extra]}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], password: str | None,
                     secrets: tuple[tuple[str, str], ...] = ()) -> KafkaEndpoint:
        return cls(bootstrap=options["bootstrap"], secrets=secrets,
                   security_protocol=options.get("security_protocol") or "PLAINTEXT",
                   ssl_ca_location=options.get("ssl_ca_location"),
                   sasl_mechanism=options.get("sasl_mechanism"),
                   sasl_username=options.get("sasl_username"), password=password,
                   extra=tuple((str(k), str(v)) for k, v in options.get("extra", ())))

    def hint(self) -> str:
        """Which settings to check when the broker refuses this client's connection."""
        if self.sasl:
            return ("check kafka_sasl_username, kafka_sasl_mechanism and the password "
                    f"({PASSWORD_VARIABLE} or kafka_sasl_password_file)")
        if self.tls:
            return (f"check kafka_ssl_ca_location (now {self.ssl_ca_location or 'the system CAs'})"
                    " and kafka_security_protocol")
        return "check kafka_security_protocol: the broker may require TLS or SASL"


# What the Kafka adapters accept: a bare bootstrap string (an open, PLAINTEXT cluster) or an
# endpoint with security settings.
Kafka = str | KafkaEndpoint


def as_endpoint(kafka: Kafka) -> KafkaEndpoint:
    return kafka if isinstance(kafka, KafkaEndpoint) else KafkaEndpoint(kafka)
