"""Lossless moves between federated routers (docs/federation.md, section 5): a member moves
make-before-break from router B to router C while a sender on router A streams numbered
unicasts and multicasts to it. In-process routers federated through a real mosquitto on
127.0.0.1, raw native clients on real sockets.

Bounded by work: a fixed count of frames, paced by short sleeps (never asserted on), and
the end is known from the routers' counters (every routed frame arrived), then a PING/PONG
on each of the member's connections proves everything queued before it has been read.
"""

from __future__ import annotations

from collections import Counter

import trio

from gossiprouter.protocol import native as wire
from tests.nclient import NativeClient
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_federation_sockets import G, carriers, everywhere, federation, member
from tests.test_stub import eventually

N = 2_000  # frames sent, half unicasts, half multicasts
BURST = 10  # frames per pause: about 1,000 frames/s


class Receiver:
    """One of the member's connections: every ROUTE payload it reads, until cancelled."""

    def __init__(self, c: NativeClient) -> None:
        self.c = c
        self.payloads: list[bytes] = []
        self.ok = trio.Event()
        self.pongs: set[int] = set()

    async def run(self) -> None:
        while True:
            f = await self.c.recv(timeout=30)
            if isinstance(f, wire.Route):
                self.payloads.append(f.payload)
            elif isinstance(f, wire.Ok):
                self.ok.set()
            elif isinstance(f, wire.Pong):
                self.pongs.add(f.nonce)

    async def drained(self) -> None:
        nonce = self.c.req()
        await self.c.send(wire.Ping(nonce))
        await eventually(lambda: nonce in self.pongs, 30, what="PONG")


async def test_a_make_before_break_move_loses_nothing_and_duplicates_nothing(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """t moves from B (r1) to C (r2) mid-stream: CONNECT on C, then DISCONNECT on B as soon
    as B knows of the new connection (the frame after). Every frame A's sender sent reaches
    t exactly once."""
    ra, rb, rc = await federation(nursery, broker, 3)
    s = await member(ra, b"s")
    old = Receiver(await member(rb, b"t"))
    c1 = await member(rc, b"c1")  # so A's multicasts reach C too, directly
    await everywhere([ra, rb, rc], {b"s", b"t", b"c1"})
    assert rc.server is not None
    new = Receiver(await NativeClient.to(rc.server))
    nursery.start_soon(old.run)
    nursery.start_soon(new.run)
    connect_at, broke = N // 3, -1
    for i in range(N):
        if i == connect_at:
            await new.c.send(wire.Connect(new.c.req(), G, b"t", "t", (("10.0.0.1", 7800),)))
            with trio.fail_after(30):
                await new.ok.wait()
        if broke < 0 and i > connect_at and "RemoteMember" in carriers(rb, b"t"):
            await old.c.send(wire.Disconnect(old.c.req(), G, b"t"))
            broke = i
        await s.send(wire.Route(G, b"t" if i % 2 else None, b"s", b"%d" % i))
        if i % BURST == BURST - 1:
            await trio.sleep(0.01)
    fa, fb, fc = (bridge_of(r).federation for r in (ra, rb, rc))
    assert connect_at < broke < N - 500  # mid-stream, with much sent after the move
    await s.round_trip()  # A has routed every frame s sent
    # Every frame routed (by A, and handed on by B) has arrived where it was sent.
    await eventually(lambda: fb.stats.routed_in + fc.stats.routed_in
                     == fa.stats.routed_out + fb.stats.handed_on, 30, what="all routed")
    await old.drained()
    await new.drained()
    got = Counter(old.payloads + new.payloads)
    lost = [i for i in range(N) if b"%d" % i not in got]
    dup = {p: n for p, n in got.items() if n > 1}
    assert (len(lost), len(dup)) == (0, 0), (len(lost), lost[:10], sorted(dup)[:10])
    assert fb.stats.handed_on > 0  # the move happened mid-stream
    await c1.aclose()
