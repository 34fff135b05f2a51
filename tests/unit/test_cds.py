"""The driver's class archive: used only when built for this JDK and these Spark jars."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.spark.launch import cds


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cds.DIR_VARIABLE, str(tmp_path))
    monkeypatch.delenv(cds.DISABLE_VARIABLE, raising=False)
    return tmp_path


def test_drivers_use_the_archive_once_it_exists(archive_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = cds.archive_path()
    assert path is not None and path.parent == archive_dir
    assert cds.driver_java_options() == cds.DRIVER_JAVA_OPTS
    path.write_bytes(b"archive")
    assert cds.driver_java_options().endswith(f"-XX:SharedArchiveFile={path}")
    assert "-Xshare:auto" in cds.driver_java_options()  # one that does not map is ignored
    monkeypatch.setenv(cds.DISABLE_VARIABLE, "off")
    assert cds.driver_java_options() == cds.DRIVER_JAVA_OPTS


def test_the_archive_name_follows_the_spark_jars(archive_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    jars = site / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"1")
    monkeypatch.syspath_prepend(str(site))
    before = cds.archive_path()
    (jars / "spark-core.jar").write_bytes(b"12")  # another Spark build
    assert cds.archive_path() != before


def test_two_installs_of_the_same_spark_get_archives_of_their_own(
        archive_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The JVM refuses an archive whose recorded class path differs ("The top archive failed to
    # load"), so a second checkout's drivers must not find the first one's under the same name.
    paths = []
    for checkout in ("one", "two"):
        site = tmp_path / checkout / "site"
        (site / "pyspark" / "jars").mkdir(parents=True)
        (site / "pyspark" / "jars" / "spark-core.jar").write_bytes(b"1")
        with monkeypatch.context() as patch:
            patch.syspath_prepend(str(site))
            paths.append(cds.archive_path())
    assert paths[0] != paths[1]


def test_a_build_under_way_or_done_is_not_started_again(archive_dir: Path) -> None:
    path = cds.archive_path()
    assert path is not None
    path.with_suffix(".building").write_text("")
    assert cds.build_in_background() is False  # another process is building it
    path.with_suffix(".building").unlink()
    path.write_bytes(b"archive")
    assert cds.build_in_background() is False


def test_a_reinstall_of_the_same_spark_at_the_same_path_gets_a_new_archive(
        archive_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The JVM checks each jar's modification time as well as its size, and refuses an archive
    # built from the old files ("The top archive failed to load"): a venv reinstalled at the same
    # path (same jar names and sizes, new files) must not find the old archive under its name,
    # or every driver starts without one, for good.
    import os

    site = tmp_path / "site"
    jar = site / "pyspark" / "jars" / "spark-core.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"1")
    monkeypatch.syspath_prepend(str(site))
    before = cds.archive_path()
    stat = jar.stat()
    os.utime(jar, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # reinstalled
    assert cds.archive_path() != before



def test_a_driver_start_marks_its_archive_in_use(archive_dir: Path) -> None:
    import os
    import time

    path = cds.archive_path()
    assert path is not None
    path.write_bytes(b"archive")
    eight_days_ago = time.time() - 8 * 86400
    os.utime(path, (eight_days_ago, eight_days_ago))
    assert cds.driver_java_options().endswith(f"-XX:SharedArchiveFile={path}")
    assert path.stat().st_mtime > time.time() - 600  # another install's build keeps it


def test_a_new_build_removes_archives_no_driver_started_with_for_a_week(
        archive_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each reinstall of the venv or the JDK leaves an archive of about 170 MB behind, under a
    # name no driver asks for again.
    import os
    import time

    started: list[list[str]] = []
    monkeypatch.setattr(cds, "spawn_detached", lambda argv, env, log: started.append(argv))
    gone, in_use = archive_dir / "driver-0000000000000001.jsa", archive_dir / "driver-2.jsa"
    for old, days in ((gone, 8), (gone.with_suffix(".log"), 8), (in_use, 6)):
        old.write_bytes(b"archive")
        os.utime(old, (time.time() - days * 86400, time.time() - days * 86400))
    assert cds.build_in_background() is True and len(started) == 1
    assert not gone.exists() and not gone.with_suffix(".log").exists()
    assert in_use.is_file()
