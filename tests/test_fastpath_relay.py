"""The relay thread's Python-facing methods and its forgetting (issue 24, smaller findings).

* Every argument Python passes to a ``Relay`` method is checked: ``ValueError`` for a value no
  caller may pass (it would make the thread read or write out of bounds, or alias another
  connection), never a silent clamp or a crash.
* A change of one group makes the thread forget that group's decisions only: another client's
  connection churn does not push everyone's traffic back to Python.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gossiprouter.protocol import native as wire
from gossiprouter.server import fastpath
from tests.nclient import NativeClient
from tests.test_fastpath import Start, fast_of, read_exactly, round_trip

Relay = tuple[Any, Any, list[int]]  # the module, a Relay, two connection ids


@pytest.fixture
def relay_and_ids() -> Iterator[Relay]:
    mod = fastpath._relay
    assert mod is not None
    relay = mod.Relay()
    socks = [socket.socketpair() for _ in range(2)]
    ids = [relay.open(a.fileno(), mod.NATIVE, 4096) for a, _ in socks]
    assert all(relay.attach(i) for i in ids)
    yield mod, relay, ids
    for i in ids:
        relay.close(i)
    for a, b in socks:
        a.close()
        b.close()


def test_every_argument_is_checked(relay_and_ids: Relay) -> None:
    mod, relay, (a, b) = relay_and_ids
    too_big = 1 << 50  # beyond the id space: would alias a live connection's index
    for bad in (-1, too_big, a + too_big):
        for call in (relay.attach, relay.take, relay.unread, relay.close):
            with pytest.raises(ValueError, match="out of range"):
                call(bad)
        with pytest.raises(ValueError, match="out of range"):
            relay.send(bad, b"x")
        with pytest.raises(ValueError, match="out of range"):
            relay.read(bad, False)
        with pytest.raises(ValueError, match="out of range"):
            relay.learn(bad, b"k", b"", 0, 100, [b])
        with pytest.raises(ValueError, match="out of range"):
            relay.learn(a, b"k", b"", 0, 100, [bad])
    key = b"\x95\x06\xa1g\xc0\xc4\x01A"
    for kwargs, match in (
            ({"key": b""}, "key"),
            ({"key": b"k" * (mod.MAX_HOLD + 1)}, "key"),
            ({"out": b"o" * (mod.MAX_HOLD + 1)}, "out"),
            ({"skip": -1}, "skip"),
            ({"skip": len(key) + 1}, "skip"),  # would underflow the tail's length
            ({"max_frame": 0}, "max_frame"),
            ({"slot": -1}, "slot"),
            ({"slot": mod.GROUP_SLOTS}, "slot"),
            ({"dests": [b, b]}, "twice")):
        learn: dict[str, object] = {"key": key, "out": b"", "skip": 0, "max_frame": 100,
                                    "dests": [b], "slot": 0}
        learn.update(kwargs)
        with pytest.raises(ValueError, match=match):
            relay.learn(a, *learn.values())
    assert relay.info()["routes"] == 0
    assert relay.learn(a, key, b"", 0, 100, [b], 7)
    assert relay.info()["routes"] == 1
    for slot in (-2, mod.GROUP_SLOTS):
        with pytest.raises(ValueError, match="slot"):
            relay.invalidate(slot)
    with pytest.raises(ValueError, match="max_hold"):
        relay.read(a, False, b"x" * 4097)  # more than the connection's max_hold
    sock = socket.socket()
    try:
        fd = sock.fileno()
        for bad_open in ((-1, mod.NATIVE, 100), (fd, mod.NATIVE, -1),
                         (fd, mod.NATIVE, mod.MAX_HOLD + 1)):
            with pytest.raises(ValueError):
                relay.open(*bad_open)
    finally:
        sock.close()


def test_invalidating_a_group_slot_forgets_only_its_routes(relay_and_ids: Relay) -> None:
    _, relay, (a, b) = relay_and_ids
    assert relay.learn(a, b"k1", b"", 0, 100, [b], 1)
    assert relay.learn(a, b"k2", b"", 0, 100, [b], 2)
    relay.invalidate(1)
    assert relay.info()["routes"] == 1
    relay.take(b)  # a receiver detached (its outbox's writer took over) forgets nothing
    assert relay.info()["routes"] == 1
    relay.invalidate()  # everything
    assert relay.info()["routes"] == 0


async def test_churn_in_another_group_keeps_the_learned_routes(start_router: Start) -> None:
    """A client connects, registers in a group of its own and drops, again and again: the
    multicasts of group g stay on the thread (before: every cycle made the thread forget
    every decision, and the next frame of every sender went to Python)."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    frames = [wire.encode(wire.Route("g", None, b"A", b"%03d" % i)) for i in range(40)]
    await a.send_raw(frames[0])
    assert await read_exactly(b, len(frames[0])) == frames[0]
    # A group in another slot (groups that share one forget each other's routes too).
    other = next(f"churn{i}" for i in range(100) if fast.slot(f"churn{i}") != fast.slot("g"))
    router.hub.sync()
    relayed, learned = router.hub.counters.fast_relayed, fast.learned
    for i in range(1, 40):
        c = await NativeClient.to(router)
        assert await c.connect(other, b"C%d" % i) == wire.Ok(1)
        await c.aclose()
        await a.send_raw(frames[i])
        assert await read_exactly(b, len(frames[i])) == frames[i]
    await round_trip(a, 1)
    router.hub.sync()
    assert router.hub.counters.fast_relayed - relayed == 39  # every one by the thread
    assert fast.learned == learned  # never had to learn it again


async def test_a_connection_whose_upcall_cannot_be_queued_is_closed_and_counted(
        start_router: Start) -> None:
    """The thread has no memory for the upcall of a's PING (simulated): a cannot go on, so it
    is closed as an internal error (ERROR internal_error, counted), never left stuck; b is
    served on."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    fast.relay._fail_upcalls(1)
    await a.send(wire.Ping(1))
    frames = await a.recv_until_closed()
    assert [f.code for f in frames if isinstance(f, wire.Error)] == ["internal_error"]
    assert router.hub.counters.internal_errors == 1
    assert fast.info()["lost"] == 1
    assert fast.by_kind[fastpath._relay.LOST] == 1  # type: ignore[union-attr]
    await round_trip(b, 2)
