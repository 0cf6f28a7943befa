"""Attacks on a live router while honest members keep talking: the one copy of the honest pair
and of the floods, for the hostile-client suites (test_hostile_fairness.py, test_dispatch.py,
test_admin_bounded.py).

No assertion is about time: they are about what the router did (counters, errors sent, frames
answered while an attack was in progress).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import trio

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.jgroups_clients import J2Client, J5Client
from tests.nclient import NativeClient

R = TypeVar("R")

# A control budget a flood exhausts at once (a burst of 200, then 200 a second), closing
# the flooder after half a second over it: the router options of the flood tests.
FLOOD_BUDGET: Final[dict[str, float]] = {"control_rate": 200, "control_burst": 200,
                                         "control_grace": 0.5}


class Honest:
    """Two native members: A multicasts numbered messages to B, and pings, while an attack
    runs; :meth:`check` asserts B got every one of them, in order, and every PING was
    answered."""

    def __init__(self, a: NativeClient, b: NativeClient) -> None:
        self.a, self.b = a, b
        self.sent = 0
        self.got: list[int] = []
        self.pongs = 0
        self.stop = trio.Event()

    @classmethod
    async def open(cls, router: Server) -> Honest:
        assert router.address is not None
        a = await NativeClient.open(*router.address)
        b = await NativeClient.open(*router.address)
        assert await a.connect("honest", b"A") == wire.Ok(1)
        assert await b.connect("honest", b"B") == wire.Ok(1)
        return cls(a, b)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(self._receive)
            task_status.started()
            while not self.stop.is_set():
                await self.a.send(wire.Route("honest", None, b"A",
                                             self.sent.to_bytes(4, "big")))
                self.sent += 1
                await self.a.send(wire.Ping(self.sent))
                await trio.sleep(0.005)
            with trio.fail_after(20):
                while len(self.got) < self.sent:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()

    async def _receive(self) -> None:
        async def pongs() -> None:
            while True:
                f = await self.a.recv(timeout=30)
                if isinstance(f, wire.Pong):
                    self.pongs += 1

        async with trio.open_nursery() as n:
            n.start_soon(pongs)
            while True:
                f = await self.b.recv(timeout=30)
                if isinstance(f, wire.Route):
                    self.got.append(int.from_bytes(f.payload, "big"))

    def check(self) -> None:
        assert self.sent > 0
        assert self.got == list(range(self.sent)), "honest messages lost or reordered"


Attack = Callable[[Honest], Awaitable[None]]


async def during(router: Server, attack: Attack) -> Honest:
    """Run ``attack`` while the honest pair exchanges messages; then check the pair."""
    honest = await Honest.open(router)
    async with trio.open_nursery() as n:
        await n.start(honest.run)
        await attack(honest)
        honest.stop.set()
    honest.check()
    # Still serving: a new client gets its WELCOME and its PONG.
    assert router.address is not None
    c = await NativeClient.open(*router.address)
    await c.send(wire.Ping(42))
    assert await c.recv() == wire.Pong(42)
    await c.aclose()
    return honest


def pipelined_pings(router: Server, n: int) -> Attack:
    """An attack: ``n`` PINGs in one write (so one read). Between two turns of the flooder the
    attack task runs and must see the pipeline part done; every PONG must still arrive."""
    counters = router.hub.counters

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        flood = await NativeClient.open(*router.address)
        before = counters.frames_in.get("Ping", 0)
        await flood.send_raw(wire.encode(wire.Ping(1)) * n)
        seen = 0
        while seen == 0:
            await trio.sleep(0)
            seen = counters.frames_in.get("Ping", 0) - before
        assert 0 < seen < n, "the whole pipeline was processed in one turn"
        for _ in range(n):
            assert await flood.recv() == wire.Pong(1)
        await flood.aclose()

    return attack


async def flood(send_raw: Callable[[bytes], Awaitable[None]], batch: bytes,
                read: Callable[[], Awaitable[R]]) -> R:
    """Send ``batch`` at most 400 times while ``read`` reads the answers until the router
    closes the connection; returns what ``read`` returned."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            async def send() -> None:
                # The router closes the flooder: its next writes fail.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                         OSError):
                    for _ in range(400):  # bounded
                        await send_raw(batch)

            n.start_soon(send)
            result = await read()
            n.cancel_scope.cancel()
    return result


async def native_control_flood(router: Server, frame: bytes) -> None:
    """A native client sends ``frame`` (a control frame) in batches of 500 until the router
    closes it; the last frame it got must be ERROR rate_limited."""
    assert router.address is not None
    client = await NativeClient.open(*router.address)
    frames = await flood(client.send_raw, frame * 500,
                         lambda: client.recv_until_closed(timeout=20))
    last = frames[-1]
    assert isinstance(last, wire.Error) and last.code == "rate_limited", last
    assert "control frames per second" in last.message


async def jgroups5_heartbeat_flood(router: Server) -> None:
    """A JGroups 5.x client sends HEARTBEATs in batches of 500 until the router closes it
    deliberately (the close marker); its first burst was answered, the rest was not read."""
    assert router.address is not None
    client = await J5Client.open(*router.address)

    async def echoes() -> int:
        n = 0
        # Closed with our HEARTBEATs unread: the router's close ends in a reset, after
        # the data it sent (the close marker last) has been read.
        with contextlib.suppress(trio.BrokenResourceError, EOFError):
            while True:
                n += isinstance(await client.recv(timeout=20), j5.Heartbeat)
        return n

    n = await flood(client.send_raw, j5.heartbeat() * 500, echoes)
    assert client.close_marker  # closed deliberately, not reset
    assert 200 <= n < 200_000  # its burst was answered, the rest was not read


async def jgroups2_request_flood(router: Server) -> None:
    """A JGroups 2.12 client sends PINGs in batches of 500 until the router closes it."""
    assert router.address is not None
    client = await J2Client.open(*router.address)

    async def until_closed() -> None:
        with contextlib.suppress(trio.BrokenResourceError):
            await client.recv_until_closed(timeout=20)

    await flood(client.send_raw, j2.ping() * 500, until_closed)


async def throttled_then_closed(router: Server, run_flood: Callable[[], Awaitable[None]]) -> None:
    """Run ``run_flood`` as the attack: the honest client's PINGs are answered while the flood
    is throttled, and the flooder (only it) is closed for its rate."""
    async def attack(honest: Honest) -> None:
        pongs = honest.pongs
        await run_flood()
        assert honest.pongs > pongs

    await during(router, attack)
    c = router.hub.counters
    assert c.throttled_turns > 0 and c.rate_limited == 1
