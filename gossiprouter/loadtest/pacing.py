"""Sending on a fixed schedule, and counting what the schedule lost.

A load generator that sends only when the previous send returned hides exactly the
stalls a load test is for (*coordinated omission*): while the router is slow it is asked
less, and the latency of what was not sent is never measured. The loaders here send on a
fixed schedule of slots (``rate`` per second) and count, in :class:`PaceStats`, every
slot the schedule had and what became of it: sent at most one interval behind its slot,
sent *late* (a whole interval or more behind), or *skipped* (the loader was more than
``max_behind`` seconds behind and dropped those slots rather than burst to catch up).
The report sets ``sent`` against the slots (target against achieved) and shows the
late and skipped ones.

One home for the ROUTE load test's peers (:mod:`gossiprouter.loadtest.peer`) and the
topics load test's publishers (:mod:`gossiprouter.loadtest.topics`). The ROUTE load test's
processes (driver, peers, attackers) share one schedule on the ``time.monotonic_ns`` clock;
:func:`trio_time_at` turns a moment of it into a deadline on each one's trio clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

import trio

__all__ = ["MAX_BEHIND_S", "PaceStats", "Pacer", "trio_time_at"]

MAX_BEHIND_S: Final = 1.0
"""Behind by more than this, the missed slots are skipped (counted), not sent in a burst."""


@dataclass
class PaceStats:
    """What the schedule of one or more senders asked for and what became of it."""

    slots: int = 0
    """Slots due so far: sent (or tried), late or not, plus skipped."""
    late: int = 0
    """Slots sent a whole interval or more behind schedule."""
    skipped: int = 0
    """Slots never sent: the loader was more than MAX_BEHIND_S behind."""
    max_lag_s: float = 0.0
    """The furthest behind schedule a send started."""

    def add(self, other: PaceStats) -> None:
        self.slots += other.slots
        self.late += other.late
        self.skipped += other.skipped
        self.max_lag_s = max(self.max_lag_s, other.max_lag_s)

    def counters(self) -> dict[str, Any]:
        """The peers' counters (manifest ``counters``; the report reads these keys)."""
        return {"slots": self.slots, "slots_late": self.late, "slots_skipped": self.skipped,
                "send_lag_max_s": round(self.max_lag_s, 6)}


class Pacer:
    """The slots of one sender: ``await pacer.wait()`` before each send."""

    def __init__(self, rate: float, start: float, stats: PaceStats | None = None,
                 max_behind: float = MAX_BEHIND_S) -> None:
        self.interval = 1.0 / rate
        self.next_t = start  # trio clock
        self.max_behind = max_behind
        self.stats = stats if stats is not None else PaceStats()

    async def wait(self) -> None:
        """Sleep until the next slot is due; count it (and any skipped before it)."""
        st, interval = self.stats, self.interval
        now = trio.current_time()
        if self.next_t > now:
            await trio.sleep_until(self.next_t)
        else:
            behind = now - self.next_t
            st.max_lag_s = max(st.max_lag_s, behind)
            if behind > self.max_behind:
                # Stay on the schedule's grid: the slots that passed are dropped, counted.
                missed = int(behind / interval)
                st.skipped += missed
                st.slots += missed
                self.next_t += missed * interval
                behind = now - self.next_t
            if behind >= interval:
                st.late += 1
        st.slots += 1
        self.next_t += interval


def trio_time_at(mono_ns: int) -> float:
    """The trio clock's reading at the moment ``time.monotonic_ns()`` reads ``mono_ns``
    (trio's clock has its own random offset)."""
    return trio.current_time() + (mono_ns - time.monotonic_ns()) / 1e9
