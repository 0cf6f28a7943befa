"""benchmarks/bench_fastpath_churn.py runs (a short bounded case); its figures are not checked,
only that the load it describes happens (every frame delivered, churn cycles done)."""

from __future__ import annotations

from benchmarks import bench_fastpath_churn as bench


def test_a_short_churn_case_delivers_everything() -> None:
    r = bench.worker(frames=1024, cycles=4, same_group=False)
    assert r["frames"] == 1024  # the receivers got every one (the worker waits for that)
    assert 0 <= r["cycles"] <= 4
    assert 0.0 <= r["relayed_pct"] <= 100.0
