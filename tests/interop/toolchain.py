"""The interop tests' Java side: the JDK's tools, the JGroups 2.12 jar, and ``java/*.java``
compiled into ``java/classes`` when a source is newer (tests/interop/harness.py runs them).

Nothing is skipped: a missing JDK or jar is a :class:`HarnessError` naming the package that
provides it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
JAVA_SRC_DIR = HERE / "java"
CLASSES_DIR = JAVA_SRC_DIR / "classes"
JGROUPS_JAR = Path(os.environ.get("INTEROP_JGROUPS_JAR", "/usr/share/java/jgroups.jar"))


class HarnessError(AssertionError):
    """The environment or a process did not behave; the message says what and shows the logs."""


def _tool(name: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise HarnessError(
            f"'{name}' not found (PATH or JAVA_HOME). The interop tests need a JDK 11+ "
            "(Debian: apt-get install openjdk-17-jdk-headless)."
        )
    return found


def java_executable() -> str:
    return _tool("java")


def require_jar() -> None:
    if not JGROUPS_JAR.is_file():
        raise HarnessError(
            f"JGroups jar not found at {JGROUPS_JAR}. Install Debian's libjgroups-java (2.12.2) "
            "or point INTEROP_JGROUPS_JAR at a JGroups 2.12 jar."
        )


def _stale(sources: Sequence[Path]) -> bool:
    for src in sources:
        cls = CLASSES_DIR / (src.stem + ".class")
        if not cls.is_file() or cls.stat().st_mtime < src.stat().st_mtime:
            return True
    return False


def ensure_compiled() -> Path:
    """Compile ``java/*.java`` into ``java/classes`` unless every class file is up to date.

    Returns the classes directory. Raises HarnessError when javac or the jar is missing or the
    compile fails (never a skip: a missing toolchain must not look like a passing suite).
    """
    require_jar()
    sources = sorted(JAVA_SRC_DIR.glob("*.java"))
    if not sources:
        raise HarnessError(f"no Java sources in {JAVA_SRC_DIR}")
    CLASSES_DIR.mkdir(parents=True, exist_ok=True)
    # A file lock, in case several pytest processes (xdist) start at once.
    with (CLASSES_DIR / ".compile.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale(sources):
            cmd = [
                _tool("javac"),
                "-encoding",
                "UTF-8",
                "-nowarn",
                "-cp",
                str(JGROUPS_JAR),
                "-d",
                str(CLASSES_DIR),
                *map(str, sources),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
            if done.returncode != 0:
                raise HarnessError(
                    f"javac failed ({done.returncode}):\n{' '.join(cmd)}\n"
                    f"{done.stdout}{done.stderr}"
                )
    return CLASSES_DIR


def classpath() -> str:
    return os.pathsep.join([str(JGROUPS_JAR), str(CLASSES_DIR)])
