"""Secured Kafka: replays over TLS and over SASL are exact, a wrong CA or password is refused at
deploy in one line naming the setting, and the SASL password shows up nowhere."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import dead_letters, output, query, stop_drivers
from integration.observability import agent, scrape
from integration.secured_brokers import SaslBroker, TlsBroker, sasl_broker, tls_broker
from reference import compute

# Their brokers (tests/integration/secured_brokers.py) keep the log in memory.
# One worker builds the module's TLS and SASL brokers, once (--dist loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.broker_storage("memory"),
              pytest.mark.xdist_group("secured_kafka")]
JOB = "pageview_counts"


@pytest.fixture(scope="module")
def sasl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    password = f"kappa-pw-{uuid.uuid4().hex}"
    with sasl_broker(tmp_path_factory.mktemp("sasl"), "alice", password) as broker:
        yield broker


def _over_sasl(settings, sasl: SaslBroker, password: str | None = None):
    return replace(settings, kafka_bootstrap=sasl.bootstrap,
                   kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN",
                   kafka_sasl_username=sasl.username,
                   kafka_sasl_password=password or sasl.password)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    with tls_broker(tmp_path_factory.mktemp("tls")) as broker:
        yield broker


def _over_tls(settings, tls: TlsBroker, ca: Path | None = None):
    return replace(settings, kafka_bootstrap=tls.bootstrap, kafka_security_protocol="SSL",
                   kafka_ssl_ca_location=str(ca or tls.ca))


@pytest.mark.spark
def test_a_replay_over_tls_is_exact(settings, topic, tmp_path: Path, tls: TlsBroker) -> None:
    from orchestrator.service import Orchestrator

    secured = _over_tls(settings, tls)
    service = Orchestrator(secured)
    service.produce_sample(topic, 30_000, seed=31)
    try:
        service.deploy(job_file(tmp_path, "v1", topic))
        service.wait(JOB, "v1", timeout_s=240)
        ref = compute(tls.bootstrap, topic, tls.client())
        assert ref.records == 30_000 and ref.invalid > 0
        assert output(secured, f"{JOB}__v1") == ref.v1
        assert dead_letters(secured, f"{JOB}__v1__dead_letters") == ref.invalid_offsets
        (status,) = service.status(JOB)
        assert status.lag_records == 0
        assert status.processed_offsets == {topic: {str(p): e for p, e in ref.log_end.items()}}
    finally:
        stop_drivers(service)


def test_an_unknown_ca_is_refused_at_deploy_naming_the_setting(settings, topic, tmp_path: Path,
                                                                 tls: TlsBroker) -> None:
    from orchestrator.service import Orchestrator

    Orchestrator(_over_tls(settings, tls)).produce_sample(topic, 100, seed=32)
    wrong = _over_tls(settings, tls, tls.unknown_ca)
    result = kappa_cli(wrong, "deploy", str(job_file(tmp_path, "v1", topic)))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "kafka_ssl_ca_location" in lines[0] and "certificate verify failed" in lines[0]
    assert query(settings, "SELECT to_regclass(%s)", f"{settings.catalog_schema}.job_versions"
                 ) in ([(None,)], [])  # nothing was registered, not even the catalog


def _cli(settings, *args: str) -> str:
    result = kappa_cli(settings, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


@pytest.mark.spark
def test_a_sasl_run_is_exact_and_the_password_appears_nowhere(
    settings, topic, tmp_path: Path, sasl: SaslBroker
) -> None:
    from orchestrator.service import Orchestrator

    secured = _over_sasl(settings, sasl)
    seen: list[str] = []  # everything the run printed, served or launched
    driver_lines: list[str] = []  # the command lines of this test's own driver's processes
    seen.append(_cli(secured, "produce-sample", "--topic", topic, "--count", "20000"))
    try:
        with agent(secured, tmp_path) as target:
            seen.append(_cli(secured, "deploy", str(job_file(tmp_path, "v1", topic))))

            def command_lines() -> bool:
                status = json.loads(_cli(secured, "status", "--json"))
                if status and status[0]["pid"]:
                    own = _process_group_command_lines(status[0]["pid"])
                    driver_lines.extend(own)
                    seen.extend(own)
                for proc in psutil.process_iter(["cmdline"]):  # and every other process
                    seen.append(" ".join(proc.info["cmdline"] or []))
                return bool(status) and status[0]["state"] == "live"

            wait_until(command_lines, 240, "v1 to catch up over SASL", poll_s=1.0)
            seen.append(_cli(secured, "status", "--json"))
            seen.append(_cli(secured, "lag", "--json"))
            seen.append(_cli(secured, "events", "--json"))

            def sampled() -> str | None:
                page = scrape(target)
                return page if "kappa_lag_records{" in page else None

            seen.append(str(wait_until(sampled, 30, "the exporter to sample v1")))
        seen.append((tmp_path / "agent.out").read_text())
        for path in Path(secured.state_dir).rglob("*"):
            if path.is_file():
                seen.append(path.read_bytes().decode("utf-8", "replace"))
        for table in ("events", "job_versions", "runs"):
            seen.extend(str(row) for row in query(
                settings, f"SELECT t::text FROM {settings.catalog_schema}.{table} t"))
    finally:
        stop_drivers(Orchestrator(secured))  # the CLI's deploy started it; the test ends it

    ref = compute(sasl.bootstrap, topic, sasl.client())
    assert ref.records == 20_000
    assert output(secured, f"{JOB}__v1") == ref.v1
    assert dead_letters(secured, f"{JOB}__v1__dead_letters") == ref.invalid_offsets
    # Its own JVM was seen: other tests' drivers on the machine do not count.
    assert any("SparkSubmit" in line and "pyspark-shell" in line for line in driver_lines), \
        driver_lines
    assert not [line for line in driver_lines if sasl.password in line], "the driver's argv"
    assert any("kappa_lag_records{" in text for text in seen)
    leaks = [text[:200] for text in seen if sasl.password in text]
    assert not leaks, leaks


def _process_group_command_lines(leader: int) -> list[str]:
    """The command lines of the processes in ``leader``'s process group: a driver starts in a
    session of its own, and its JVM and Python workers stay in its group."""
    import os

    lines = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(proc.pid) == leader:
                lines.append(" ".join(proc.info["cmdline"] or []))
        except ProcessLookupError:
            continue
    return lines


def test_a_wrong_password_is_refused_at_deploy_naming_the_setting(
    settings, topic, tmp_path: Path, sasl: SaslBroker
) -> None:
    from orchestrator.service import Orchestrator

    Orchestrator(_over_sasl(settings, sasl)).produce_sample(topic, 100, seed=33)
    result = kappa_cli(_over_sasl(settings, sasl, "not-the-password"), "deploy",
                       str(job_file(tmp_path, "v1", topic)))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "KAPPA_KAFKA_SASL_PASSWORD" in lines[0] and "Authentication failed" in lines[0]
    assert "not-the-password" not in result.stderr
