"""What the benchmarks' tables share: the nearest-rank percentile of raw samples (the
federation benchmarks' latencies, bench_hostile's round trips)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (not empty)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]
