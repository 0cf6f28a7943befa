"""The PySpark audit of a topic-multicast load test (``gossiprouter loadtest-topics --out``).

:func:`analyze_topics` reads a topics run directory (layout in
:mod:`gossiprouter.loadtest.topic_records`) and computes, with Spark DataFrames, for every
publication its **expected receivers**: the subscribers that held, at the send time, a
pattern matching the publication's id, within its scope (``local``: the subscribers on
the publisher's router; ``global``: on every router). Against the deliveries recorded it
counts, per scope, the deliveries lost, duplicated and unexpected, and the latency
percentiles, then writes report.json and report.html with the machinery it shares with the
ROUTE audit (:mod:`gossiprouter.analytics.spark_io`: Spark session, progress, run directory;
:mod:`gossiprouter.analytics.latency`: latency histogram and percentiles;
:mod:`gossiprouter.analytics.report`: verdict, report files).

**A subscriber changing its patterns is in flux.** The router applies an UNSUBSCRIBE and a
SUBSCRIBE one after the other, and a remote router learns of them through the broker a
little later, so around a change the subscriber may or may not get a publication. From
``settle`` seconds before a subscription span starts or ends until it settled (the
``settled_*`` columns: accepted + settle), the subscriber is neither expected nor
unexpected for a publication (counted as *in flux*); that is the same rule as the
in-process audit of ``loadtest-topics``.

**Matching without a quadratic join.** Matching is done on the distinct topic ids and the
distinct patterns of the run, not on its rows: the patterns go into the router's own
:class:`gossiprouter.core.topics.TopicIndex` (a trie) and each distinct id is matched against
it, which costs the id's depth plus its matches, not the number of patterns. The
(topic, pattern) pairs that match are a small table, broadcast to an equi-join of the
publications (on the topic) with the subscription spans (on the pattern); only spans
that match a publication are ever paired with it. Exploding candidate patterns per
publication instead (every ``+``/``*`` variant of every level) would be exact too but
costs 2^depth rows per publication; a UDF calling
:func:`gossiprouter.core.topics.matches` on every (publication, span) pair would be the
quadratic join itself. The distinct ids are collected to the driver: their number is
bounded by the scenario's id space (a few per publisher), not by the run's length.
The flux test is a range join, made an equi-join on (subscriber, second) by exploding
each flux window into the seconds it covers.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gossiprouter.analytics.latency import (
    Bucket,
    bucket,
    histogram,
    latency_rows,
    latency_stats,
    over_time,
    second_scopes,
)
from gossiprouter.analytics.report.files import write_report
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import (
    Audit,
    Counts,
    Finding,
    LatencyStats,
    ScopeBreakdown,
    ThroughputBucket,
)
from gossiprouter.analytics.session import Phases, close_session, open_session
from gossiprouter.analytics.sizing import partitions
from gossiprouter.analytics.spark_io import (
    AuditInputError,
    RunStore,
    check_local_dir,
    local_frame,
    local_path,
    rows,
)
from gossiprouter.analytics.timeline import NS_PER_S
from gossiprouter.core.topics import TopicError, TopicIndex, parse_topic, pattern
from gossiprouter.loadtest.records import MANIFEST_FILE
from gossiprouter.loadtest.topic_records import (
    DELIVERIES_FILE,
    DELIVERY_SCHEMA,
    KIND,
    PUBLICATION_SCHEMA,
    PUBLICATIONS_FILE,
    SUBSCRIPTION_SCHEMA,
    SUBSCRIPTIONS_FILE,
    TOPICS_DIR,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["analyze_topics", "check_topics_run_dir", "match_table"]

# Flux windows are bucketed by this many ns for the equi-join (see the module docstring).
BUCKET_NS: Final = NS_PER_S
_SCOPES: Final = ("local", "global")
_SAMPLE_FIELDS: Final = ("pub_id", "topic", "scope", "publisher", "router", "receiver",
                         "t_send_ns", "copies")


def check_topics_run_dir(run_dir: str) -> None:
    """Raise :class:`AuditInputError` unless the (local) topics run directory holds its
    three record files."""
    local = local_path(run_dir)
    if local is None:
        return
    check_local_dir(local)
    for name in (PUBLICATIONS_FILE, SUBSCRIPTIONS_FILE, DELIVERIES_FILE):
        if not (local / TOPICS_DIR / name).exists():
            raise AuditInputError(f"no {TOPICS_DIR}/{name} in {run_dir} (a topics run "
                                  "written by gossiprouter loadtest-topics --out)")


def match_table(topics: list[str], patterns: list[str]) -> list[tuple[str, str]]:
    """Every (topic, pattern) pair, among the given distinct ids and patterns (in the
    ``provider/broadcast/partition...`` form), where the pattern matches the id, found with
    the router's own index. Malformed patterns match nothing."""
    index: TopicIndex[str] = TopicIndex()
    for p in patterns:
        try:
            index.subscribe(p, pattern(*parse_topic(p)))
        except TopicError:
            continue
    out: list[tuple[str, str]] = []
    for t in topics:
        try:
            tid = parse_topic(t)
        except TopicError:
            continue
        out += [(t, p) for p in sorted(index.match(tid))]
    return out


