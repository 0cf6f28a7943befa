"""benchmarks/bench_lightpath.py runs the real light-load path (dispatcher round, Feeder,
session, outboxes, direct sends) in one process; what it counts is checked here, not speed."""

from __future__ import annotations

import pytest

from benchmarks import bench_lightpath as bench


@pytest.mark.parametrize(("protocol", "without"), [("native", 7.0), ("jgroups2", 8.0)])
def test_fanout_round_sends_once_per_receiver_with_coalescing(protocol: str,
                                                               without: float) -> None:
    """Two senders' multicasts in one round into a group of 8: every receiver gets both in
    one send with coalesce_writes (4 sends per message), one send each without (7 receivers
    per message; 8 with JGroups 2.12, which echoes a multicast to its sender)."""
    assert bench.fanout(protocol, 50, batch=True)["sends"] == 4.0
    assert bench.fanout(protocol, 50, batch=False)["sends"] == without


@pytest.mark.parametrize("protocol", ["native", "jgroups2"])
def test_unicast_round_delivers_every_message(protocol: str) -> None:
    result = bench.unicast(protocol, 200)  # asserts inside that all 200 were delivered
    assert set(result) == {"bare", "round"}
