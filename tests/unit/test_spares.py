"""Which spare a deploy may adopt: the fingerprint, and where spares are never used."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.settings import Settings, load_settings
from orchestrator.spark.launch import spares

BASE = Settings(state_dir=Path("/tmp/a"), pg_dsn="postgresql://u:p@h/db",
                kafka_bootstrap="127.0.0.1:9092")
ENV = {"PATH": "/usr/bin", "KAPPA_CATALOG_SCHEMA": "kappa"}


def test_what_a_session_does_not_fix_leaves_the_fingerprint_alone() -> None:
    same = spares.fingerprint(BASE, ENV)
    moved = replace(BASE, state_dir=Path("/tmp/b"), catalog_schema="other", data_schema="d2",
                    max_batch_records=7)
    assert spares.fingerprint(moved, {**ENV, "KAPPA_CATALOG_SCHEMA": "other",
                                      "PYTEST_CURRENT_TEST": "t", "PWD": "/x",
                                      "AIRFLOW_HOME": "/a", "AIRFLOW__CORE__X": "1"}) == same


@pytest.mark.parametrize("change", [
    {"spark_driver_memory": "2g"}, {"spark_master": "local[1]"},
    {"pg_dsn": "postgresql://u:other@h/db"}, {"kafka_sasl_password": "s3cret"},
    {"spare_idle_s": 5.0}])
def test_what_a_session_fixes_at_start_changes_it(change: dict[str, object]) -> None:
    assert spares.fingerprint(replace(BASE, **change), ENV) != spares.fingerprint(BASE, ENV)  # type: ignore[arg-type]


def test_the_driver_class_archive_built_meanwhile_leaves_it_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare started before the class archive existed (a fresh machine, `kappa dev up`) has
    paid its start already: the archive appearing must not withdraw it at the next deploy."""
    from orchestrator.spark.launch import cds

    monkeypatch.setenv(cds.DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv(cds.DISABLE_VARIABLE, "on")
    archive = cds.archive_path()
    assert archive is not None, "no JDK or no pyspark: run scripts/setup.sh"
    before = spares.fingerprint(BASE, ENV)
    archive.write_bytes(b"archive")
    assert "SharedArchiveFile" in cds.driver_java_options()
    assert spares.fingerprint(BASE, ENV) == before


def test_the_environment_beyond_settings_changes_it() -> None:
    assert spares.fingerprint(BASE, {**ENV, "JAVA_HOME": "/other"}) != spares.fingerprint(
        BASE, ENV)


def test_the_fingerprint_shows_no_secret() -> None:
    secret = replace(BASE, pg_dsn="postgresql://u:hunter2@h/db")
    assert "hunter2" not in spares.fingerprint(secret, ENV)


def test_fail_points_clusters_and_zero_never_use_spares() -> None:
    assert spares.usable(BASE, ENV)
    assert not spares.usable(BASE, {**ENV, "KAPPA_FAIL_POINTS": "source.read=raise"})
    assert not spares.usable(replace(BASE, spark_master="spark://h:7077"), ENV)
    off = replace(BASE, warm_spares=0)
    assert not spares.usable(off, ENV)
    assert spares.adopt(off, ENV, "job", "v1", 1, Path("/dev/null")) is None
    assert spares.keep(off, ENV) is None


@pytest.mark.parametrize(("size", "expected"), [
    ("1g", 2**30), ("768m", 768 * 2**20), ("512MB", 512 * 2**20), ("1048576", 2**20)])
def test_sizes_read_as_spark_reads_them(size: str, expected: int) -> None:
    assert spares.cost_bytes(replace(BASE, spark_driver_memory=size)) == \
        expected + spares.OVERHEAD_BYTES


def test_settings_read_the_spare_settings(tmp_path: Path) -> None:
    loaded = load_settings(env={"KAPPA_WARM_SPARES": "0", "KAPPA_SPARE_DIR": "/tmp/sp",
                                "KAPPA_SPARE_IDLE_S": "60"}, cwd=tmp_path)
    assert (loaded.warm_spares, loaded.spare_dir, loaded.spare_idle_s) == (
        0, Path("/tmp/sp"), 60.0)
    assert load_settings(env={}, cwd=tmp_path).warm_spares == 1
