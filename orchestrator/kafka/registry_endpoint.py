"""Where the schema registry is and how to authenticate to it (domain code: no driver library).

Its credentials, basic auth ("user:password") or a bearer token, come only from the environment
or from a file that a setting names, like the Kafka SASL password: never from kappa.toml, a flag
or the URL, and no message or repr shows them. TLS trusts the CA of the Kafka settings
(``kafka_ssl_ca_location``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.errors import ConfigError

USER_INFO_VARIABLE = "KAPPA_SCHEMA_REGISTRY_USER_INFO"
TOKEN_VARIABLE = "KAPPA_SCHEMA_REGISTRY_TOKEN"


@dataclass(frozen=True)
class RegistryEndpoint:
    url: str
    user_info: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    ca_location: str | None = None


def registry_endpoint(url: str, *, user_info: str | None, user_info_file: str | None,
                      token: str | None, token_file: str | None, ca_location: str | None
                      ) -> RegistryEndpoint:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"schema_registry_url={url!r} is not an http(s) URL: give it as "
                          "https://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        raise ConfigError("schema_registry_url holds credentials: take them out of the URL and "
                          f"put them in {USER_INFO_VARIABLE} or a file named by "
                          "schema_registry_user_info_file")
    user_info = user_info or _secret_file(user_info_file, "schema_registry_user_info_file")
    token = token or _secret_file(token_file, "schema_registry_token_file")
    if user_info and token:
        raise ConfigError(f"both basic auth ({USER_INFO_VARIABLE} or its file) and a bearer "
                          f"token ({TOKEN_VARIABLE} or its file) are set for the schema "
                          "registry: keep the one it expects")
    if user_info is not None and ":" not in user_info:
        raise ConfigError(f"the schema registry's basic auth ({USER_INFO_VARIABLE} or its file) "
                          "must read user:password: fix it")
    return RegistryEndpoint(url.rstrip("/"), user_info, token, ca_location)


def _secret_file(path: str | None, setting: str) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"{setting}={path} cannot be read ({exc.strerror}): fix the path or "
                          "its permissions") from exc
