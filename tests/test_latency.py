"""The latency figures of the ROUTE audit (gossiprouter.analytics.latency): what a large run
collects per send second is a handful of buckets, and the figures made from them are the
ones made from every bucket."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pytest

from gossiprouter.analytics.latency import (
    Bucket,
    latency_breakdowns,
    latency_stats,
    over_time,
    route_scopes,
    scope_stats,
    second_scopes,
)
from gossiprouter.analytics.spark_io import rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SECONDS = 4
PER_SECOND = 3_000
T0 = 10**13


def _deliveries(spark: SparkSession) -> DataFrame:
    """PER_SECOND deliveries in each of SECONDS send seconds, their latencies spread from
    50 µs to 2 ms (thousands of 0.1 % buckets a second), over 2 groups, 3 sizes and both
    casts; built in the JVM (no Python rows)."""
    from pyspark.sql import functions as F

    i = F.col("id")
    t_send = F.lit(T0) + (i % SECONDS) * 10**9 + i * 1_000
    return spark.range(SECONDS * PER_SECOND).select(
        F.concat(F.lit("g"), (i % 2).cast("string")).alias("group"),
        F.element_at(F.array(F.lit(64), F.lit(100), F.lit(4096)), (i % 3 + 1).cast("int"))
        .alias("size"),
        F.when(i % 2 == 0, "multicast").otherwise("unicast").alias("cast"),
        t_send.alias("t_send_ns"),
        (t_send + 50_000 + (i * 7_919) % 2_000_000).alias("t_recv_ns"),
    )


@pytest.mark.spark
def test_a_large_run_collects_a_few_buckets_a_second_and_the_same_figures(
    spark: SparkSession,
) -> None:
    from pyspark.sql import functions as F

    pairs = _deliveries(spark)
    second = F.floor((F.col("t_send_ns") - F.lit(T0)) / 10**9)
    kept = rows(route_scopes(pairs, second))
    whole = rows(route_scopes(pairs, second, every_bucket=True))

    def per_second(rs: list[dict[str, object]]) -> Counter[object]:
        return Counter(r["t"] for r in rs if r["t"] is not None)

    # Every second spreads over hundreds of buckets; the large run collects at most the
    # first, the last and one per percentile (p50, p90, p95, p99, p99.9) of each.
    assert len(per_second(whole)) == SECONDS and min(per_second(whole).values()) > 500
    assert per_second(kept).keys() == per_second(whole).keys()
    assert max(per_second(kept).values()) <= 7
    # The breakdowns by group, size and cast, and the histogram, keep every bucket.
    assert sum(r["t"] is None for r in kept) == sum(r["t"] is None for r in whole)
    # The same figures, to the nanosecond, from either.
    a, b = latency_breakdowns(kept), latency_breakdowns(whole)
    assert a == b
    assert len(a.over_time) == SECONDS
    assert sum(p.count for p in a.over_time) == SECONDS * PER_SECOND
    assert a.overall is not None and a.overall.count == SECONDS * PER_SECOND


@pytest.mark.spark
def test_a_large_topics_run_collects_a_few_buckets_a_second_too(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    pairs = _deliveries(spark)
    second = F.floor((F.col("t_send_ns") - F.lit(T0)) / 10**9)
    kept = rows(second_scopes(pairs, second))
    whole = rows(second_scopes(pairs, second, every_bucket=True))
    assert min(Counter(r["t"] for r in whole).values()) > 500
    assert max(Counter(r["t"] for r in kept).values()) <= 7
    assert over_time(kept) == over_time(whole)
    assert [p.count for p in over_time(kept)] == [PER_SECOND] * SECONDS


def test_a_scope_s_figures_from_its_kept_buckets_are_its_figures() -> None:
    # Three buckets; the first holds every rank from p50 to p99.9 (2,000 of 2,002), the
    # last the maximum: the middle one holds none, and without it the figures are the same.
    bs = [Bucket(10, 2000, 100, 110, 210_000), Bucket(11, 1, 120, 120, 120),
          Bucket(12, 1, 500, 500, 500)]
    n, total = 2002, 210_620
    full = latency_stats(bs)
    kept = [{"q": b.q, "n": b.n, "lo": b.lo, "hi": b.hi, "total": b.total, "seen": seen,
             "scope_n": n, "scope_sum": total} for b, seen in ((bs[0], 0), (bs[2], 2001))]
    assert scope_stats(kept) == full
    assert full is not None and (full.p999_ns, full.max_ns) == (110, 500)
    # Rows without "seen" are a scope's every bucket.
    assert scope_stats([{"q": b.q, "n": b.n, "lo": b.lo, "hi": b.hi, "total": b.total}
                        for b in bs]) == full
