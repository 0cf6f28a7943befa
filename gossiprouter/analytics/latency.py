"""Latency figures of an audit, from a fine logarithmic histogram: one home for the ROUTE
audit (:mod:`gossiprouter.analytics.audit`) and the topics audit
(:mod:`gossiprouter.analytics.topics_audit`).

Latency percentiles come from a fine logarithmic histogram: buckets 0.1 % wide, each with
its count and exact min, max and sum. The rank of each percentile is exact; its value is
exact when the bucket holds one distinct value, else interpolated within the bucket (error
under 0.1 %). Unlike percentile_approx at a high accuracy this costs one cheap
aggregation, and the same histogram draws the latency plot.

Spark computes the buckets (:func:`bucket_column`, :func:`bucket_aggregates`; both audits
collect them with :func:`latency_rows`); the figures are made from the collected rows in
Python (:func:`bucket`, :func:`latency_stats`, :func:`histogram`, :func:`over_time`; for
the ROUTE audit's breakdowns by group, payload size and cast, :func:`latency_breakdowns`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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
           "bucket_aggregates", "bucket_column", "histogram", "latency_breakdowns",
           "latency_rows", "latency_stats", "over_time", "size_labels"]

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
    and bucket, for :func:`bucket`."""
    from pyspark.sql import functions as F

    lat = F.col("t_recv_ns") - F.col("t_send_ns")
    return rows(delivered.groupBy(*keys, bucket_column(lat)).agg(*bucket_aggregates(lat)))


def bucket(row: Mapping[str, Any]) -> Bucket:
    """The bucket of a collected row of :func:`bucket_column` and :func:`bucket_aggregates`."""
    return Bucket(int(row["q"]), int(row["n"]), int(row["lo"]), int(row["hi"]),
                  int(row["total"]))


def latency_stats(buckets: Iterable[Bucket]) -> LatencyStats | None:
    """Count, min, mean, percentiles and max of the latencies in ``buckets`` (None if none)."""
    bs = sorted((b for b in buckets if b.n > 0), key=lambda b: b.q)
    n = sum(b.n for b in bs)
    if n == 0:
        return None

    def value_at(rank: int) -> int:  # nearest-rank: the rank-th smallest latency, 1-based
        seen = 0
        for b in bs:
            if seen + b.n >= rank:
                if b.n == 1 or b.lo == b.hi:
                    return b.lo
                return b.lo + round((b.hi - b.lo) * (rank - seen - 1) / (b.n - 1))
            seen += b.n
        return bs[-1].hi

    p50, p90, p95, p99, p999 = (value_at(max(1, -(-n * num // den)))
                           for num, den in _PERCENTILE_FRACTIONS)
    return LatencyStats(
        count=n,
        min_ns=bs[0].lo,
        mean_ns=sum(b.total for b in bs) / n,
        p50_ns=p50,
        p90_ns=p90,
        p95_ns=p95,
        p99_ns=p99,
        p999_ns=p999,
        max_ns=bs[-1].hi,
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
    """The latency of each send second, from rows of the fine histogram grouped by that
    second (column ``t``) and the bucket: one point per second that had a delivery."""
    per_second: dict[int, list[Bucket]] = {}
    for r in rows:
        per_second.setdefault(int(r["t"]), []).append(bucket(r))
    points = []
    for t, bs in sorted(per_second.items()):
        st = latency_stats(bs)
        if st is not None:
            points.append(LatencyPoint(t, st.count, st.p50_ns, st.p99_ns, st.max_ns,
                                        p95_ns=st.p95_ns))
    return points


@dataclass(frozen=True)
class LatencyBreakdowns:
    """The latency of a ROUTE run: overall, its histogram, and by group, by payload size
    (power-of-two buckets, named by :func:`size_labels`) and by cast kind."""

    overall: LatencyStats | None
    histogram: Histogram
    by_group: dict[str, LatencyStats]
    by_size: dict[str, LatencyStats]
    by_cast: dict[str, LatencyStats]


def latency_breakdowns(fine: list[dict[str, Any]]) -> LatencyBreakdowns:
    """The :class:`LatencyBreakdowns` of the fine histogram collected per (group, size,
    cast) (:func:`latency_rows`)."""
    # Merge the (group, size, cast, q) histogram into the breakdowns. Sizes go into
    # power-of-two buckets: a run with sizes drawn from a range has hundreds of them.
    merged: dict[tuple[str, str], dict[int, Bucket]] = {}

    def merge(key: tuple[str, str], b: Bucket) -> None:
        into = merged.setdefault(key, {})
        old = into.get(b.q)
        into[b.q] = b if old is None else Bucket(
            b.q, old.n + b.n, min(old.lo, b.lo), max(old.hi, b.hi), old.total + b.total)

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
