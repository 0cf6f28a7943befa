"""The PySpark job that audits a load-test run and measures its latency and throughput.

:func:`analyze` reads ``RUN_DIR`` (layout and schemas in :mod:`gossiprouter.loadtest.records`),
computes with Spark DataFrames

1. the delivery audit: for every message its expected receivers (from the membership
   timeline and the settle window) against the receivers that recorded it: lost, duplicated,
   out-of-order, undetermined and unexpected deliveries, each with a sample;
2. latency percentiles overall, per group, per payload size and per cast kind;
3. deliveries (and sends, and losses) per second over the run;

and writes ``report.json`` and ``report.html`` (see :mod:`gossiprouter.analytics.report.files`).

Paths are local paths by default. Anything with a URI scheme (``hdfs://``, ``s3a://``,
``file://`` ...) is handed to Spark and Hadoop as is, so it works wherever the Spark
installation is configured for it; the report files are then written through Hadoop's
FileSystem API. Spark runs embedded as ``local[*]`` unless a master URL is given.

This module is the job: it runs the stages in order and puts the report together. Each
stage has its own module:

- :mod:`gossiprouter.analytics.spark_io`: reading and writing the run directory, starting
  Spark (its public names still import from here);
- :mod:`gossiprouter.analytics.timeline`: the membership intervals and the router outages;
- :mod:`gossiprouter.analytics.deliveries`: expected against received, as cached tables;
- :mod:`gossiprouter.analytics.findings`: losses, duplicates, order: counts and samples;
- :mod:`gossiprouter.analytics.latency`: the latency histograms and their figures;
- :mod:`gossiprouter.analytics.report`: the report's model, verdict and files.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from gossiprouter.analytics.deliveries import delivery_tables
from gossiprouter.analytics.findings import (
    audit_from,
    breakdowns,
    by_process,
    no_anomalies,
    sample_anomalies,
    total,
)
from gossiprouter.analytics.latency import latency_breakdowns, route_scopes
from gossiprouter.analytics.report.files import write_report
from gossiprouter.analytics.report.manifest import run_events
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import Counts, ThroughputBucket
from gossiprouter.analytics.report.plots import EarlyPlots
from gossiprouter.analytics.session import Phases, close_session, open_session
from gossiprouter.analytics.sizing import input_bytes, partitions, start_settings
from gossiprouter.analytics.spark_io import (
    DEFAULT_MASTER,
    AuditInputError,
    RunStore,
    SparkStartError,
    check_run_dir,
    local_path,
    loopback_master,
    rows,
    session_settings,
    spark_session,
)
from gossiprouter.analytics.timeline import (
    NS_PER_S,
    manifest_int,
    membership_intervals,
    router_outages,
    run_end,
)
from gossiprouter.loadtest.records import MEMBERSHIP_FILE, RECORDS_DIR

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "AuditInputError",
    "SparkStartError",
    "analyze",
    "check_run_dir",
    "local_path",
    "loopback_master",
    "session_settings",
    "spark_session",
]

_ADAPTIVE: Final = "spark.sql.adaptive.enabled"
_SHUFFLE_PARTITIONS: Final = "spark.sql.shuffle.partitions"
# The kinds of anomaly the pairs' categories count; when none of them was counted, the
# samples need only the out-of-order check.
_FLAGGED: Final = ("lost", "lost_reconnect", "unexpected", "undetermined_delivered",
                   "undetermined_missing")


def analyze(
    run_dir: str,
    out_dir: str,
    master: str | None = None,
    settle_s: float = 1.0,
    sample: int = 20,
    *,
    spark: SparkSession | None = None,
    conf: Mapping[str, str] | None = None,
    spark_log: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    allow_loss: bool = False,
    baseline: dict[str, Any] | None = None,
    exiting: bool = False,
) -> Report:
    """Audit the run in ``run_dir``, write report.json and report.html to ``out_dir``.

    ``master`` is a Spark master URL (default ``local[*]``); ``spark`` an already running
    session to use instead (it is left running; a session started here is stopped at the
    end). ``settle_s`` is the settle window, ``sample`` the number of examples kept per kind
    of anomaly. ``conf`` and ``spark_log`` go to :func:`spark_session`. ``progress`` is
    called with a short line at each phase, prefixed with the time since the start, and
    once at the end with each phase's duration. ``allow_loss`` goes into the report's
    verdict. ``baseline`` (from :func:`~gossiprouter.analytics.report.baseline.load_baseline`) is
    the earlier run the report compares with. Raises :class:`AuditInputError` for a run
    directory that is missing or holds no records, :class:`SparkStartError` when Spark
    cannot start. ``exiting``: the process ends right after (the command), so a session
    started here is left to end with it (its JVM exits when the process does, and Spark's
    shutdown hook stops the context) rather than stopped (about a second).
    """
    if settle_s < 0:
        raise ValueError("settle_s must not be negative")
    phases = Phases(progress or (lambda _line: None))
    started = phases.started
    # Fail before paying for a JVM when the input is plainly not there.
    check_run_dir(run_dir)
    if spark is None:
        # Settings sized for the run, before the caller's own (which win).
        conf = {**start_settings(master, input_bytes(run_dir)), **(conf or {})}
    if spark is None:
        # What the job imports later (pyarrow, matplotlib), imported while the JVM starts.
        threading.Thread(target=_preload, daemon=True).start()
    spark, own = open_session(spark, master, conf, spark_log, phases)
    try:
        report = _Job(spark, run_dir, out_dir, settle_s, sample, phases, started, allow_loss,
                      baseline).run()
    finally:
        if own:
            close_session(spark, phases, stop=not exiting)
    phases.finish()
    return report


class _Job:
    """One analysis run: builds the tables, summarises them, writes the report.

    The records are shuffled by msg_id into two cached tables (messages, (message,
    receiver) pairs; see :func:`~gossiprouter.analytics.deliveries.delivery_tables`). A
    handful of small aggregations over them give the counts, the end of the run, the
    latency histograms (both in one pass) and the per-second series; one more pass, with a
    shuffle by (group, sender, receiver), finds out-of-order deliveries and draws the
    anomaly samples (:func:`~gossiprouter.analytics.findings.sample_anomalies`; only the
    order when the counts found nothing else). Everything else is done in Python on the
    small aggregated results. docs/performance-spark.md tells what each choice bought.
    """

    def __init__(
        self,
        spark: SparkSession,
        run_dir: str,
        out_dir: str,
        settle_s: float,
        sample: int,
        phases: Phases,
        started: float,
        allow_loss: bool = False,
        baseline: dict[str, Any] | None = None,
    ) -> None:
        self.spark = spark
        self.run_dir = run_dir
        self.out_dir = out_dir
        self.store = RunStore(spark, run_dir)
        self.settle_ns = round(settle_s * NS_PER_S)
        self.settle_s = settle_s
        self.sample = max(0, sample)
        self.phases = phases
        self.started = started
        self.allow_loss = allow_loss
        self.baseline = baseline
        self.warnings: list[str] = []
        self._cached: list[DataFrame] = []

    def run(self) -> Report:
        # The job sets its partitioning itself and runs many small aggregations; adaptive
        # execution's re-planning and partition coalescing only add latency here (measured:
        # twice the wall time for the same CPU time, on 10 million records and on 150 alike).
        # The shuffle partitions of the small aggregations are sized by _run for the run.
        conf = self.spark.conf
        saved = {key: conf.get(key) for key in (_ADAPTIVE, _SHUFFLE_PARTITIONS)}
        conf.set(_ADAPTIVE, "false")
        try:
            return self._run()
        finally:
            for key, value in saved.items():
                if value is not None:
                    conf.set(key, value)

    def _run(self) -> Report:
        self.store.check_inputs()
        manifest = self.store.manifest(self.warnings)

        self.phases.start("reading", "reading records…")
        # A local run's membership and record count come from the Parquet files without a
        # Spark job (each job's fixed cost, and the first one's warm-up, are most of a small
        # run's analysis); a remote run's through Spark.
        local = _local_inputs(self.run_dir)
        if local is None:
            events = [(int(r["t_ns"]), str(r["group"]), str(r["member"]), str(r["event"]))
                      for r in self.store.timeline().collect()]
        intervals, warn = membership_intervals(local[0] if local else events)
        self.warnings += warn
        records = self.store.records()
        # Answered from the Parquet footers, by Spark or by pyarrow: cheap.
        n_records = local[1] if local else records.count()
        if n_records == 0:
            raise AuditInputError(f"no records in {self.run_dir} (the record files are empty)")
        # Enough partitions that no task's hash tables outgrow memory, and two per core
        # unless the partitions would be tiny (each task costs a fixed overhead); no more
        # for the small aggregations than for the main shuffle.
        parts = partitions(n_records, self.spark.sparkContext.defaultParallelism)
        shuffle = int(self.spark.conf.get(_SHUFFLE_PARTITIONS) or parts)
        self.spark.conf.set(_SHUFFLE_PARTITIONS, str(min(parts, shuffle)))
        origin = manifest_int(manifest, "t0_ns")
        outages, warn = router_outages(manifest)
        self.warnings += warn
        try:
            msgs, pairs = delivery_tables(self.spark, records, intervals, parts, outages,
                                                self.settle_ns, self._cache)
            self.phases.start("audit", "auditing…")
            pairs.count()  # materialises the cached tables
            if origin is None:
                # No manifest t0: the run starts with its first send.
                origin = int(msgs.agg({"t_send_ns": "min"}).collect()[0][0] or 0)
            self.phases.start("figures", "counting, measuring latency and throughput…")
            summary = self._summarise(msgs, pairs, origin, concurrent=parts == 1)
            self.phases.start("order", "checking order, drawing samples…")
            # The report but for what the order check and the samples find, none of which
            # the plots show: they are drawn while Spark works on those.
            report = self._report(manifest, n_records, summary, origin)
            plots = EarlyPlots(report)
            flagged = any(int(r["pairs"] or 0) for r in summary["categories"]
                          if r["category"] in _FLAGGED) or total(summary["categories"],
                                                                  "duplicated") > 0
            anomalies = sample_anomalies(pairs, parts, self.sample, flagged=flagged)
        finally:
            for df in self._cached:
                df.unpersist()

        self.phases.start("summary", "summarising…")
        report.audit = audit_from(summary["categories"], anomalies, origin)
        self.phases.start("report", "writing report…")
        report.analysis_s = round(time.monotonic() - self.started, 3)
        report.baseline = self.baseline
        write_report(report, self.out_dir, self.store.write, plots.images(report))
        return report

    def _cache(self, df: DataFrame) -> DataFrame:
        from pyspark import StorageLevel

        self._cached.append(df)
        return df.persist(StorageLevel.MEMORY_AND_DISK)

    def _summarise(
        self, msgs: DataFrame, pairs: DataFrame, origin_ns: int, concurrent: bool,
    ) -> dict[str, list[dict[str, Any]]]:
        """Small aggregations of the cached tables, as lists of rows by name, collected
        as concurrent jobs when ``concurrent`` (a run of one partition). Seconds are
        counted from ``origin_ns`` (the start of the run)."""
        from pyspark.sql import functions as F

        col, one = F.col, F.lit(1)
        delivered = col("copies") > 0

        def second(c: str) -> Any:
            return F.floor((col(c) - F.lit(origin_ns)) / NS_PER_S)

        got = _collect_all(concurrent=concurrent, frames={
            # The latency figures, from one pass over the delivered pairs.
            "latency": route_scopes(pairs.filter(delivered), second("t_send_ns"),
                                    every_bucket=concurrent),
            "senders": msgs.groupBy("run", "group", "sender").agg(
                F.count(one).alias("messages"),
                F.count_if(col("n_send") == 0).alias("no_send"),
                F.sum("n_send").alias("send_records"),
            ),
            "sends": msgs.groupBy(second("t_send_ns").alias("t")).agg(F.count(one).alias("n")),
            # With the last receive and send times of each row: the end of the run.
            "categories": pairs.groupBy("category", "receiver_status", "receiver",
                                        "group").agg(
                F.count(one).alias("pairs"),
                F.sum("copies").alias("recv_records"),
                F.count_if(col("copies") > 1).alias("duplicated"),
                F.sum(F.greatest(col("copies") - 1, F.lit(0))).alias("extra_copies"),
                F.max("t_recv_ns").alias("recv"),
                F.max("t_send_ns").alias("send"),
            ),
            # A pair is never both delivered and lost, so one grouping gives both series.
            "seconds": pairs.groupBy(
                F.when(delivered, second("t_recv_ns")).alias("recv_s"),
                F.when(col("category").isin("lost", "lost_reconnect"), second("t_send_ns"))
                .alias("lost_s"),
            ).agg(F.count(one).alias("n")),
        })
        return got

    def _report(
        self,
        manifest: dict[str, Any] | None,
        n_records: int,
        summary: Mapping[str, list[dict[str, Any]]],
        origin: int,
    ) -> Report:
        """The report, with the audit's counts but no anomaly found by the order check or
        sampled (the caller fills ``audit`` in once those are known)."""
        senders, cats = summary["senders"], summary["categories"]
        send_records, recv_records = total(senders, "send_records"), total(cats, "recv_records")
        bad = n_records - send_records - recv_records
        if bad:
            self.warnings.append(f"{bad:,} malformed records ignored (kind not send/recv, or "
                                 "a recv without receiver or t_recv_ns)")
        no_send = total(senders, "no_send")
        if no_send:
            self.warnings.append(f"{no_send:,} messages have recv records but no send record "
                                 "(sender's buffer lost?)")
        for w in (manifest or {}).get("warnings") or []:
            self.warnings.append(f"load test: {w}")

        audit = audit_from(cats, no_anomalies(), origin)
        latency = latency_breakdowns(summary["latency"])
        if latency.overall is not None and latency.overall.min_ns <= 0:
            self.warnings.append("some receive times precede their send time: the peers do "
                                 "not share one monotonic clock?")

        sends = {int(r["t"]): int(r["n"]) for r in summary["sends"] if r["t"] is not None}
        recvs = {int(r["recv_s"]): int(r["n"]) for r in summary["seconds"]
                 if r["recv_s"] is not None}
        lost = {int(r["lost_s"]): int(r["n"]) for r in summary["seconds"]
                if r["lost_s"] is not None}
        first = min([0, *sends])
        end_ns = run_end(manifest, origin, summary["categories"])
        last = max([*sends, *recvs, *lost, (end_ns - origin - 1) // NS_PER_S], default=0)
        throughput = [ThroughputBucket(
            s, sends.get(s, 0), recvs.get(s, 0), lost.get(s, 0),
            round(max(0.0, min(1.0, (end_ns - origin - s * NS_PER_S) / NS_PER_S)), 6))
            for s in range(first, last + 1)]

        received = {"delivered", "unexpected", "undetermined_delivered"}
        return Report(
            run_dir=self.run_dir,
            out_dir=self.out_dir,
            generated_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            settle_s=self.settle_s,
            spark_master=str(self.spark.sparkContext.master),
            spark_version=str(self.spark.version),
            analysis_s=0.0,
            manifest=manifest,
            runs=sorted({str(r["run"]) for r in senders}),
            counts=Counts(
                records=n_records,
                send_records=send_records,
                recv_records=recv_records,
                messages=total(senders, "messages"),
                messages_without_send_record=no_send,
                deliveries=total((r for r in cats if r["category"] in received), "pairs"),
                senders=len({r["sender"] for r in senders}),
                receivers=len({r["receiver"] for r in cats if r["category"] in received}),
                groups=len({r["group"] for r in senders}),
            ),
            audit=audit,
            latency=latency.overall,
            latency_by_group=latency.by_group,
            latency_by_size=latency.by_size,
            latency_by_cast=latency.by_cast,
            latency_histogram=latency.histogram,
            throughput=throughput,
            warnings=self.warnings,
            latency_over_time=latency.over_time,
            by_group=breakdowns(senders, cats, lambda name: name),
            by_process=by_process(manifest, senders, cats),
            events=run_events(manifest, origin),
            allow_loss=self.allow_loss,
        )


def _local_inputs(run_dir: str) -> tuple[list[tuple[int, str, str, str]], int] | None:
    """The membership events (t_ns, group, member, event), in file order, and the number of
    records of a local run whose membership timeline is one file (the rows Spark would
    read: every visible file of the records directory); None otherwise."""
    local = local_path(run_dir)
    if local is None or not (local / MEMBERSHIP_FILE).is_file():
        return None
    import pyarrow.parquet as pq

    t = pq.read_table(local / MEMBERSHIP_FILE, columns=["t_ns", "group", "member", "event"])
    events = [(int(a), str(b), str(c), str(d)) for a, b, c, d in zip(
        *(t.column(name).to_pylist() for name in t.column_names), strict=True)]
    files = sorted(p for p in (local / RECORDS_DIR).iterdir()
                   if p.is_file() and not p.name.startswith((".", "_")))
    return events, sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def _preload() -> None:
    """Import what the job needs after Spark's start (the Parquet footers, the plots)."""
    from gossiprouter.analytics.report.plots import preload

    with contextlib.suppress(ImportError):
        import pyarrow.parquet  # noqa: F401
    preload()


def _collect_all(frames: Mapping[str, DataFrame], concurrent: bool
                 ) -> dict[str, list[dict[str, Any]]]:
    """Collect the small aggregations ``frames`` (over the cached tables); ``concurrent``:
    as concurrent jobs, one thread each, so that each job's fixed cost (planning,
    scheduling) overlaps the others' (a small run: docs/performance-spark.md). A large run
    collects them one by one: five aggregations' hash tables at once would compete for
    memory, for no fixed cost worth overlapping."""
    from pyspark import InheritableThread

    if not concurrent:
        return {name: rows(df) for name, df in frames.items()}

    got: dict[str, list[dict[str, Any]]] = {}
    failed: list[BaseException] = []

    def collect(name: str, df: DataFrame) -> None:
        try:
            got[name] = rows(df)
        except BaseException as e:  # re-raised in the caller's thread
            failed.append(e)

    threads = [InheritableThread(target=collect, args=(name, df))
               for name, df in frames.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return got
