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

This module is the job; reading and writing the run directory and starting Spark are
:mod:`gossiprouter.analytics.spark_io`'s (its public names still import from here).
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from gossiprouter.analytics.latency import (
    Bucket,
    bucket,
    bucket_aggregates,
    bucket_column,
    histogram,
    latency_stats,
    over_time,
)
from gossiprouter.analytics.report.files import write_report
from gossiprouter.analytics.report.manifest import run_events
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import (
    Audit,
    Breakdown,
    Counts,
    Finding,
    LatencyStats,
    ThroughputBucket,
    size_bucket,
)
from gossiprouter.analytics.spark_io import (
    DEFAULT_MASTER,
    AuditInputError,
    Phases,
    RunStore,
    SparkStartError,
    check_run_dir,
    local_path,
    loopback_master,
    open_session,
    rows,
    session_settings,
    spark_session,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "AuditInputError",
    "Interval",
    "SparkStartError",
    "analyze",
    "check_run_dir",
    "local_path",
    "loopback_master",
    "membership_intervals",
    "session_settings",
    "spark_session",
]

NS_PER_S: Final = 1_000_000_000
# Records per partition of the main shuffle: keeps each task's hash tables small.
RECORDS_PER_PARTITION: Final = 200_000


# ---------------------------------------------------------------------------------------------
# Membership timeline


@dataclass(frozen=True)
class Interval:
    """A span during which ``member`` belonged to ``group``: [start_ns, end_ns], end None if
    it never ended; next_start_ns is the start of the member's next interval, if any."""

    group: str
    member: str
    start_ns: int
    end_ns: int | None
    next_start_ns: int | None
    status: str
    """How the member's membership of the group ended in the run: "killed" if it was ever
    killed, else "left" if it ever left, else "stayed"."""


def membership_intervals(
    events: Iterable[tuple[int, str, str, str]],
) -> tuple[list[Interval], list[str]]:
    """Turn (t_ns, group, member, event) rows into membership intervals, plus warnings.

    Events are taken in time order (ties keep their order in ``events``). A join while
    already a member, and a leave/killed while not a member, are ignored with a warning.
    Intervals that touch (a rejoin at the very nanosecond of the leave) are merged, so the
    intervals of one member are strictly disjoint.
    """
    by_member: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for t_ns, group, member, event in events:
        by_member.setdefault((group, member), []).append((t_ns, event))
    intervals: list[Interval] = []
    warn: list[str] = []
    for (group, member), evs in sorted(by_member.items()):
        evs.sort(key=lambda e: e[0])  # stable: same-time events keep their file order
        kinds = {e for _, e in evs}
        status = "killed" if "killed" in kinds else "left" if "leave" in kinds else "stayed"
        spans: list[tuple[int, int | None]] = []
        start: int | None = None
        for t_ns, event in evs:
            if event == "join":
                if start is not None:
                    warn.append(f"membership: {member} joined {group} again at {t_ns} "
                                "without leaving")
                    continue
                if spans and spans[-1][1] is not None and spans[-1][1] >= t_ns:
                    start = spans.pop()[0]  # touching intervals: one continuous membership
                else:
                    start = t_ns
            elif event in ("leave", "killed"):
                if start is None:
                    warn.append(f"membership: {member} {event} {group} at {t_ns} "
                                "without being a member")
                    continue
                spans.append((start, t_ns))
                start = None
            else:
                warn.append(f"membership: unknown event {event!r} for {member} in {group}")
        if start is not None:
            spans.append((start, None))
        for i, (s, e) in enumerate(spans):
            nxt = spans[i + 1][0] if i + 1 < len(spans) else None
            intervals.append(Interval(group, member, s, e, nxt, status))
    return intervals, warn


# ---------------------------------------------------------------------------------------------
# The analysis


_SEND, _RECV, _BAD = 0, 1, 2  # record kinds, as codes
_STATUS_CODE: Final = {"stayed": 0, "left": 1, "killed": 2}

# Times in the samples are turned into seconds since the start of the run (t_send_s ...)
# by _Job._report.
_LOST_FIELDS: Final = ("msg_id", "group", "sender", "seq", "receiver", "cast", "t_send_ns",
                       "receiver_status")
