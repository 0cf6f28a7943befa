"""Latency figures of an audit, from a fine logarithmic histogram: one home for the ROUTE
audit (:mod:`gossiprouter.analytics.audit`) and the topics audit
(:mod:`gossiprouter.analytics.topics_audit`).

Latency percentiles come from a fine logarithmic histogram: buckets 0.1 % wide, each with
its count and exact min, max and sum. The rank of each percentile is exact; its value is
exact when the bucket holds one distinct value, else interpolated within the bucket (error
under 0.1 %). Unlike percentile_approx at a high accuracy this costs one cheap
aggregation, and the same histogram draws the latency plot.

Spark computes the buckets (:func:`bucket_column`, :func:`bucket_aggregates`). A figure
drawn as a histogram collects every bucket of its scope (:func:`latency_rows`); a scope
whose percentiles alone are shown collects only the few buckets that hold them
(:func:`kept_buckets`: a scope per send second in a large run, :func:`route_scopes` and
:func:`second_scopes`), so that what the driver collects does not grow with the run's
length by thousands of rows a second. The figures are made from the collected rows in
Python (:func:`bucket`, :func:`latency_stats`, :func:`scope_stats`, :func:`histogram`,
:func:`over_time`; for the ROUTE audit's breakdowns by group, payload size, cast and
second, :func:`latency_breakdowns`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from gossiprouter.analytics.report.parts import (
    Histogram,
    LatencyPoint,
    LatencyStats,
    size_bucket,
)
from gossiprouter.analytics.spark_io import rows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["HISTOGRAM_BINS", "LATENCY_PRECISION", "Bucket", "LatencyBreakdowns", "bucket",
           "bucket_aggregates", "bucket_column", "histogram", "kept_buckets",
           "latency_breakdowns", "latency_rows", "latency_stats", "over_time",
           "route_scopes", "scope_stats", "second_scopes", "size_labels"]

HISTOGRAM_BINS: Final = 80
LATENCY_PRECISION: Final = 0.001
_LOG_STEP: Final = math.log1p(LATENCY_PRECISION)
# (numerator, denominator) of p50, p90, p95, p99, p99.9: integer arithmetic for exact ranks.
_PERCENTILE_FRACTIONS: Final = ((1, 2), (9, 10), (19, 20), (99, 100), (999, 1000))


@dataclass(frozen=True)
class Bucket:
    """One bucket of the fine histogram: its index ``q``, count, min, max and sum (ns)."""

    q: int
    n: int
    lo: int
    hi: int
    total: int


def bucket_column(lat: Column) -> Column:
    """The Spark column ``q``: the fine bucket of the latency ``lat`` (ns)."""
    from pyspark.sql import functions as F

    one = F.lit(1)
    return F.round(F.log(F.greatest(lat, one)) / F.lit(_LOG_STEP)).cast("int").alias("q")


def bucket_aggregates(lat: Column) -> list[Column]:
    """The aggregates of one bucket (``n``, ``lo``, ``hi``, ``total``), for a groupBy that
    includes :func:`bucket_column`; :func:`bucket` reads them back."""
    from pyspark.sql import functions as F

    return [F.count(F.lit(1)).alias("n"), F.min(lat).alias("lo"), F.max(lat).alias("hi"),
            F.sum(lat).alias("total")]


def latency_rows(delivered: DataFrame, *keys: str | Column) -> list[dict[str, Any]]:
    """The fine histogram of the latency (receive time minus send time) of the
    ``delivered`` pairs, grouped by ``keys`` and the bucket, collected: one row per group
    and bucket, for :func:`bucket`. Every bucket: for figures drawn as histograms; the
    percentiles alone need far fewer (:func:`kept_buckets`)."""
    return rows(_buckets(delivered, *keys))


def _buckets(delivered: DataFrame, *keys: str | Column) -> DataFrame:
    """The fine histogram of the ``delivered`` pairs' latency per ``keys`` and bucket."""
    from pyspark.sql import functions as F

    lat = F.col("t_recv_ns") - F.col("t_send_ns")
    return delivered.groupBy(*keys, bucket_column(lat)).agg(*bucket_aggregates(lat))


