"""Spark settings sized for the run (gossiprouter.analytics.sizing) and the local driver's
collector (spark_io.session_settings): no Spark needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossiprouter.analytics.sizing import (
    MIN_RECORDS_PER_PARTITION,
    QUICK_JVM_OPTIONS,
    RECORDS_PER_PARTITION,
    SMALL_INPUT_BYTES,
    input_bytes,
    partitions,
    start_settings,
)
from gossiprouter.analytics.spark_io import LOCAL_COLLECTOR, chooses_collector, session_settings


def test_input_bytes_counts_the_record_files_only(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "p0000-a.parquet").write_bytes(b"x" * 1000)
    (records / "p0001-a.parquet").write_bytes(b"x" * 234)
    (records / "notes.txt").write_bytes(b"x" * 99)
    (tmp_path / "membership.parquet").write_bytes(b"x" * 50)
    assert input_bytes(str(tmp_path)) == 1234
    assert input_bytes(f"file://{tmp_path}") == 1234
    # Unknown: a directory without records, and a remote one (not sized before Spark).
    assert input_bytes(str(tmp_path / "missing")) is None
    assert input_bytes("hdfs://namenode:8020/runs/r1") is None


def test_a_small_local_run_gets_a_light_jvm_and_one_partition() -> None:
    small = start_settings(None, 14_400 * 40)
    assert small["spark.driver.extraJavaOptions"] == QUICK_JVM_OPTIONS
    # C1 only, with the code cache of a JVM with both compilers (C1 alone gets 48 MiB).
    assert QUICK_JVM_OPTIONS.split() == ["-XX:TieredStopAtLevel=1",
                                         "-XX:ReservedCodeCacheSize=240m"]
    assert small["spark.sql.shuffle.partitions"] == "1"
    # No generated code to compile for a few thousand rows.
    assert small["spark.sql.codegen.wholeStage"] == "false"
    assert small["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    assert start_settings("local[2]", SMALL_INPUT_BYTES) == small
    # Large or unknown inputs, and cluster masters (the driver does not do the work),
    # keep Spark's settings.
    assert start_settings("local[*]", SMALL_INPUT_BYTES + 1) == {}
    assert start_settings("local[*]", None) == {}
    assert start_settings("spark://127.0.0.1:7077", 1000) == {}


def test_partitions_follow_the_record_count() -> None:
    assert partitions(0, 2) == 1
    assert partitions(14_400, 2) == 1
    assert partitions(MIN_RECORDS_PER_PARTITION * 3, 2) == 3
    assert partitions(MIN_RECORDS_PER_PARTITION * 3, 1) == 2
    # Never more records per partition than RECORDS_PER_PARTITION.
    assert partitions(10_622_267, 2) == -(-10_622_267 // RECORDS_PER_PARTITION) == 54


def test_a_local_driver_runs_the_throughput_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(v, raising=False)
    options = "spark.driver.extraJavaOptions"
    # Added to what a local master's driver is given (a small run's light JVM included) ...
    assert session_settings("local[2]")[options] == LOCAL_COLLECTOR == "-XX:+UseParallelGC"
    small = session_settings("local[*]", start_settings(None, 14_400 * 40))
    assert small[options].split() == [*QUICK_JVM_OPTIONS.split(), LOCAL_COLLECTOR]
    # ... not to a cluster's driver, which does not run the tasks ...
    assert options not in session_settings("spark://127.0.0.1:7077")
    # ... nor where the options choose a collector themselves (two choices stop the JVM),
    for chosen in ("-XX:+UseG1GC", "-Xss4m -XX:+UseSerialGC", "-XX:+UseZGC -Xlog:gc"):
        assert session_settings("local[2]", {options: chosen})[options] == chosen
    assert session_settings("local[2]", {options: "-Xss4m"})[options] == (
        f"-Xss4m {LOCAL_COLLECTOR}")
    # ... or the JVM's environment does.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dfoo=1 -XX:+UseShenandoahGC")
    assert options not in session_settings("local[2]")
    assert chooses_collector("", {"_JAVA_OPTIONS": "-XX:+UseEpsilonGC"})
    assert not chooses_collector("-XX:-UseG1GC -XX:+UseCompressedOops", {})