_SAMPLE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "lost": _LOST_FIELDS,
    "lost_registered": _LOST_FIELDS,
    "lost_reconnect": _LOST_FIELDS,
    "undetermined": ("msg_id", "group", "sender", "seq", "receiver", "cast", "t_send_ns",
                     "t_recv_ns", "receiver_status"),
    "unexpected": ("msg_id", "group", "sender", "seq", "receiver", "cast", "dest",
                   "t_recv_ns"),
    "duplicated": ("msg_id", "group", "sender", "seq", "receiver", "copies"),
    "out_of_order": ("msg_id", "group", "sender", "seq", "receiver", "t_recv_ns",
                     "after_seq"),
}


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
    cannot start.
    """
    if settle_s < 0:
        raise ValueError("settle_s must not be negative")
    phases = Phases(progress or (lambda _line: None))
    started = phases.started
    # Fail before paying for a JVM when the input is plainly not there.
    check_run_dir(run_dir)
    spark, own = open_session(spark, master, conf, spark_log, phases)
    try:
        report = _Job(spark, run_dir, out_dir, settle_s, sample, phases, started, allow_loss,
                      baseline).run()
    finally:
        if own:
            spark.stop()
    phases.finish()
    return report


class _Job:
    """One analysis run: builds the tables, summarises them, writes the report.

    The records are shuffled once, by msg_id, into three cached tables (records, messages,
    (message, receiver) pairs; see :meth:`_tables`). A handful of small aggregations over
    them give the counts, the latency histograms and the per-second series; one more pass,
    with a shuffle by (group, sender, receiver), finds out-of-order deliveries and draws the
    anomaly samples. Everything else is done in Python on the small aggregated results.
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

    # -- stages -------------------------------------------------------------------------------

    def run(self) -> Report:
        # The job sets its partitioning itself and runs many small aggregations; adaptive
        # execution's re-planning and partition coalescing only add latency here (measured:
        # twice the wall time for the same CPU time, on 10 million records and on 150 alike).
        conf = self.spark.conf
        saved = conf.get("spark.sql.adaptive.enabled")
        conf.set("spark.sql.adaptive.enabled", "false")
        try:
            return self._run()
        finally:
            conf.set("spark.sql.adaptive.enabled", saved or "true")

    def _run(self) -> Report:
        self.store.check_inputs()
        manifest = self.store.manifest(self.warnings)

        self.phases.start("reading", "reading records…")
        timeline = self.store.timeline()
        events = [(int(r["t_ns"]), str(r["group"]), str(r["member"]), str(r["event"]))
                  for r in timeline.collect()]
        intervals, warn = membership_intervals(events)
        self.warnings += warn
        records = self.store.records()
        n_records = records.count()  # answered from the Parquet footers: cheap
        if n_records == 0:
            raise AuditInputError(f"no records in {self.run_dir} (the record files are empty)")
        # Enough partitions that no task's hash tables outgrow memory, and two per core
        # unless the partitions would be tiny (each task costs a fixed overhead).
        parts = max(-(-n_records // RECORDS_PER_PARTITION),
                    min(2 * self.spark.sparkContext.defaultParallelism,
                        -(-n_records // 10_000)))
        origin = _manifest_int(manifest, "t0_ns")
        outages = self._outages(manifest)
        try:
            recs, msgs, pairs = self._tables(records, intervals, parts, outages)
            self.phases.start("audit", "auditing…")
            pairs.count()  # materialises the cached tables
            recs.unpersist()  # pairs and msgs hold all that is needed from here on
            if origin is None:
                # No manifest t0: the run starts with its first send.
                origin = int(msgs.agg({"t_send_ns": "min"}).collect()[0][0] or 0)
            summary = self._summarise(msgs, pairs, origin)
            anomalies = self._anomalies(pairs, parts)
        finally:
            for df in self._cached:
                df.unpersist()

        self.phases.start("summary", "summarising latency and throughput…")
        report = self._report(manifest, n_records, summary, anomalies, origin)
        self.phases.start("report", "writing report…")
        report.analysis_s = round(time.monotonic() - self.started, 3)
        report.baseline = self.baseline
        write_report(report, self.out_dir, self.store.write)
        return report

    def _outages(self, manifest: dict[str, Any] | None) -> list[tuple[int, int, list[str]]]:
        """The router outages of the run, (down, every member registered again) in ns on the
        run's clock, from the events the driver recorded in the manifest, each with the
        members of the router that was down (the event's ``members``, written for a
        federated run): only the pairs whose sender or receiver is one of them were cut by
        it. An empty list: every pair (one router)."""
        played = (manifest or {}).get("events")
        config = (manifest or {}).get("scenario_config")
        scheduled = config.get("events") if isinstance(config, dict) else None
        restarts = [e for e in played if isinstance(e, dict)
                    and e.get("action") == "restart-router"] if isinstance(played, list) else []
        if not isinstance(played, list) and isinstance(scheduled, list) and any(
                isinstance(e, dict) and e.get("action") == "restart-router" for e in scheduled):
            self.warnings.append("the scenario restarts the router but the manifest does not "
                                 "say when: losses across those restarts cannot be told apart "
                                 "from other losses")
        out: list[tuple[int, int, list[str]]] = []
        for e in restarts:
            down = e.get("t_ns")
            if not isinstance(down, int):
                continue
            end = e.get("registered_ns")
            if not isinstance(end, int):
                # Not observed (the watch timed out): the outage lasts until the end of the
                # run, as far as the audit can tell.
                end = 2**62
                self.warnings.append(f"the router restart at {e.get('at')} s: the members "
                                     "were not seen registered again; every later loss is "
                                     "counted as across a reconnect")
            members = e.get("members")
            ok = isinstance(members, list) and all(isinstance(m, str) for m in members)
            out.append((down, end, members if ok and members else []))
        return out

    def _tables(
        self, records: DataFrame, intervals: list[Interval], parts: int,
        outages: list[tuple[int, int, list[str]]],
    ) -> tuple[DataFrame, DataFrame, DataFrame]:
        """The cached tables the analysis works from.

        ``recs``: the usable records, shuffled by msg_id. ``msgs``: one row per message with
        its attributes. ``pairs``: one row per (message, receiver) that was expected,
        undetermined or received, with copies received, first receive time and category.

        Everything is keyed by msg_id first, so the single shuffle of the records serves all
        three: Spark keeps the hash partitioning by msg_id through the aggregations, the
        broadcast join with the membership intervals, the union and the final join. (With
        adaptive execution on, Spark knows a cached table's partitioning only once the table
        is materialised; the counts before each next step keep that true either way.)
        """
        from pyspark.sql import functions as F

        col = F.col
        valid_recv = ((col("kind") == "recv") & col("receiver").isNotNull()
                      & col("t_recv_ns").isNotNull())
        # Small integer codes rather than strings wherever Spark aggregates a value: string
        # aggregation buffers force a sort-based aggregation, fixed-width ones allow hashing.
        k = F.when(col("kind") == "send", _SEND).when(valid_recv, _RECV).otherwise(_BAD)
        keys = ["sender", "group", "cast", "dest", "run"]
        nums = ["seq", "size", "t_send_ns"]
        recs = self._cache(records.select(
            "msg_id", "receiver", "t_recv_ns", *keys, *nums, k.alias("k")
        ).repartition(parts, "msg_id"))
        recs.count()
        # Receivers copy the message attributes from the payload, so recv rows stand in for a
        # send row the sender never flushed (a killed sender, say). The string attributes are
        # grouping keys (the same in every row of a message) so the aggregation can hash.
        msgs = self._cache(recs.filter(col("k") != _BAD).groupBy("msg_id", *keys).agg(
            *[F.max(c).alias(c) for c in nums],
            F.count_if(col("k") == _SEND).alias("n_send"),
        ))
        msgs.count()

        iv = self.spark.createDataFrame(
            [(i.group, i.member, i.start_ns, i.end_ns, i.next_start_ns, _STATUS_CODE[i.status])
             for i in intervals],
            "iv_group STRING, member STRING, start_ns BIGINT, end_ns BIGINT, "
            "next_start_ns BIGINT, status INT",
        )
        t_send = col("t_send_ns")
        window_end = t_send + F.lit(self.settle_ns)
        # Of a member's (disjoint) intervals only the last one starting by the end of the
        # window can overlap the window, so each (message, member) yields at most one row.
        candidates = msgs.join(
            F.broadcast(iv),
            (col("group") == col("iv_group"))
            & (col("member") != col("sender"))
            & ((col("cast") == "multicast") | (col("member") == col("dest")))
            & (col("start_ns") <= window_end)
            & (col("next_start_ns").isNull() | (col("next_start_ns") > window_end))
            & (col("end_ns").isNull() | (col("end_ns") >= t_send)),
        ).select(
            "msg_id", col("member").alias("receiver"), F.lit(0).alias("copy"),
            F.lit(None).cast("bigint").alias("t_recv_ns"),
            ((col("start_ns") <= t_send)
             & (col("end_ns").isNull() | (col("end_ns") >= window_end))).alias("expected"),
            "status",
        )
        received = recs.filter(col("k") == _RECV).select(
            "msg_id", "receiver", F.lit(1).alias("copy"), "t_recv_ns",
            F.lit(None).cast("boolean").alias("expected"), F.lit(None).cast("int").alias("status"),
        )
        per_pair = candidates.unionByName(received).groupBy("msg_id", "receiver").agg(
            F.sum("copy").alias("copies"),
            F.min("t_recv_ns").alias("t_recv_ns"),
            F.max("expected").alias("expected"),
            F.max("status").alias("status"),
        )
        copies, expected, status = col("copies"), col("expected"), col("status")
        # A loss whose window [t_send, t_send + settle] overlaps a router outage (down until
        # every member was registered again) happened across a reconnect; in a federation,
        # only if the sender or the receiver is on the router that was down.
        across = F.lit(False)
        for start, end, members in outages:
            cut = (t_send <= F.lit(end)) & (window_end >= F.lit(start))
            if members:
                cut = cut & (col("sender").isin(members) | col("receiver").isin(members))
            across = across | cut
        pairs = self._cache(per_pair.join(
            # Both sides are already partitioned by msg_id: a per-partition hash join avoids
            # sorting them.
            msgs.select("msg_id", *keys, *nums).hint("shuffle_hash"), "msg_id",
        ).select(
            "msg_id", "receiver", *keys, *nums, "copies", "t_recv_ns",
            F.when(status == _STATUS_CODE["stayed"], "stayed")
            .when(status == _STATUS_CODE["left"], "left")
            .when(status == _STATUS_CODE["killed"], "killed")
            .alias("receiver_status"),
            F.when(expected.isNull(), "unexpected")
            .when(expected & (copies > 0), "delivered")
            .when(expected & across, "lost_reconnect")
            .when(expected, "lost")
            .when(copies > 0, "undetermined_delivered")
            .otherwise("undetermined_missing")
            .alias("category"),
        ))
        return recs, msgs, pairs

    def _cache(self, df: DataFrame) -> DataFrame:
        from pyspark import StorageLevel

        self._cached.append(df)
        return df.persist(StorageLevel.MEMORY_AND_DISK)

    def _summarise(
        self, msgs: DataFrame, pairs: DataFrame, origin_ns: int,
    ) -> dict[str, list[dict[str, Any]]]:
        """Small aggregations of the cached tables, as lists of rows by name. Seconds are
        counted from ``origin_ns`` (the start of the run)."""
        from pyspark.sql import functions as F

        col, one = F.col, F.lit(1)
        delivered = col("copies") > 0
        lat = col("t_recv_ns") - col("t_send_ns")
        q = bucket_column(lat)

        def second(c: str) -> Any:
            return F.floor((col(c) - F.lit(origin_ns)) / NS_PER_S)

        return {
            "ends": rows(pairs.agg(F.max("t_recv_ns").alias("recv"),
                                    F.max("t_send_ns").alias("send"))),
            "senders": rows(msgs.groupBy("run", "group", "sender").agg(
                F.count(one).alias("messages"),
                F.count_if(col("n_send") == 0).alias("no_send"),
                F.sum("n_send").alias("send_records"),
            )),
            "sends": rows(msgs.groupBy(second("t_send_ns").alias("t"))
                           .agg(F.count(one).alias("n"))),
            "categories": rows(pairs.groupBy("category", "receiver_status", "receiver",
                                              "group").agg(
                F.count(one).alias("pairs"),
                F.sum("copies").alias("recv_records"),
                F.count_if(col("copies") > 1).alias("duplicated"),
                F.sum(F.greatest(col("copies") - 1, F.lit(0))).alias("extra_copies"),
            )),
            # The fine latency histogram per (group, size, cast); the breakdowns and the
            # overall figures are merged from it in Python.
            "latency": rows(
                pairs.filter(delivered)
                .groupBy("group", "size", "cast", q)
                .agg(*bucket_aggregates(lat))),
            # The same histogram per send second, for the percentiles over time.
            "latency_s": rows(
                pairs.filter(delivered)
                .groupBy(second("t_send_ns").alias("t"), q)
                .agg(*bucket_aggregates(lat))),
            # A pair is never both delivered and lost, so one grouping gives both series.
            "seconds": rows(pairs.groupBy(
                F.when(delivered, second("t_recv_ns")).alias("recv_s"),
                F.when(col("category").isin("lost", "lost_reconnect"), second("t_send_ns"))
                .alias("lost_s"),
            ).agg(F.count(one).alias("n"))),
        }

    def _anomalies(
        self, pairs: DataFrame, parts: int,
    ) -> dict[str, tuple[int, int, list[dict[str, Any]]]]:
        """For each kind of anomaly: (count, distinct (group, sender, receiver), sample)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        col, cat = F.col, F.col("category")
        common = ["msg_id", "group", "sender", "seq", "receiver", "cast", "dest", "t_send_ns",
                  "t_recv_ns", "receiver_status", "copies"]
        flagged = pairs.filter(
            cat.isin("lost", "lost_reconnect", "unexpected", "undetermined_delivered",
                     "undetermined_missing") | (col("copies") > 1)
        ).select(
            F.explode(F.array_compact(F.array(
                F.when(cat.isin("lost", "lost_reconnect"), "lost"),
                F.when(cat == "lost", "lost_registered"),
                F.when(cat == "lost_reconnect", "lost_reconnect"),
                F.when(cat.startswith("undetermined"), "undetermined"),
                F.when(cat == "unexpected", "unexpected"),
                F.when(col("copies") > 1, "duplicated"),
            ))).alias("kind"),
            *common, F.lit(None).cast("bigint").alias("after_seq"),
        )
        # Out of order: a first copy that arrives after a higher seq from the same sender in
        # the same group (one router connection each way, so FIFO is expected there). Ties in
        # receive time are broken by seq so that they never count.
        w = (Window.partitionBy("group", "sender", "receiver")
             .orderBy("t_recv_ns", "seq")
             .rowsBetween(Window.unboundedPreceding, -1))
        null_str = F.lit(None).cast("string")
        late = (pairs.filter(col("copies") > 0)
                .select("msg_id", "group", "sender", "seq", "receiver", "t_recv_ns")
                .repartition(parts, "group", "sender", "receiver")
                .withColumn("after_seq", F.max("seq").over(w))
                .filter(col("seq") < col("after_seq"))
                .select(F.lit("out_of_order").alias("kind"), "msg_id", "group", "sender", "seq",
                        "receiver", null_str.alias("cast"), null_str.alias("dest"),
                        F.lit(None).cast("bigint").alias("t_send_ns"), "t_recv_ns",
                        null_str.alias("receiver_status"),
                        F.lit(None).cast("bigint").alias("copies"), "after_seq"))
        order = ["group", "sender", "seq", "receiver"]
        by_kind = Window.partitionBy("kind")
        ranked = (
            flagged.unionByName(late)
            .withColumn("rn", F.row_number().over(by_kind.orderBy(*order)))
            .withColumn("pair_rank",
                        F.dense_rank().over(by_kind.orderBy("group", "sender", "receiver")))
            .withColumn("n", F.count(F.lit(1)).over(by_kind))
            .withColumn("pairs", F.max("pair_rank").over(by_kind))
            .filter(col("rn") <= max(self.sample, 1))
        )
        found: dict[str, tuple[int, int, list[dict[str, Any]]]] = {
            kind: (0, 0, []) for kind in _SAMPLE_FIELDS}
        for r in sorted(rows(ranked), key=lambda r: int(r["rn"])):
            sample = found[r["kind"]][2]
            if len(sample) < self.sample:
                sample.append({f: r[f] for f in _SAMPLE_FIELDS[r["kind"]]})
            found[r["kind"]] = (int(r["n"]), int(r["pairs"]), sample)
        return found

    def _report(
        self,
        manifest: dict[str, Any] | None,
        n_records: int,
        summary: Mapping[str, list[dict[str, Any]]],
        anomalies: Mapping[str, tuple[int, int, list[dict[str, Any]]]],
        origin: int,
    ) -> Report:
        senders, cats = summary["senders"], summary["categories"]

        def total(rows: Iterable[Mapping[str, Any]], field: str) -> int:
            return sum(int(r[field] or 0) for r in rows)

        def count(category: str, status: str | None = None) -> int:
            return total((r for r in cats if r["category"] == category
                          and (status is None or r["receiver_status"] == status)), "pairs")

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

        def relative(sample: dict[str, Any]) -> dict[str, Any]:
            # Monotonic nanoseconds mean nothing to a reader: seconds since the start.
            return {(k[:-3] + "_s" if k in ("t_send_ns", "t_recv_ns") else k):
                    (None if v is None else round((v - origin) / NS_PER_S, 6))
                    if k in ("t_send_ns", "t_recv_ns") else v
                    for k, v in sample.items()}

        def finding(kind: str, n: int | None = None) -> Finding:
            found, _, sample = anomalies[kind]
            return Finding(found if n is None else n, [relative(x) for x in sample])

        lost_all = count("lost") + count("lost_reconnect")
        undetermined = count("undetermined_delivered") + count("undetermined_missing")
        audit = Audit(
            expected=count("delivered") + lost_all,
            delivered=count("delivered"),
            lost=finding("lost", lost_all),
            lost_registered=finding("lost_registered", count("lost")),
            lost_reconnect=finding("lost_reconnect", count("lost_reconnect")),
            lost_to_left=count("lost", "left"),
            lost_to_killed=count("lost", "killed"),
            duplicated=finding("duplicated", total(cats, "duplicated")),
            duplicate_copies=total(cats, "extra_copies"),
            out_of_order=finding("out_of_order"),
            out_of_order_pairs=anomalies["out_of_order"][1],
            undetermined=finding("undetermined", undetermined),
            undetermined_delivered=count("undetermined_delivered"),
            unexpected=finding("unexpected", count("unexpected")),
        )

        # Merge the (group, size, cast, q) histogram into the breakdowns. Sizes go into
        # power-of-two buckets: a run with sizes drawn from a range has hundreds of them.
        merged: dict[tuple[str, str], dict[int, Bucket]] = {}

        def merge(key: tuple[str, str], b: Bucket) -> None:
            into = merged.setdefault(key, {})
            old = into.get(b.q)
            into[b.q] = b if old is None else Bucket(
                b.q, old.n + b.n, min(old.lo, b.lo), max(old.hi, b.hi), old.total + b.total)

        for r in summary["latency"]:
            b = bucket(r)
            lo, _ = size_bucket(int(r["size"]))
            for key in (("all", ""), ("group", str(r["group"])), ("size", str(lo)),
                        ("cast", str(r["cast"]))):
                merge(key, b)

        def breakdown(kind: str) -> dict[str, LatencyStats]:
            out = {key: latency_stats(bs.values())
                   for (k, key), bs in merged.items() if k == kind}
            return {k: v for k, v in out.items() if v is not None}

        size_label = size_labels(int(r["size"]) for r in summary["latency"])
        overall = list(merged.get(("all", ""), {}).values())
        latency = latency_stats(overall)
        if latency is not None and latency.min_ns <= 0:
            self.warnings.append("some receive times precede their send time: the peers do "
                                 "not share one monotonic clock?")

        sends = {int(r["t"]): int(r["n"]) for r in summary["sends"] if r["t"] is not None}
        recvs = {int(r["recv_s"]): int(r["n"]) for r in summary["seconds"]
                 if r["recv_s"] is not None}
        lost = {int(r["lost_s"]): int(r["n"]) for r in summary["seconds"]
                if r["lost_s"] is not None}
        first = min([0, *sends])
        end_ns = _run_end(manifest, origin, summary["ends"])
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
            latency=latency,
            latency_by_group=dict(sorted(breakdown("group").items())),
            latency_by_size={size_label[int(k)]: v for k, v in
                             sorted(breakdown("size").items(), key=lambda kv: int(kv[0]))},
            latency_by_cast=dict(sorted(breakdown("cast").items())),
            latency_histogram=histogram(overall),
            throughput=throughput,
            warnings=self.warnings,
            latency_over_time=over_time(summary["latency_s"]),
            by_group=_breakdowns(senders, cats, lambda name: name),
            by_process=_by_process(manifest, senders, cats),
            events=run_events(manifest, origin),
            allow_loss=self.allow_loss,
        )


def size_labels(sizes: Iterable[int]) -> dict[int, str]:
    """Labels of the power-of-two size buckets, by their lower bound: a bucket that holds
    one size only is named by it ("64"), else by its range ("64-127")."""
    ranges: dict[int, tuple[int, int]] = {}
    for size in sizes:
        lo, _ = size_bucket(size)
        seen = ranges.get(lo, (size, size))
        ranges[lo] = (min(seen[0], size), max(seen[1], size))
    return {lo: str(a) if a == b else f"{lo}-{size_bucket(lo)[1]}"
            for lo, (a, b) in ranges.items()}


def _manifest_int(manifest: dict[str, Any] | None, key: str) -> int | None:
    value = (manifest or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _run_end(manifest: dict[str, Any] | None, origin: int,
             ends: list[dict[str, Any]]) -> int:
    """When the run ended, on its clock: t0 + duration + drain from the manifest, else the
    last send or receive time."""
    config = (manifest or {}).get("scenario_config")
    if _manifest_int(manifest, "t0_ns") == origin and isinstance(config, dict) and isinstance(
            config.get("duration"), int | float):
        return origin + round((float(config["duration"]) + float(config.get("drain") or 0))
                              * NS_PER_S)
    last = [int(v) for r in ends for v in (r["recv"], r["send"]) if v is not None]
    return max(last, default=origin) + 1


_CATEGORY_FIELD: Final = {"delivered": "delivered", "lost": "lost_registered",
                          "lost_reconnect": "lost_reconnect",
                          "undetermined_delivered": "undetermined",
                          "undetermined_missing": "undetermined"}


def _breakdowns(
    senders: list[dict[str, Any]],
    cats: list[dict[str, Any]],
    key: Callable[[str], str | None],
    by: str = "group",
) -> dict[str, Breakdown]:
    """Breakdowns keyed by ``key(row[by])`` (rows whose key is None are left out): sends
    by sender (or group), the rest by receiver (or group)."""
    out: dict[str, Breakdown] = {}
    for r in senders:
        k = key(str(r["group" if by == "group" else "sender"]))
        if k is not None:
            out.setdefault(k, Breakdown()).sent += int(r["messages"] or 0)
    for r in cats:
        k = key(str(r["group" if by == "group" else "receiver"]))
        if k is None:
            continue
        b = out.setdefault(k, Breakdown())
        field = _CATEGORY_FIELD.get(str(r["category"]))
        n = int(r["pairs"] or 0)
        if field is not None:
            setattr(b, field, getattr(b, field) + n)
        if r["category"] in ("delivered", "lost", "lost_reconnect"):
            b.expected += n
        b.duplicated += int(r["duplicated"] or 0)
    return dict(sorted(out.items()))


def _by_process(
    manifest: dict[str, Any] | None,
    senders: list[dict[str, Any]],
    cats: list[dict[str, Any]],
) -> dict[str, Breakdown]:
    """Breakdowns by peer process ("p0", ...), from the manifest's list of processes."""
    procs = (manifest or {}).get("processes")
    if not isinstance(procs, list):
        return {}
    of: dict[str, str] = {}
    for p in procs:
        if isinstance(p, dict) and isinstance(p.get("members"), list):
            for m in p["members"]:
                of[str(m)] = f"p{p.get('proc')}"
    if not of:
        return {}
    found = _breakdowns(senders, cats, of.get, by="member")
    return dict(sorted(found.items(), key=lambda kv: (len(kv[0]), kv[0])))
