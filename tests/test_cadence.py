"""The router's periodic work on one grid (gossiprouter/core/cadence.py), and the federation's
ticker, which wakes only when a grace, a ghost check or a move's hold is due
(docs/performance.md, "Idle wake-ups on one grid")."""

from __future__ import annotations

import pytest
import trio

from gossiprouter.core.cadence import SLACK, until_beat
from gossiprouter.core.config import Config
from gossiprouter.federation.codec import encode_presence
from gossiprouter.federation.grace import GHOST_SETTLE
from gossiprouter.federation.moves import MOVE_HOLD
from gossiprouter.sessions.base import Hub
from tests.carriers import Named
from tests.federation_net import F, G, Net


def test_beats_fall_on_multiples_of_the_period_so_chores_coincide() -> None:
    assert until_beat(1.0, 100.25) == pytest.approx(0.75)
    assert until_beat(2.0, 101.0) == pytest.approx(1.0)
    assert until_beat(20.0, 100.0) == pytest.approx(20.0)  # on a beat: the next one
    # Just before a beat (a wake a little early): that beat is skipped, never run twice.
    assert until_beat(1.0, 100.99) == pytest.approx(1.01)
    assert until_beat(1.0, 100.0 - SLACK + 0.001) == pytest.approx(1.0 + SLACK - 0.001)
    # Every beat of a 2 s chore is a beat of the 1 s ones: one wake-up for both.
    for wall in (0.3, 7.0, 1234.567, 1.7e9 + 0.42):
        at = wall + until_beat(2.0, wall)
        assert at % 2.0 == pytest.approx(0.0, abs=1e-6) or at % 2.0 == pytest.approx(2.0)
        assert at - wall >= SLACK * 2.0
    with pytest.raises(ValueError, match="must be > 0"):
        until_beat(0.0)


def test_the_federations_deadlines_are_known_and_each_new_one_wakes_the_ticker() -> None:
    """next_due() is the first of the graces, the ghost checks (once synced) and the moves'
    holds; wake() is called when one is set, so the ticker needs no poll."""
    net = Net("a", "b", "c")
    a = net.feds["a"]
    a.grace = 10.0
    woke: list[int] = []
    a.wake = lambda: woke.append(1)
    assert a.next_due() is None
    a.on_presence("c", b"", now=100.0)  # C's Last Will: held until 110
    assert (a.next_due(), len(woke)) == (110.0, 1)
    a.begin_sync()  # a reconnect in which B is not seen: held until 111
    a.end_sync(now=101.0)
    assert a.next_due() == 110.0 and len(woke) >= 2
    a.on_presence("c", a.presence(), now=102.0)  # C back: its ghosts checked at 107
    assert a.next_due() == 102.0 + GHOST_SETTLE and len(woke) >= 3
    a.tick(102.0 + GHOST_SETTLE)
    assert a.next_due() == 111.0
    a.tick(111.0)  # B's grace ran out: dropped, nothing left to wait for
    assert a.next_due() is None and "b" not in a.routers


def test_a_moves_hold_is_a_deadline_on_the_federations_clock() -> None:
    """Frames held for a member that left for no router known yet end at clock() + hold:
    the I/O side's clock (ticks come only when something is due), not the last tick's."""
    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    woke: list[int] = []
    b.wake = lambda: woke.append(1)
    b.clock = lambda: 500.0
    s, tb = Named("s"), Named("tb")
    net.connect("a", s, b"s")
    b.tick(100.0)  # the last tick, long ago
    net.connect("b", tb, b"t")
    b.table.disconnect(tb, G, b"t")
    a.send(a.routers["b"], G, b"t", F(b"s", b"u", b"t"), 1)
    assert b.moves.held_frames() == 1 and woke
    assert b.next_due() == 500.0 + MOVE_HOLD
    b.tick(500.0 + MOVE_HOLD - 0.5)
    assert b.moves.held_frames() == 1
    b.tick(500.0 + MOVE_HOLD)
    assert (b.moves.held_frames(), b.next_due()) == (0, None)


async def test_an_idle_federated_router_ticks_only_when_a_deadline_is_due(
        autojump_clock: trio.abc.Clock) -> None:
    """The bridge's ticker: an hour with nothing due, not one tick (it ticked twice a
    second); a router's Last Will with a 30 s grace, one tick, when the grace ends."""
    from gossiprouter.federation.bridge import Bridge

    cfg = Config(bridge=("mqtt://127.0.0.1:1",), federation_grace=30.0)
    bridge = Bridge(Hub(cfg), cfg)
    fed = bridge.federation
    ticks: list[float] = []
    tick = fed.tick

    def counted(now: float) -> None:
        ticks.append(now)
        tick(now)

    fed.tick = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bridge._ticker)
        await trio.sleep(3600.0)
        assert ticks == []
        now = trio.current_time()
        fed.on_presence("c", encode_presence("c", 0), now=now)
        fed.on_presence("c", b"", now=now)  # its Last Will: held for the grace
        assert fed.graced_routers() == 1
        await trio.sleep(3600.0)
        assert ticks == [pytest.approx(now + 30.0)]
        assert fed.routers == {}
        nursery.cancel_scope.cancel()
