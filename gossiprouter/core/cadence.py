"""The router's periodic work on one grid of the wall clock (a foundation piece: no I/O).

A router's Python thread has periodic chores: the reaper's pass (every
:data:`HOUSEKEEPING` seconds when nothing is due sooner), the broker session's keepalive
check, and with a federation its heartbeats and its presence refresh. Each used to sleep
its own interval from its own start, so an idle federated router woke about 4.5 times a
second at scattered instants. On a virtual machine a wake-up after a sleep can cost
milliseconds of CPU, the more the idler the machine (docs/performance.md, "Idle wake-ups on
one grid"), and a cluster of chores done in one wake-up costs little more than one.

So every chore sleeps until the next multiple of its period on the wall clock
(:func:`until_beat`): the chores of one router fall on the same instants, and so do the
heartbeats of every router of a federation whose clocks agree (NTP), which the others
receive while they are awake anyway. An idle federated router now wakes about 1.8 times a
second. Deadlines known in advance (an idle timeout, a handshake, a grace) are still kept
to the instant; only the fallback polls are on the grid.
"""

from __future__ import annotations

import time

# The fallback period of the router's polls: the reaper's when nothing is due sooner, the
# broker session's keepalive check. The federation heartbeat (2 s by default) is a multiple.
HOUSEKEEPING = 1.0

# A beat closer than this share of the period is skipped for the next one: a chore that just
# ran (woken a little early by a clock that runs apart from the wall clock, or by its own
# deadline) does not run again at once.
SLACK = 0.05


def until_beat(period: float, wall: float | None = None) -> float:
    """Seconds from ``wall`` (now, by default) to the next multiple of ``period`` seconds
    since the epoch, at least :data:`SLACK` of a period away. ``period`` must be > 0."""
    if period <= 0:
        raise ValueError(f"period {period!r}: must be > 0")
    if wall is None:
        wall = time.time()
    delay = period - wall % period
    if delay < SLACK * period:
        delay += period
    return delay