def analyze_topics(
    run_dir: str,
    out_dir: str,
    master: str | None = None,
    sample: int = 20,
    *,
    spark: SparkSession | None = None,
    conf: Mapping[str, str] | None = None,
    spark_log: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    allow_loss: bool = False,
    baseline: dict[str, Any] | None = None,
    exiting: bool = False,
) -> Report:
    """Audit the topics run in ``run_dir``; write report.json and report.html to
    ``out_dir``. The arguments are those of :func:`gossiprouter.analytics.audit.analyze`
    (the settle window comes from the run's manifest: the load test used it to record
    when a subscription settled)."""
    phases = Phases(progress or (lambda _line: None))
    check_topics_run_dir(run_dir)
    spark, own = open_session(spark, master, conf, spark_log, phases)
    try:
        report = _TopicsJob(spark, run_dir, out_dir, sample, phases, allow_loss, baseline).run()
    finally:
        if own:
            close_session(spark, phases, stop=not exiting)
    phases.finish()
    return report


class _TopicsJob:
    def __init__(self, spark: SparkSession, run_dir: str, out_dir: str, sample: int,
                 phases: Phases, allow_loss: bool,
                 baseline: dict[str, Any] | None = None) -> None:
        self.spark = spark
        self.run_dir = run_dir
        self.out_dir = out_dir
        self.store = RunStore(spark, run_dir)
        self.sample = max(0, sample)
        self.phases = phases
        self.allow_loss = allow_loss
        self.baseline = baseline
        self.warnings: list[str] = []

    def _manifest(self) -> dict[str, Any]:
        try:
            raw = self.store.read_bytes(MANIFEST_FILE)
            if raw is None:
                # The settle window is in it: without it nothing can be audited.
                raise AuditInputError(f"no {MANIFEST_FILE} in the topics run directory")
            data = json.loads(raw)
        except (OSError, ValueError) as e:
            raise AuditInputError(f"{MANIFEST_FILE} of the topics run unreadable: {e}") from None
        if not isinstance(data, dict):
            raise AuditInputError(f"{MANIFEST_FILE} is not a JSON object")
        return data

    def _read(self, name: str, schema: pa.Schema) -> DataFrame:
        return self.store.table(f"{TOPICS_DIR}/{name}", schema)

    def run(self) -> Report:
        started = self.phases.started
        manifest = self._manifest()
        settle = manifest.get("settle_s")
        if isinstance(settle, bool) or not isinstance(settle, int | float) or settle < 0:
            raise AuditInputError(f"{MANIFEST_FILE}: settle_s: expected seconds, got "
                                  f"{settle!r}")
        self.settle_ns = round(settle * NS_PER_S)
        self.phases.start("reading", "reading records…")
        pubs = self._read(PUBLICATIONS_FILE, PUBLICATION_SCHEMA)
        spans = self._read(SUBSCRIPTIONS_FILE, SUBSCRIPTION_SCHEMA)
        recv = self._read(DELIVERIES_FILE, DELIVERY_SCHEMA)
        n_pubs, n_recv = pubs.count(), recv.count()
        if n_pubs == 0:
            raise AuditInputError(f"no publications in {self.run_dir}")
        self.phases.start("audit", "auditing…")
        pairs = self._pairs(pubs, spans, recv)
        try:
            summary = self._summarise(pubs, pairs, recv, manifest, n_recv)
        finally:
            pairs.unpersist()
        self.phases.start("report", "writing report…")
        report = self._report(manifest, n_pubs, n_recv, summary, settle)
        report.analysis_s = round(time.monotonic() - started, 3)
        report.baseline = self.baseline
        write_report(report, self.out_dir, self.store.write)
        return report

    def _pairs(self, pubs: DataFrame, spans: DataFrame, recv: DataFrame) -> DataFrame:
        """One row per (publication, subscriber) that was expected or received: copies,
        first receive time, and category (delivered, lost, unexpected, in_flux)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        col = F.col
        topics = [str(r[0]) for r in pubs.select("topic").distinct().collect()]
        patterns = [str(r[0]) for r in spans.select("pattern").distinct().collect()]
        matched = local_frame(self.spark, match_table(topics, patterns),
                              "m_topic STRING, m_pattern STRING")
        t = col("t_send_ns")
        held = spans.select(col("subscriber").alias("receiver"),
                            col("router").alias("sub_router"), "pattern", "from_ns", "to_ns")
        # A subscriber is expected when a span of a matching pattern covers the send time
        # and the scope reaches its router; several matching spans still make one pair.
        expected = (pubs.join(F.broadcast(matched), col("topic") == col("m_topic"))
                    .join(held, (col("m_pattern") == col("pattern"))
                          & ((col("scope") == "global") | (col("sub_router") == col("router")))
                          & (col("from_ns") <= t) & (col("to_ns").isNull() | (t < col("to_ns"))))
                    .select("pub_id", "receiver").distinct()
                    .withColumn("expected", F.lit(True)))
        received = recv.groupBy("pub_id", "receiver").agg(
            F.count(F.lit(1)).alias("copies"), F.min("t_recv_ns").alias("t_recv_ns"))
        both = expected.join(received, ["pub_id", "receiver"], "full_outer").join(
            pubs.select("pub_id", "publisher", "router", "scope", "topic", "t_send_ns"),
            "pub_id", "left")

        # Flux windows: [start - settle, settled] around each span's start and end; a span
        # whose change never settled keeps the subscriber in flux to the end of the run.
        lead, never = F.lit(self.settle_ns), F.lit(2**62)
        last = int(pubs.agg(F.max("t_send_ns")).collect()[0][0])
        windows = spans.select("subscriber", (col("from_ns") - lead).alias("lo"),
                               F.coalesce("settled_from_ns", never).alias("hi")).unionByName(
            spans.filter(col("to_ns").isNotNull()).select(
                "subscriber", (col("to_ns") - lead).alias("lo"),
                F.coalesce("settled_to_ns", never).alias("hi")))
        buckets = windows.filter(col("lo") <= F.lit(last)).select(
            col("subscriber").alias("f_sub"), "lo", "hi",
            F.explode(F.sequence(F.floor(col("lo") / BUCKET_NS),
                                 F.floor(F.least(col("hi"), F.lit(last)) / BUCKET_NS)))
            .alias("bucket"))
        flux = both.join(
            buckets, (col("receiver") == col("f_sub"))
            & (F.floor(t / BUCKET_NS) == col("bucket"))
            & (col("lo") <= t) & (t <= col("hi")),
        ).select("pub_id", "receiver").distinct().withColumn("in_flux", F.lit(True))
        copies = F.coalesce(col("copies"), F.lit(0))
        pairs = both.join(flux, ["pub_id", "receiver"], "left").select(
            "pub_id", "receiver", "publisher", "router", "scope", "topic", "t_send_ns",
            copies.alias("copies"), "t_recv_ns",
            F.when(col("in_flux").isNotNull(), "in_flux")
            .when(col("expected").isNotNull() & (copies > 0), "delivered")
            .when(col("expected").isNotNull(), "lost")
            .otherwise("unexpected").alias("category"))
        return pairs.persist(StorageLevel.MEMORY_AND_DISK)

    def _summarise(self, pubs: DataFrame, pairs: DataFrame, recv: DataFrame,
                   manifest: dict[str, Any], n_recv: int) -> dict[str, Any]:
        from pyspark.sql import functions as F

        col, one = F.col, F.lit(1)
        t0 = manifest.get("t0_ns")
        origin = t0 if isinstance(t0, int) and not isinstance(t0, bool) else int(
            pubs.agg(F.min("t_send_ns")).collect()[0][0])

        def second(c: str) -> Any:
            return F.floor((col(c) - F.lit(origin)) / NS_PER_S)

        flagged = pairs.filter((col("category") != "delivered") | (col("copies") > 1))
        samples: dict[str, list[dict[str, Any]]] = {}
        for kind, cond in (("lost", col("category") == "lost"),
                           ("duplicated", (col("category") == "delivered")
                            & (col("copies") > 1)),
                           ("unexpected", col("category") == "unexpected"),
                           ("in_flux", col("category") == "in_flux")):
            picked = rows(flagged.filter(cond).orderBy("t_send_ns", "pub_id", "receiver")
                           .select(*_SAMPLE_FIELDS).limit(self.sample))
            samples[kind] = [{("t_send_s" if k == "t_send_ns" else k):
                              (None if v is None else round((v - origin) / NS_PER_S, 6))
                              if k == "t_send_ns" else v for k, v in r.items()} for r in picked]
        delivered = col("category") == "delivered"
        return {
            "origin": origin,
            "sent": rows(pubs.groupBy("scope").agg(F.count(one).alias("n"))),
            "publishers": pubs.select("publisher").distinct().count(),
            "categories": rows(pairs.groupBy("scope", "category").agg(
                F.count(one).alias("pairs"), F.sum("copies").alias("copies"),
                F.count_if(col("copies") > 1).alias("duplicated"),
                F.sum(F.greatest(col("copies") - 1, F.lit(0))).alias("extra"),
                F.countDistinct("receiver").alias("receivers"))),
            "receivers": pairs.filter(col("copies") > 0).select("receiver").distinct().count(),
            "orphans": pairs.filter(col("scope").isNull()).count(),
            "latency": latency_rows(pairs.filter(delivered), "scope"),
            # Per send second, for the percentiles over time: only the buckets that hold
            # them, unless the run is small: one partition, the ROUTE audit's rule.
            "latency_s": rows(second_scopes(
                pairs.filter(delivered), second("t_send_ns"),
                every_bucket=partitions(
                    n_recv, self.spark.sparkContext.defaultParallelism) == 1)),
            "sends": rows(pubs.groupBy(second("t_send_ns").alias("t")).agg(
                F.count(one).alias("n"))),
            "seconds": rows(pairs.groupBy(
                # Every first copy, audited or not (in flux): what the routers delivered.
                F.when(col("copies") > 0, second("t_recv_ns")).alias("recv_s"),
                F.when(col("category") == "lost", second("t_send_ns")).alias("lost_s"),
            ).agg(F.count(one).alias("n"))),
            "samples": samples,
            "scope_mismatch": recv.join(pubs.select("pub_id", col("scope").alias("sent_as")),
                                        "pub_id").filter(col("scope") != col("sent_as")).count(),
        }

    def _report(self, manifest: dict[str, Any], n_pubs: int, n_recv: int,
                s: dict[str, Any], settle: float) -> Report:
        by_scope = {scope: ScopeBreakdown() for scope in _SCOPES}
        for r in s["sent"]:
            by_scope.setdefault(str(r["scope"]), ScopeBreakdown()).sent = int(r["n"])
        for r in s["categories"]:
            # Copies of a publication with no record have no scope: "unknown".
            b = by_scope.setdefault(str(r["scope"] or "unknown"), ScopeBreakdown())
            n, copies = int(r["pairs"]), int(r["copies"] or 0)
            cat = r["category"]
            if cat in ("delivered", "lost"):
                b.expected += n
            if cat == "delivered":
                b.delivered += n
                b.duplicated += int(r["duplicated"] or 0)
                b.duplicate_copies += int(r["extra"] or 0)
            elif cat == "lost":
                b.lost += n
            elif cat == "unexpected":
                b.unexpected += copies
            elif cat == "in_flux":
                b.in_flux += n
        hist: dict[str, list[Bucket]] = {}
        for r in s["latency"]:
            hist.setdefault(str(r["scope"]), []).append(bucket(r))
        every = [b for bs in hist.values() for b in bs]
        for scope, bs in hist.items():
            by_scope[scope].latency = latency_stats(bs)
            by_scope[scope].histogram = histogram(bs, span=every)
        latency: LatencyStats | None = latency_stats(every)

        if s["orphans"]:
            self.warnings.append(f"{s['orphans']:,} (publication, receiver) pairs received "
                                 "with no publication record: counted as unexpected")
        if s["scope_mismatch"]:
            self.warnings.append(f"{s['scope_mismatch']:,} copies arrived with another scope "
                                 "than they were published with")
        for w in manifest.get("warnings") or []:
            self.warnings.append(f"load test: {w}")

        samples = s["samples"]
        tot = {k: sum(getattr(b, k) for b in by_scope.values()) for k in (
            "expected", "delivered", "lost", "duplicated", "duplicate_copies", "unexpected",
            "in_flux")}
        in_flux_delivered = sum(int(r["pairs"]) for r in s["categories"]
                                if r["category"] == "in_flux" and int(r["copies"] or 0) > 0)
        lost = Finding(tot["lost"], samples["lost"])
        audit = Audit(
            expected=tot["expected"], delivered=tot["delivered"], lost=lost,
            lost_registered=lost, lost_reconnect=Finding(0), lost_to_left=0, lost_to_killed=0,
            duplicated=Finding(tot["duplicated"], samples["duplicated"]),
            duplicate_copies=tot["duplicate_copies"],
            out_of_order=Finding(0), out_of_order_pairs=0,
            undetermined=Finding(tot["in_flux"], samples["in_flux"]),
            undetermined_delivered=in_flux_delivered,
            unexpected=Finding(tot["unexpected"], samples["unexpected"]))

        sends = {int(r["t"]): int(r["n"]) for r in s["sends"]}
        recvs = {int(r["recv_s"]): int(r["n"]) for r in s["seconds"] if r["recv_s"] is not None}
        lost_s = {int(r["lost_s"]): int(r["n"]) for r in s["seconds"]
                  if r["lost_s"] is not None}
        config = manifest.get("scenario_config")
        span_s = None
        if isinstance(config, dict) and isinstance(config.get("duration"), int | float):
            span_s = float(config["duration"]) + float(config.get("drain") or 0)
        last = max([*sends, *recvs, *lost_s, 0])
        end_s = span_s if span_s is not None else last + 1
        throughput = [ThroughputBucket(t, sends.get(t, 0), recvs.get(t, 0), lost_s.get(t, 0),
                                       round(max(0.0, min(1.0, end_s - t)), 6))
                      for t in range(0, max(last, int(end_s - 1e-9)) + 1)]
        received = sum(int(r["pairs"]) for r in s["categories"] if int(r["copies"] or 0) > 0)
        run = manifest.get("run")
        return Report(
            run_dir=self.run_dir, out_dir=self.out_dir,
            generated_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            settle_s=float(settle), spark_master=str(self.spark.sparkContext.master),
            spark_version=str(self.spark.version), analysis_s=0.0, manifest=manifest,
            runs=[str(run)] if run else [],
            counts=Counts(records=n_pubs + n_recv, send_records=n_pubs, recv_records=n_recv,
                          messages=n_pubs, messages_without_send_record=0,
                          deliveries=received, senders=int(s["publishers"]),
                          receivers=int(s["receivers"]), groups=1),
            audit=audit, latency=latency, latency_by_group={}, latency_by_size={},
            latency_by_cast={}, latency_histogram=histogram(every), throughput=throughput,
            warnings=self.warnings, allow_loss=self.allow_loss, kind=KIND,
            latency_over_time=over_time(s["latency_s"]),
            by_scope={k: v for k, v in by_scope.items() if v.sent or v.expected
                      or v.unexpected or k in _SCOPES},
        )
