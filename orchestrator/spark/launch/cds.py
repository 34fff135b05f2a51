"""A class-data-sharing (AppCDS) archive for driver JVMs: built once per machine, it halves the
time from a driver's start to its first batch (measured in the README, Speed).

The JVM maps the classes that a warm-up session loaded from the archive instead of loading and
verifying them one by one. An archive is only valid for the JDK, the Spark jars (their paths,
sizes and times) and the JVM flags it was made with, so its file name carries a digest of all
three: a new JDK or Spark, or the same one reinstalled, gets a new archive, and a driver never
starts with one that does not fit. No pyspark here: building runs in a process of its own
(``orchestrator.spark.launch.cds_build``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from orchestrator.process import spawn_detached

# Fast start of a short-lived JVM; the replay is CPU-bound in Python workers, not in the JIT.
DRIVER_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
log = logging.getLogger("kappa.cds")
DIR_VARIABLE = "KAPPA_CDS_DIR"
DISABLE_VARIABLE = "KAPPA_CDS"  # "off": drivers neither use nor build an archive
# A build that has not finished in this long died: another may start.
_BUILD_LOCK_TTL_S = 600.0
# An archive no driver has started with for this long belongs to a JDK, Spark or venv that is
# gone (each reinstall leaves one of about 170 MB behind): a new build removes it.
UNUSED_ARCHIVE_TTL_S = 7 * 86400.0


def archive_dir() -> Path:
    explicit = os.environ.get(DIR_VARIABLE)
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kappa" / "cds"


def enabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "on").lower() not in ("off", "0", "false", "no")


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _spark_jars() -> Path | None:
    """pyspark's jars directory, found without importing pyspark."""
    for entry in sys.path:
        jars = Path(entry or ".") / "pyspark" / "jars"
        if jars.is_dir():
            return jars
    return None


def archive_path() -> Path | None:
    """Where the archive for this JDK, these Spark jars and the driver flags lives (it may not
    exist yet); None when there is no JDK or no Spark to make one for."""
    java, jars = _java(), _spark_jars()
    if java is None or jars is None:
        return None
    digest = hashlib.sha256(DRIVER_JAVA_OPTS.encode())
    stat = java.stat()
    digest.update(f"{java}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    # The archive records the jars' paths, sizes and modification times, and the JVM refuses it
    # where any differs (a venv reinstalled at the same path has new times).
    digest.update(str(jars.resolve()).encode())
    for jar in sorted(jars.iterdir()):
        jar_stat = jar.stat()
        digest.update(f"{jar.name}:{jar_stat.st_size}:{jar_stat.st_mtime_ns}".encode())
    return archive_dir() / f"driver-{digest.hexdigest()[:16]}.jsa"


def driver_java_options() -> str:
    """The driver JVM's flags: the fast-start ones, plus the archive when it has been built."""
    path = archive_path() if enabled() else None
    if path is None or not path.is_file():
        return DRIVER_JAVA_OPTS
    # In use: a build for another install leaves it (in a cache another user owns, it serves
    # all the same).
    with contextlib.suppress(OSError):
        os.utime(path)
    # auto: an archive the JVM cannot map (a changed classpath) is ignored, never fatal.
    return f"{DRIVER_JAVA_OPTS} -Xshare:auto -XX:SharedArchiveFile={path}"


def build_in_background() -> bool:
    """Start building the archive in a detached process unless it exists or a build is under
    way; True when a build was started. Drivers started meanwhile run without it."""
    try:
        return _start_build()
    except OSError as exc:  # an unwritable cache costs speed, never a deploy
        log.warning("cannot build the driver class archive in %s (%s); drivers start without "
                    "it: set %s to a writable directory", archive_dir(), exc, DIR_VARIABLE)
        return False


def _start_build() -> bool:
    path = archive_path() if enabled() else None
    if path is None or path.is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_suffix(".building")
    try:
        if time.time() - lock.stat().st_mtime < _BUILD_LOCK_TTL_S:
            return False
        lock.unlink()  # left by a build that died
    except FileNotFoundError:
        pass
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    _remove_unused(path)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spawn_detached([sys.executable, "-m", "orchestrator.spark.launch.cds_build", str(path)], env,
                   path.with_suffix(".log"))
    return True


def _remove_unused(keep: Path) -> None:
    """Archives (and their logs) that no driver started with for UNUSED_ARCHIVE_TTL_S."""
    horizon = time.time() - UNUSED_ARCHIVE_TTL_S
    for archive in keep.parent.glob("driver-*.jsa"):
        try:
            if archive != keep and archive.stat().st_mtime < horizon:
                archive.unlink()
                archive.with_suffix(".log").unlink(missing_ok=True)
                log.info("removed the driver class archive %s: unused for %d days", archive,
                         UNUSED_ARCHIVE_TTL_S // 86400)
        except OSError:
            pass  # gone meanwhile, or not ours
