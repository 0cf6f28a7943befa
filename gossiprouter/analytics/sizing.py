"""Spark settings sized for the run an analysis reads.

A run of ten thousand records and one of ten million need different settings: the small
one is over in a few jobs of a few milliseconds of work each, so what it pays for is the
JVM's start, its optimising compiler and the fixed cost of every task; the large one
needs enough partitions that no task's hash tables outgrow memory.

- :func:`input_bytes`: the size of a local run's record files, known before Spark starts;
- :func:`start_settings`: the settings of a session started for a run of that size;
- :func:`partitions`: the number of partitions of the main shuffle, from the record count.
"""

from __future__ import annotations

from typing import Final

from gossiprouter.analytics.spark_io import DEFAULT_MASTER, DRIVER_JAVA_OPTIONS, local_path
from gossiprouter.loadtest.records import RECORDS_DIR

__all__ = ["MIN_RECORDS_PER_PARTITION", "QUICK_JVM_OPTIONS", "RECORDS_PER_PARTITION",
           "SMALL_INPUT_BYTES", "input_bytes", "partitions", "start_settings"]

# Records per partition of the main shuffle: keeps each task's hash tables small.
RECORDS_PER_PARTITION: Final = 200_000
# Fewer records than this per partition are not worth a task of their own (each task has a
# fixed cost, which dominates below about a hundred thousand records).
MIN_RECORDS_PER_PARTITION: Final = 100_000
# Record files up to this size (about 700,000 records) make a small run: its analysis is
# a matter of seconds, and the JVM's start dominates it.
SMALL_INPUT_BYTES: Final = 16 * 2**20
# The driver JVM of a small run: C1 only (no optimising C2 compiler), with the code cache a
# JVM with both compilers gets. C1 alone gets 48 MiB by default, and Spark's code fills it:
# one analysis used at most 23 MiB, and a JVM that ran several (the test suite's) reached
# 48 MiB and failed a job with "VirtualMachineError: Out of space in CodeCache for
# adapters". The size is a reservation of address space; only the code is in memory.
QUICK_JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def input_bytes(run_dir: str) -> int | None:
    """The total size of the record files of a local ``run_dir``; None for a URI (sizing
    a remote directory would cost a Hadoop round trip before Spark has even started)."""
    local = local_path(run_dir)
    if local is None:
        return None
    try:
        return sum(p.stat().st_size for p in (local / RECORDS_DIR).iterdir()
                   if p.is_file() and p.name.endswith(".parquet"))
    except OSError:
        return None


def start_settings(master: str | None, n_bytes: int | None) -> dict[str, str]:
    """Settings for a session started to analyse a run whose record files hold ``n_bytes``
    (None: unknown), applied before the caller's own ``--conf`` entries (which win).

    A small run on a local master gets a JVM without its optimising (C2) compiler, which
    costs more CPU than it saves in a job of seconds (measured: the analysis of a
    14,400-record run takes half the CPU time), no generated code, and one shuffle
    partition: a task per core would only add fixed costs. Nothing changes for a cluster
    master, whose driver is not where the work is done, or a large or unknown input."""
    if not (master or DEFAULT_MASTER).startswith("local"):
        return {}
    if n_bytes is None or n_bytes > SMALL_INPUT_BYTES:
        return {}
    return {
        DRIVER_JAVA_OPTIONS: QUICK_JVM_OPTIONS,
        "spark.sql.shuffle.partitions": "1",
        "spark.default.parallelism": "1",
        # Interpreted expressions and operators: compiling generated code (Janino) costs
        # more than it saves on a few thousand rows (measured: the audit stage about a
        # third faster; docs/performance-spark.md).
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    }


def partitions(n_records: int, parallelism: int) -> int:
    """Partitions of the main shuffle for ``n_records`` records: enough that none holds
    more than :data:`RECORDS_PER_PARTITION`, and two per core (``parallelism``) unless
    they would hold fewer than :data:`MIN_RECORDS_PER_PARTITION`."""
    return max(1, -(-n_records // RECORDS_PER_PARTITION),
               min(2 * parallelism, -(-n_records // MIN_RECORDS_PER_PARTITION)))