def kept_buckets(buckets: DataFrame, scope: Sequence[str],
                 keep_all: Column | None = None) -> DataFrame:
    """Of ``buckets`` (one row per scope, named by the columns ``scope``, and bucket ``q``,
    with :func:`bucket_aggregates`), the rows the latency figures of each scope need: the
    buckets that hold a percentile's rank, the first (the minimum) and the last (the
    maximum), and every bucket where ``keep_all`` holds (a scope drawn as a histogram).
    Each row gains ``seen`` (the scope's latencies in lower buckets), ``scope_n`` and
    ``scope_sum`` (the scope's count and sum), so that :func:`scope_stats` needs no other
    bucket.

    At most 7 rows per scope, however wide its latencies spread over the 0.1 % buckets
    (thousands of them): with a scope per second, what the driver collects no longer
    grows with the run's length by thousands of rows a second."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col = F.col
    whole = Window.partitionBy(*scope)
    below = whole.orderBy("q").rowsBetween(Window.unboundedPreceding, -1)
    out = buckets.select(
        "*", F.coalesce(F.sum("n").over(below), F.lit(0)).alias("seen"),
        F.sum("n").over(whole).alias("scope_n"), F.sum("total").over(whole).alias("scope_sum"))
    seen, n = col("seen"), col("n")
    keep = (seen == 0) | (seen + n == col("scope_n"))
    for num, den in _PERCENTILE_FRACTIONS:
        # The nearest rank of latency_stats, max(1, ceil(scope_n * num / den)), in integers.
        rank = F.greatest(F.lit(1), F.expr(f"(scope_n * {num} + {den - 1}) div {den}"))
        keep = keep | ((seen < rank) & (rank <= seen + n))
    if keep_all is not None:
        keep = keep | keep_all
    return out.filter(keep)


def second_scopes(delivered: DataFrame, second: Column, every_bucket: bool = False
                  ) -> DataFrame:
    """The latency of the ``delivered`` pairs per send second (``second``, named ``t``): the
    rows of :func:`kept_buckets` for :func:`over_time`, or every bucket of each second when
    ``every_bucket`` (a small run: see :func:`route_scopes`)."""
    buckets = _buckets(delivered, second.alias("t"))
    return buckets if every_bucket else kept_buckets(buckets, ["t"])


# grouping_id() of route_scopes' two grouping sets (a bit per column of group, size, cast, t,
# q, set when the column is not grouped).
_BY_KIND: Final = 0b00010
_BY_SECOND: Final = 0b11100


def route_scopes(delivered: DataFrame, second: Column, every_bucket: bool = False
                 ) -> DataFrame:
    """The latency figures of a ROUTE run's ``delivered`` pairs: collected, for
    :func:`latency_breakdowns`. One pass over the pairs makes the fine histogram per
    (group, size, cast) and per send second (``second``), told apart by their grouping id
    (``gid``). The first is kept whole (the breakdowns and the histogram are merged from
    it; its size is bound by the buckets' precision, not by the run's length); of the
    second, only the buckets :func:`kept_buckets` keeps (a run of an hour has thousands of
    buckets in each of its 3,600 seconds), unless ``every_bucket``: a small run's few
    thousand rows cost less to collect than the window job that would cut them."""
    from pyspark.sql import functions as F

    col = F.col
    lat = col("t_recv_ns") - col("t_send_ns")
    fine = (delivered
            .select("group", "size", "cast", second.alias("t"), bucket_column(lat),
                    lat.alias("lat"))
            .groupingSets([["group", "size", "cast", "q"], ["t", "q"]],
                          "group", "size", "cast", "t", "q")
            .agg(*bucket_aggregates(col("lat")), F.grouping_id().alias("gid")))
    if every_bucket:
        return fine
    return kept_buckets(fine, ["gid", "t"], keep_all=col("gid") == _BY_KIND)


def bucket(row: Mapping[str, Any]) -> Bucket:
    """The bucket of a collected row of :func:`bucket_column` and :func:`bucket_aggregates`."""
    return Bucket(int(row["q"]), int(row["n"]), int(row["lo"]), int(row["hi"]),
                  int(row["total"]))


def latency_stats(buckets: Iterable[Bucket]) -> LatencyStats | None:
    """Count, min, mean, percentiles and max of the latencies in ``buckets`` (None if none)."""
    bs = sorted((b for b in buckets if b.n > 0), key=lambda b: b.q)
    kept, seen = [], 0
    for b in bs:
        kept.append((seen, b))
        seen += b.n
    return _stats(kept, seen, sum(b.total for b in bs))


def scope_stats(rows: Iterable[Mapping[str, Any]]) -> LatencyStats | None:
    """The :func:`latency_stats` of one scope, from its rows of :func:`kept_buckets` (the
    buckets it needs, each with the latencies below it and the scope's count and sum), or
    from every bucket of the scope (rows without ``seen``)."""
    rs = sorted(rows, key=lambda r: int(r["q"]))
    if not rs or "seen" not in rs[0]:
        return latency_stats(bucket(r) for r in rs)
    return _stats([(int(r["seen"]), bucket(r)) for r in rs], int(rs[0]["scope_n"]),
                  int(rs[0]["scope_sum"]))


def _stats(kept: list[tuple[int, Bucket]], n: int, total: int) -> LatencyStats | None:
    """The figures of a scope of ``n`` latencies summing to ``total`` from ``kept``: its
    buckets in order, each with the count of the latencies in lower buckets (``seen``);
    every bucket, or at least the first, the last and each one holding a percentile's
    rank."""
    if n == 0 or not kept:
        return None

    def value_at(rank: int) -> int:  # nearest-rank: the rank-th smallest latency, 1-based
        for seen, b in kept:
            if seen + b.n >= rank:
                if b.n == 1 or b.lo == b.hi:
                    return b.lo
                return b.lo + round((b.hi - b.lo) * (rank - seen - 1) / (b.n - 1))
        return kept[-1][1].hi

    p50, p90, p95, p99, p999 = (value_at(max(1, -(-n * num // den)))
                                for num, den in _PERCENTILE_FRACTIONS)
    return LatencyStats(
        count=n,
        min_ns=kept[0][1].lo,
        mean_ns=total / n,
        p50_ns=p50,
        p90_ns=p90,
        p95_ns=p95,
        p99_ns=p99,
        p999_ns=p999,
        max_ns=kept[-1][1].hi,
    )


def histogram(buckets: Iterable[Bucket], span: Iterable[Bucket] | None = None) -> Histogram:
    """Re-bin the fine buckets into HISTOGRAM_BINS log-spaced bins for the plot; the bins
    cover the buckets of ``span`` when given (histograms drawn together share their
    bins: a topics run's local and global latency)."""
    bs = [b for b in buckets if b.n > 0]
    if not bs:
        return Histogram(edges_ns=[], counts=[])
    edges = [b for b in span if b.n > 0] if span is not None else bs
    lo = math.log10(max(min(b.lo for b in edges), 1))
    hi = math.log10(max(max(b.hi for b in edges), 1)) + 1e-9
    width = max(hi - lo, 1e-6) / HISTOGRAM_BINS
    counts = [0] * HISTOGRAM_BINS
    for b in bs:
        i = int((math.log10(max(b.lo, 1)) - lo) / width)
        counts[min(max(i, 0), HISTOGRAM_BINS - 1)] += b.n
    return Histogram(edges_ns=[10 ** (lo + i * width) for i in range(HISTOGRAM_BINS + 1)],
                     counts=counts)


def over_time(rows: Iterable[Mapping[str, Any]]) -> list[LatencyPoint]:
    """The latency of each send second, from the rows of :func:`kept_buckets` per second,
    or every bucket of each (column ``t``): one point per second that had a delivery."""
    seconds: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        seconds.setdefault(int(r["t"]), []).append(r)
    points = []
    for t, rs in sorted(seconds.items()):
        st = scope_stats(rs)
        if st is not None:
            points.append(LatencyPoint(t, st.count, st.p50_ns, st.p99_ns, st.max_ns,
                                        p95_ns=st.p95_ns))
    return points


@dataclass(frozen=True)
class LatencyBreakdowns:
    """The latency of a ROUTE run: overall, its histogram, by group, by payload size
    (power-of-two buckets, named by :func:`size_labels`), by cast kind and per send
    second."""

    overall: LatencyStats | None
    histogram: Histogram
    by_group: dict[str, LatencyStats]
    by_size: dict[str, LatencyStats]
    by_cast: dict[str, LatencyStats]
    over_time: list[LatencyPoint]


def latency_breakdowns(rows: Iterable[Mapping[str, Any]]) -> LatencyBreakdowns:
    """The :class:`LatencyBreakdowns` of the rows of :func:`route_scopes`, collected."""
    # Merge the (group, size, cast, q) histogram into the breakdowns. Sizes go into
    # power-of-two buckets: a run with sizes drawn from a range has hundreds of them.
    merged: dict[tuple[str, str], dict[int, Bucket]] = {}

    def merge(key: tuple[str, str], b: Bucket) -> None:
        into = merged.setdefault(key, {})
        old = into.get(b.q)
        into[b.q] = b if old is None else Bucket(
            b.q, old.n + b.n, min(old.lo, b.lo), max(old.hi, b.hi), old.total + b.total)

    fine: list[Mapping[str, Any]] = []
    seconds: list[Mapping[str, Any]] = []
    for r in rows:
        (fine if r["gid"] == _BY_KIND else seconds).append(r)
    for r in fine:
        b = bucket(r)
        lo, _ = size_bucket(int(r["size"]))
        for key in (("all", ""), ("group", str(r["group"])), ("size", str(lo)),
                    ("cast", str(r["cast"]))):
            merge(key, b)

    def breakdown(kind: str) -> dict[str, LatencyStats]:
        out = {key: latency_stats(bs.values())
               for (k, key), bs in merged.items() if k == kind}
        return {k: v for k, v in out.items() if v is not None}

    size_label = size_labels(int(r["size"]) for r in fine)
    overall = list(merged.get(("all", ""), {}).values())
    return LatencyBreakdowns(
        overall=latency_stats(overall),
        histogram=histogram(overall),
        by_group=dict(sorted(breakdown("group").items())),
        by_size={size_label[int(k)]: v for k, v in
                 sorted(breakdown("size").items(), key=lambda kv: int(kv[0]))},
        by_cast=dict(sorted(breakdown("cast").items())),
        over_time=over_time(seconds),
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
