"""A class-data-sharing (AppCDS) archive of the Spark driver JVM's classes, kept in the
user's cache: the JVM maps the classes it loaded in an earlier run instead of reading,
parsing and verifying them from Spark's jars again (measured on a 14,400-record run: the
Spark start and the first query about 3 s faster each; docs/performance-spark.md).

The first analysis started with no archive writes one when its JVM exits
(``-XX:ArchiveClassesAtExit``, Java 13+): :func:`stop_jvm` closes the JVM and waits for it
(a few seconds, once), then moves the archive into place. Every later start maps it
(``-XX:SharedArchiveFile``). An archive the JVM cannot use (another Java, another Spark)
is simply not mapped (``-Xshare:auto``, the default): the archive's name is keyed on the
Java binary and Spark's jars, so a new install writes a new one. Each install keeps its own
(two checkouts, two virtualenvs): an archive goes when its install changed or is gone.
Nothing is written when the cache directory cannot be created; ``GOSSIPROUTER_SPARK_CDS=0``
turns the archive off.

Each kind of JVM keeps an archive of its own (``spark-KIND-KEY.jsa``): ``analyze``'s
(:data:`ANALYSIS`) and the test suite's Spark (``tests``). An archive holds the classes of the
run that wrote it, and the suite's JVM loads fewer of them (152 against 180 MB): an analysis
that mapped it loaded the rest from the jars, about a second more on every run.

- :func:`class_archive`: the JVM options for this start, and the archive it would write;
- :func:`track`, :func:`finish_archive`: remember a gateway whose JVM writes an archive,
  and at the end of the analysis end that JVM and keep the archive (:func:`stop_jvm`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["ANALYSIS", "ARCHIVE_ENV", "ClassArchive", "cache_dir", "class_archive",
           "finish_archive", "stop_jvm", "track"]

ARCHIVE_ENV: Final = "GOSSIPROUTER_SPARK_CDS"
_PREFIX: Final = "spark-"
# The archive of `gossiprouter analyze`'s JVM.
ANALYSIS: Final = "analysis"
# The name every archive had before each kind kept its own (whoever wrote it first).
_FORMER: Final = "spark-driver-"
# A partial archive older than this was left by a JVM that died while writing it.
_STALE_S: Final = 600.0
# The JVM's notes on what it could not archive (hundreds of lines) stay out of Spark's log.
_QUIET: Final = "-Xlog:cds*=error"
# How long to wait for the JVM to write the archive and exit (about 3 s on 2 cores).
_DUMP_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True)
class ClassArchive:
    """JVM ``options`` for a start; ``writing`` is where that JVM dumps its classes at exit
    (None when it maps an existing archive), ``path`` the archive's final name."""

    options: str
    path: Path
    writing: Path | None
    java: str
    spark_home: str


def cache_dir() -> Path:
    """Where the archive lives: ``$XDG_CACHE_HOME/gossiprouter`` (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "gossiprouter"


def _key(java: str, spark_home: str) -> str:
    """A digest of what the archive depends on: the Java binary and Spark's jars."""
    h = hashlib.sha256()
    for path in [Path(os.path.realpath(java)),
                 *sorted((Path(spark_home) / "jars").glob("*.jar"))]:
        try:
            st = path.stat()
        except OSError:
            continue
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _name(kind: str, java: str, spark_home: str) -> str:
    return f"{_PREFIX}{kind}-{_key(java, spark_home)}.jsa"


def class_archive(java: str, spark_home: str, directory: Path | None = None,
                  kind: str = ANALYSIS) -> ClassArchive | None:
    """The archive options for a driver JVM of ``kind`` started from ``java`` with the jars
    of ``spark_home``, or None (archive turned off, or the cache cannot be written)."""
    if os.environ.get(ARCHIVE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if not kind.isalnum():
        raise ValueError(f"an archive's kind is a word, not {kind!r}")
    directory = directory or cache_dir()
    path = directory / _name(kind, java, spark_home)
    if path.is_file() and path.stat().st_size > 0:
        return ClassArchive(f"-XX:SharedArchiveFile={path} {_QUIET}", path, None, java,
                            spark_home)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for part in directory.glob(f"{path.name}.*.part"):
            if now - part.stat().st_mtime < _STALE_S:
                return None  # another analysis is writing it: do not write it twice
            part.unlink(missing_ok=True)
        # Marks the archive as being written (the JVM replaces it with the archive).
        writing = path.with_name(f"{path.name}.{os.getpid()}.part")
        writing.touch()
    except OSError:
        return None
    return ClassArchive(f"-XX:ArchiveClassesAtExit={writing} {_QUIET}", path, writing, java,
                        spark_home)


# Beside each archive: the install it is of (the Java binary, then Spark's home).
_INSTALL: Final = ".install"


def _outdated(archive: Path) -> bool:
    """True when ``archive``'s install changed or is gone (or is not known), or the archive
    has the name of before each kind kept its own."""
    kind = archive.name.removeprefix(_PREFIX).rpartition("-")[0]
    try:
        java, home = archive.with_suffix(_INSTALL).read_text().split("\n")[:2]
    except (OSError, ValueError):
        return True
    return archive.name.startswith(_FORMER) or archive.name != _name(kind, java, home)


def stop_jvm(proc: subprocess.Popen[bytes], archive: ClassArchive) -> bool:
    """End the gateway JVM ``proc`` (it exits when its stdin closes), wait for it to write
    ``archive`` and move the archive into place; True when it is there. The archives of
    installs that changed or are gone are removed; other installs keep theirs."""
    assert archive.writing is not None
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=_DUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    try:
        if proc.returncode != 0 or not archive.writing.is_file() \
                or archive.writing.stat().st_size == 0:
            archive.writing.unlink(missing_ok=True)
            return False
        os.replace(archive.writing, archive.path)
        archive.path.with_suffix(_INSTALL).write_text(f"{archive.java}\n{archive.spark_home}\n")
        for old in archive.path.parent.glob(f"{_PREFIX}*.jsa"):
            if old != archive.path and _outdated(old):
                old.unlink(missing_ok=True)
                old.with_suffix(_INSTALL).unlink(missing_ok=True)
    except OSError:
        return False
    return True


# Gateways (py4j) whose JVM writes an archive at exit, by id, with the archive.
_WRITING: dict[int, tuple[Any, ClassArchive]] = {}


def track(gateway: Any, archive: ClassArchive) -> None:
    """Remember ``gateway`` when its JVM (``gateway.proc``) writes ``archive``."""
    if archive.writing is not None and getattr(gateway, "proc", None) is not None:
        _WRITING[id(gateway)] = (gateway, archive)


def finish_archive(gateway: Any, saving: Callable[[], None] | None = None) -> bool:
    """If ``gateway``'s JVM writes an archive: call ``saving`` (to say why the wait), close
    the gateway, end the JVM, keep the archive, and return True (the gateway is unusable
    then); else False."""
    gateway, archive = _WRITING.pop(id(gateway), (None, None))
    if gateway is None or archive is None:
        return False
    if saving is not None:
        saving()
    gateway.shutdown()
    stop_jvm(gateway.proc, archive)
    return True
