"""The driver JVM's class archive (gossiprouter.analytics.jvm_archive; no Spark needed, a
small Python process stands in for the JVM) and spark_io.local_frame (one local Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gossiprouter.analytics.jvm_archive import ANALYSIS, ARCHIVE_ENV, class_archive, stop_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _spark_home(tmp_path: Path) -> tuple[str, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    java = tmp_path / "java"
    java.write_bytes(b"#!/bin/sh\n")
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"x" * 10)
    return str(java), str(home)


def _fake_jvm(writes: Path | None) -> subprocess.Popen[bytes]:
    """A process that, like the gateway JVM, exits when its stdin closes, writing the
    archive (some bytes) at exit when ``writes`` is given."""
    code = "import sys; sys.stdin.read()"
    if writes is not None:
        code += f"; open({str(writes)!r}, 'wb').write(b'CDS' * 100)"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def test_the_first_start_writes_the_archive_and_later_ones_map_it(tmp_path: Path) -> None:
    java, home = _spark_home(tmp_path)
    cache = tmp_path / "cache"
    first = class_archive(java, home, cache)
    assert first is not None and first.writing is not None
    assert first.options.startswith(f"-XX:ArchiveClassesAtExit={first.writing} ")
    # While it is being written, another start neither writes it nor maps it.
    assert class_archive(java, home, cache) is None
    assert stop_jvm(_fake_jvm(first.writing), first)
    assert first.path.read_bytes() == b"CDS" * 100 and not first.writing.exists()
    later = class_archive(java, home, cache)
    assert later is not None and later.writing is None
    assert later.options.startswith(f"-XX:SharedArchiveFile={first.path} ")
    # Another Spark (its jars changed): another archive, and the old one goes once the
    # new one is written.
    (Path(home) / "jars" / "spark-sql.jar").write_bytes(b"y")
    other = class_archive(java, home, cache)
    assert other is not None and other.writing is not None and other.path != first.path
    assert stop_jvm(_fake_jvm(other.writing), other)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [other.path.name, other.path.with_suffix(".install").name])


def test_each_install_keeps_its_own_archive(tmp_path: Path) -> None:
    # Two checkouts (two virtualenvs, two Spark homes) analysing on one machine: each maps
    # its own archive, rather than each start rewriting the other's (14 s each time).
    cache = tmp_path / "cache"
    (a_java, a_home), (b_java, b_home) = (_spark_home(tmp_path / n) for n in "ab")
    a = class_archive(a_java, a_home, cache)
    b = class_archive(b_java, b_home, cache)
    assert a is not None and b is not None and a.writing and b.writing and a.path != b.path
    assert stop_jvm(_fake_jvm(a.writing), a) and stop_jvm(_fake_jvm(b.writing), b)
    for java, home, path in ((a_java, a_home, a.path), (b_java, b_home, b.path)):
        again = class_archive(java, home, cache)
        assert again is not None and again.writing is None and again.path == path
    # Install b is removed: its archive goes when another is written.
    for jar in (Path(b_home) / "jars").iterdir():
        jar.unlink()
    (Path(a_home) / "jars" / "spark-sql.jar").write_bytes(b"y")
    newer = class_archive(a_java, a_home, cache)
    assert newer is not None and newer.writing is not None
    assert stop_jvm(_fake_jvm(newer.writing), newer)
    assert sorted(p.name for p in cache.glob("*.jsa")) == [newer.path.name]


def test_an_archive_not_written_is_not_kept(tmp_path: Path) -> None:
    java, home = _spark_home(tmp_path)
    cache = tmp_path / "cache"
    archive = class_archive(java, home, cache)
    assert archive is not None and archive.writing is not None
    assert not stop_jvm(_fake_jvm(None), archive)  # the JVM exited without writing it
    assert not archive.path.exists()
    # A partial archive left by a JVM that died long ago does not block a new one.
    stale = archive.path.with_name(f"{archive.path.name}.999999.part")
    stale.write_bytes(b"half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    again = class_archive(java, home, cache)
    assert again is not None and again.writing is not None and not stale.exists()


def test_the_archive_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java, home = _spark_home(tmp_path)
    monkeypatch.setenv(ARCHIVE_ENV, "0")
    assert class_archive(java, home, tmp_path / "cache") is None
    monkeypatch.setenv(ARCHIVE_ENV, "1")
    blocked = tmp_path / "file"
    blocked.write_text("")  # the cache directory cannot be created under a file
    assert class_archive(java, home, blocked / "cache") is None


def test_local_frame_builds_the_rows_in_the_jvm(spark: SparkSession) -> None:
    from gossiprouter.analytics.spark_io import local_frame

    data = [("g/1", 'quote " and \\ back', 1, 2**62, None),
            ("g2", "m", -5, None, 7)]
    df = local_frame(spark, data, "`group` STRING, member STRING, a INT, b BIGINT, c BIGINT")
    assert df.columns == ["group", "member", "a", "b", "c"]
    assert [tuple(r) for r in df.collect()] == data
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "string", "string", "int", "bigint", "bigint"]
    assert local_frame(spark, [], "x STRING").collect() == []


def test_a_failed_analysis_names_the_java_root_cause(spark: SparkSession) -> None:
    """Spark wraps the error that stopped a job in layers ("Boxed Exception" says nothing):
    the one-line failure names the outermost error and the root cause."""
    from py4j.protocol import Py4JJavaError

    from gossiprouter.analytics.cli import _one_line, java_causes

    jvm: Any = spark._jvm
    root = jvm.java.lang.OutOfMemoryError("unable to create native thread")
    boxed = jvm.java.util.concurrent.ExecutionException("Boxed Exception", root)
    outer = jvm.org.apache.spark.SparkException("[STAGE_MATERIALIZATION_MULTIPLE_FAILURES] "
                                                "Multiple failures (2)", boxed)
    error = Py4JJavaError("An error occurred while calling o1.collectToPython.\n", outer)
    assert java_causes(error) == [
        "org.apache.spark.SparkException: [STAGE_MATERIALIZATION_MULTIPLE_FAILURES] "
        "Multiple failures (2)",
        "java.util.concurrent.ExecutionException: Boxed Exception",
        "java.lang.OutOfMemoryError: unable to create native thread"]
    assert _one_line(error) == (
        "org.apache.spark.SparkException: [STAGE_MATERIALIZATION_MULTIPLE_FAILURES] Multiple "
        "failures (2) (root cause: java.lang.OutOfMemoryError: unable to create native "
        "thread)")
    alone = Py4JJavaError("An error occurred.\n", jvm.java.lang.IllegalStateException("x"))
    assert _one_line(alone) == "java.lang.IllegalStateException: x"
    assert java_causes(ValueError("not Java")) == []


def test_the_quick_jvm_has_room_for_its_code(spark: SparkSession) -> None:
    """The suite's JVM (and a small run's: sizing.QUICK_JVM_OPTIONS) runs C1 only; C1 alone
    gets a 48 MiB code cache, which Spark's code filled in a JVM that served several test
    modules ("Out of space in CodeCache for adapters" failed a job in CI)."""
    jvm: Any = spark._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert bean.getVMOption("TieredStopAtLevel").getValue() == "1"
    assert int(bean.getVMOption("ReservedCodeCacheSize").getValue()) >= 240 * 2**20


def test_building_a_column_takes_few_round_trips_to_the_jvm(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PySpark's DataFrame debugging (on by default) sends each Column operation's Python
    # call site to the JVM: 11 to 13 Py4J round trips where 1 to 3 build the column. The
    # sessions turn it off (spark_io.session_settings): a small run's analysis made 2,000
    # fewer of them (4,500 -> 2,480).
    import py4j.clientserver
    from pyspark.sql import functions as F

    F.col("a").isNull()  # PySpark reads the setting once, at the first column
    calls = []
    send = py4j.clientserver.ClientServerConnection.send_command

    def counted(self: Any, command: str) -> Any:
        # Not Py4J's "forget this object" messages (m, d): any earlier JavaObject (another
        # test's) that the garbage collector happens to finalize during the block sends one.
        # A CI run of ad93d81 counted 14 here once, in the pure-Python pass only.
        if not command.startswith("m\nd\n"):
            calls.append(command)
        return send(self, command)

    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted)
    c = (F.col("a") == F.lit(1)) & F.col("b").isNotNull()
    assert c is not None
    assert len(calls) <= 12, " | ".join(" ".join(c.split("\n")[:4]) for c in calls)


def test_each_kind_of_jvm_keeps_its_own_archive(tmp_path: Path) -> None:
    """The test suite's JVM loads fewer classes than an analysis (152 against 180 MB of
    archive): an analysis mapping the suite's archive loaded the rest from the jars, a second
    more on every run. Each kind writes and maps its own; an archive of the name before
    (``spark-driver-``, of whichever wrote it first) goes once one is written."""
    java, home = _spark_home(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    former = cache / "spark-driver-0123456789abcdef.jsa"
    former.write_bytes(b"old")
    former.with_suffix(".install").write_text(f"{java}\n{home}\n")
    tests = class_archive(java, home, cache, kind="tests")
    assert tests is not None and tests.writing is not None
    assert stop_jvm(_fake_jvm(tests.writing), tests)
    assert not former.exists() and not former.with_suffix(".install").exists()
    analysis = class_archive(java, home, cache)  # analyze's (ANALYSIS), not the tests'
    assert analysis is not None and analysis.writing is not None
    assert analysis.path != tests.path and analysis.path.name.startswith("spark-analysis-")
    assert stop_jvm(_fake_jvm(analysis.writing), analysis)
    for kind, path in (("tests", tests.path), (ANALYSIS, analysis.path)):
        again = class_archive(java, home, cache, kind=kind)
        assert again is not None and again.writing is None and again.path == path
    with pytest.raises(ValueError, match="kind"):
        class_archive(java, home, cache, kind="../x")


def test_the_local_jvm_runs_the_throughput_collector(spark: SparkSession) -> None:
    """A local master's driver runs the tasks itself, and on few cores the parallel
    collector beats G1, Java's default (spark_io.LOCAL_COLLECTOR): the option reaches the
    JVM (the suite's, like an analysis's)."""
    jvm: Any = spark._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert bean.getVMOption("UseParallelGC").getValue() == "true"
    assert bean.getVMOption("UseG1GC").getValue() == "false"
    names = {str(b.getName()) for b in
             jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
