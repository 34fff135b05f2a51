"""A stand-in for a schema registry, for the tests: no registry server (Confluent's, Karapace,
Redpanda's, Apicurio's) can be installed from the package indexes this project reaches
(docs/formats.md). It serves the Confluent REST endpoints that ``confluent_kafka``'s
``SchemaRegistryClient`` calls, so that the real client's HTTP, caching and auth run against
it: schemas by id, subjects and their versions, registering, and a schema's lookup under a
subject; with HTTP basic auth or a bearer token when given, and the registry's error codes
(40401 subject not found, 40402 version not found, 40403 schema not found, 40101 unauthorized,
40301 forbidden).

Ids are global, as in the real registry: the same schema text registered under two subjects
has one id. ``requests`` counts the requests by path, for the tests of the client's cache;
``away()`` closes the listening socket (an outage) and ``back()`` opens it again on the same
port. ``stop_at`` names a request path at which the registry stops, as one whose process died:
that request and every one after it until ``back()`` go unanswered, and it goes away."""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryStandIn:
    def __init__(self, *, users: dict[str, str] | None = None, readers_only: tuple[str, ...] = (),
                 tokens: tuple[str, ...] = ()):
        self.users, self.readers_only, self.tokens = users or {}, readers_only, tokens
        self.schemas: list[tuple[str, str]] = []  # (schema text, type) by id - 1
        self.subjects: dict[str, list[int]] = {}  # subject -> ids, by version - 1
        self.requests: Counter[str] = Counter()
        self.stop_at: str | None = None
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0
        self.back()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def back(self) -> None:
        registry = self
        self.stopped.clear()

        class Handler(_Handler):
            standin = registry

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def away(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def close(self) -> None:
        self.away()

    # --- the registry's state ------------------------------------------------------------
    def register(self, subject: str, text: str, kind: str) -> tuple[int, int]:
        """(id, version) of ``text`` under ``subject``, registering it if it is new there."""
        with self._lock:
            entry = (text, kind)
            if entry not in self.schemas:
                self.schemas.append(entry)
            schema_id = self.schemas.index(entry) + 1
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id, versions.index(schema_id) + 1

    def answer(self, method: str, path: str, body: dict[str, Any] | None
               ) -> tuple[int, Any]:
        self.requests[f"{method} {path}"] += 1
        if method == "GET" and (m := re.fullmatch(r"/schemas/ids/(-?\d+)", path)):
            schema_id = int(m[1])
            if not 1 <= schema_id <= len(self.schemas):
                return 404, _error(40403, "Schema not found")
            return 200, self._schema(schema_id)
        if method == "GET" and path == "/subjects":
            return 200, sorted(self.subjects)
        if (m := re.fullmatch(r"/subjects/([^/]+)(/versions)?(?:/([^/]+))?", path)):
            subject, versions, version = unquote(m[1]), m[2], m[3]
            if method == "POST" and not versions:
                return self._lookup(subject, body or {})
            if method == "POST" and versions and version is None:
                text, kind = (body or {}).get("schema", ""), (body or {}).get("schemaType",
                                                                                 "AVRO")
                return 200, {"id": self.register(subject, text, kind)[0]}
            if subject not in self.subjects:
                return 404, _error(40401, f"Subject '{subject}' not found.")
            ids = self.subjects[subject]
            if method == "GET" and versions and version is None:
                return 200, list(range(1, len(ids) + 1))
            if method == "GET" and versions:
                number = len(ids) if version == "latest" else int(version or 0)
                if not 1 <= number <= len(ids):
                    return 404, _error(40402, f"Version {version} not found.")
                return 200, {"subject": subject, "version": number, "id": ids[number - 1],
                             **self._schema(ids[number - 1])}
        return 404, _error(404, f"HTTP 404 Not Found: {method} {path}")

    def _schema(self, schema_id: int) -> dict[str, Any]:
        text, kind = self.schemas[schema_id - 1]
        return {"schema": text, **({} if kind == "AVRO" else {"schemaType": kind})}

    def _lookup(self, subject: str, body: dict[str, Any]) -> tuple[int, Any]:
        entry = (body.get("schema", ""), body.get("schemaType", "AVRO"))
        ids = self.subjects.get(subject)
        if ids is None:
            return 404, _error(40401, f"Subject '{subject}' not found.")
        if entry not in self.schemas or self.schemas.index(entry) + 1 not in ids:
            return 404, _error(40403, "Schema not found")
        schema_id = self.schemas.index(entry) + 1
        return 200, {"subject": subject, "version": ids.index(schema_id) + 1, "id": schema_id,
                     **self._schema(schema_id)}

    def allowed(self, method: str, authorization: str | None) -> int:
        """200, or the HTTP status that refuses the request."""
        if not self.users and not self.tokens:
            return 200
        if authorization and authorization.startswith("Bearer "):
            return 200 if authorization[len("Bearer "):] in self.tokens else 401
        if authorization and authorization.startswith("Basic "):
            user, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            if self.users.get(user) != password:
                return 401
            return 403 if method != "GET" and user in self.readers_only else 200
        return 401


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error_code": code, "message": message}


class _Handler(BaseHTTPRequestHandler):
    standin: RegistryStandIn

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        standin = self.standin
        if standin.stopped.is_set() or urlsplit(self.path).path == standin.stop_at:
            if not standin.stopped.is_set():
                standin.stop_at = None
                standin.stopped.set()
                # Not on this thread: shutdown() waits for the serving loop.
                threading.Thread(target=standin.away, daemon=True).start()
            self.close_connection = True
            return  # unanswered: the connection closes
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status = self.standin.allowed(method, self.headers.get("Authorization"))
        if status == 200:
            status, found = self.standin.answer(method, urlsplit(self.path).path,
                                                json.loads(raw) if raw else None)
        else:
            found = _error(40101 if status == 401 else 40301,
                           "Unauthorized" if status == 401 else "Forbidden")
        payload = json.dumps(found).encode()
        self.send_response(status)
        self.send_header("Content-Type", _CONTENT_TYPE)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
