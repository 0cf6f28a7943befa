"""The Spark session an analysis runs in, and its progress lines.

- :func:`open_session`: what both jobs (the ROUTE audit and the topics audit) call to
  start or join the session; :func:`close_session` ends it;
- :func:`run_kind`: tells a topics run from a ROUTE run;
- :class:`Phases`: the progress lines with timings.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gossiprouter.analytics.jvm_archive import ANALYSIS
from gossiprouter.analytics.spark_io import (
    DEFAULT_MASTER,
    LOOPBACK,
    driver_address,
    local_path,
    spark_session,
    stop_session,
)
from gossiprouter.loadtest.records import MANIFEST_FILE
from gossiprouter.loadtest.topic_records import KIND

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Phases", "close_session", "open_session", "run_kind"]


class Phases:
    """Progress lines with timings: each phase's start, with the time since the beginning,
    then one line with the duration of every phase."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.started = time.monotonic()
        self.done: list[tuple[str, float]] = []
        self._current: tuple[str, float] | None = None

    def _stamp(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f} s]"

    def _close(self) -> None:
        if self._current is not None:
            name, t = self._current
            self.done.append((name, time.monotonic() - t))
            self._current = None

    def start(self, name: str, line: str) -> None:
        self._close()
        self._current = (name, time.monotonic())
        self.say(f"{self._stamp()} {line}")

    def note(self, line: str) -> None:
        self.say(f"{self._stamp()} {line}")

    def finish(self) -> None:
        self._close()
        total = time.monotonic() - self.started
        self.say(f"{self._stamp()} done: " + ", ".join(
            f"{name} {d:.1f} s" for name, d in self.done) + f"; total {total:.1f} s")


def run_kind(run_dir: str) -> str | None:
    """``"topics"`` for a local run directory whose manifest says ``"kind": "topics"``,
    else None (a ROUTE run, or one that cannot be told: the ROUTE audit then reports
    what is missing)."""
    local = local_path(run_dir)
    if local is None:
        return None
    try:
        data = json.loads((local / MANIFEST_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return KIND if isinstance(data, dict) and data.get("kind") == KIND else None


def open_session(spark: SparkSession | None, master: str | None,
                 conf: Mapping[str, str] | None, spark_log: str | os.PathLike[str] | None,
                 phases: Phases) -> tuple[SparkSession, bool]:
    """The session an analysis runs on, and whether it was started for it (then the caller
    ends it, :func:`close_session`). One passed in, or already running in this process
    (spark_session joins it), belongs to the caller. Says which driver address was
    chosen."""
    from pyspark import SparkContext

    own = spark is None and SparkContext._active_spark_context is None
    if spark is None:
        phases.start("Spark start", f"starting Spark ({master or DEFAULT_MASTER})…")
        spark = spark_session(master, conf=conf, log_path=spark_log, share_classes=ANALYSIS)
    chosen = spark.sparkContext.getConf().get("spark.driver.host", "")
    how = ("loopback master: driver kept on loopback" if chosen == LOOPBACK
           else "set --conf spark.driver.host=ADDRESS if the executors cannot reach it")
    phases.note(f"Spark driver at {driver_address(spark)} ({how})")
    return spark, own


def close_session(spark: SparkSession, phases: Phases, *, stop: bool = True) -> None:
    """End the session an analysis started (:func:`~.spark_io.stop_session`); the wait for
    the class archive, if its JVM writes it, is a phase of its own."""
    stop_session(spark, lambda: phases.start(
        "class archive", "saving the JVM's classes for the next runs (once)…"), stop=stop)
