"""The parts a load-test report is made of: what the run's records hold (:class:`Counts`),
what the audit found (:class:`Audit`, :class:`Finding`, the breakdowns), latency
(:class:`LatencyStats`, :class:`Histogram`, :class:`LatencyPoint`), throughput, the
scenario's events and the peers' errors. Plain data: :mod:`.model` puts them together in a
:class:`~gossiprouter.analytics.report.model.Report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Audit", "Breakdown", "Counts", "Finding", "Histogram", "LatencyPoint",
           "LatencyStats", "LoadError", "RunEvent", "ScopeBreakdown", "ThroughputBucket",
           "size_bucket"]


@dataclass
class Finding:
    """A counted kind of anomaly, with up to ``sample`` examples (deterministically chosen)."""

    count: int
    sample: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LatencyStats:
    """Latency (receive time minus send time of the first copy received), in nanoseconds."""

    count: int
    min_ns: int
    mean_ns: float
    p50_ns: int
    p90_ns: int
    p95_ns: int
    p99_ns: int
    p999_ns: int
    max_ns: int


@dataclass
class LatencyPoint:
    """Latency of the deliveries of the messages sent in one second of the run."""

    t_s: int
    count: int
    p50_ns: int
    p99_ns: int
    max_ns: int
    p95_ns: int | None = None
    """None in a report whose audit did not give it (older report.json files): the plot
    then draws no p95 line."""


@dataclass
class Histogram:
    """Latency histogram over log-spaced bins: ``counts[i]`` in ``[edges_ns[i], edges_ns[i+1])``."""

    edges_ns: list[float]
    counts: list[int]


@dataclass
class ThroughputBucket:
    """One second of the run, counted from its start (``t_s`` seconds after it): messages
    sent, deliveries made (first copies, by receive time) and deliveries lost (by send
    time). ``covered_s`` is the part of the second inside the run (below 1 for a last,
    partial second): rates are counts divided by it."""

    t_s: int
    sends: int
    deliveries: int
    lost: int
    covered_s: float = 1.0


@dataclass
class Breakdown:
    """Counts for one group, or one peer process (as sender for ``sent``, as receiver for
    the rest)."""

    sent: int = 0
    expected: int = 0
    delivered: int = 0
    lost_registered: int = 0
    lost_reconnect: int = 0
    undetermined: int = 0
    duplicated: int = 0


@dataclass
class ScopeBreakdown:
    """A topics run's audit for one scope (``local`` or ``global``): publications sent,
    (publication, subscriber) pairs expected, delivered and lost, pairs received more than
    once and their extra copies, copies received by subscribers that were not expected
    (``unexpected``), pairs left unaudited because the subscriber was changing its
    patterns (``in_flux``), and the latency of the first copies."""

    sent: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    duplicate_copies: int = 0
    unexpected: int = 0
    in_flux: int = 0
    latency: LatencyStats | None = None
    histogram: Histogram | None = None
    """The latency histogram of this scope, on the bins of the run's (drawn together)."""


@dataclass
class RunEvent:
    """A scenario event as played, in seconds since the start of the run. For a router
    restart ``end_s`` is when every member was registered again (None if that was not
    observed) and ``up_s`` when the router listened again."""

    t_s: float
    action: str
    what: str
    up_s: float | None = None
    end_s: float | None = None


@dataclass
class LoadError:
    """An error the load-test peers counted (from the manifest's counters)."""

    kind: str
    count: int
    by_process: dict[str, int]


@dataclass
class Counts:
    """What the run's records hold."""

    records: int
    send_records: int
    recv_records: int
    messages: int
    messages_without_send_record: int
    deliveries: int
    """Distinct (message, receiver) pairs received at least once."""
    senders: int
    receivers: int
    groups: int


@dataclass
class Audit:
    """Expected versus actual receivers.

    A (message, receiver) pair is *expected* when the receiver was a member of the group for
    the whole window [t_send, t_send + settle], *undetermined* when it was a member for part
    of that window only. Lost = expected and never received; a loss is *across a reconnect*
    when the window overlaps a router restart (from the router going down until every member
    was registered again), else it was lost *while the sender and the receiver were both
    registered*: the unexplained kind, which fails the verdict.
    """

    expected: int
    delivered: int
    lost: Finding
    """Every loss, of both kinds."""
    lost_registered: Finding
    """Lost while the sender and the receiver were both registered."""
    lost_reconnect: Finding
    """Lost across a reconnect: the window overlaps a router restart."""
    lost_to_left: int
    """Of ``lost_registered``: to receivers that left the group later in the run."""
    lost_to_killed: int
    """Of ``lost_registered``: to receivers whose process was killed later in the run."""
    duplicated: Finding
    """(message, receiver) pairs received more than once."""
    duplicate_copies: int
    """Copies beyond the first, summed over the duplicated pairs."""
    out_of_order: Finding
    """First copies that arrived after a higher seq of the same (group, sender, receiver)."""
    out_of_order_pairs: int
    undetermined: Finding
    """Pairs whose receiver joined or left within the window: not checked."""
    undetermined_delivered: int
    unexpected: Finding
    """Deliveries to a receiver that was neither expected nor undetermined (e.g. to the
    sender itself, to a non-member, or a unicast to someone other than its dest)."""


def size_bucket(size: int) -> tuple[int, int]:
    """The power-of-two bucket [lo, hi] holding a payload ``size`` in bytes."""
    if size <= 0:
        return 0, 0
    lo = 1 << (size.bit_length() - 1)
    return lo, 2 * lo - 1
