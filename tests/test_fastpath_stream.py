"""The compiled fast path never cuts into a stream and repeats only table decisions (issue 24).

* Defect 0: one writer owns a socket's byte stream at a time. A JGroups 5.x member that sends
  multi-MiB unfragmented multicasts gets its own copy back through its outbox's writer task;
  unicasts the relay thread repeats for it must never land inside that frame.
* Defect 1: the thread repeats only decisions that depend on the routing table alone; what a
  time window allows (a sender's after-leave allowance, reconnect grace) is never learned.

Every test starts its router with ``fast_path="on"`` (the suite's pure-Python pass runs them
with the thread too).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import trio
import trio.testing

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server.fastpath import FastPath
from gossiprouter.server.listener import Server
from gossiprouter.sessions.outbox import Outbox
from tests.jgroups_clients import J5Client, uuid
from tests.nclient import NativeClient
from tests.test_fastpath import Start, gather, j2_pair, j5_pair, round_trip


def fast_of(router: Server) -> FastPath:
    assert router.fast is not None, "the fast path is not running"
    return router.fast


class Frames5:
    """Receiver-side framing check for a JGroups 5.x stream: every byte received must belong
    to a whole frame (u32 length, then that many bytes) that is byte-identical to one that
    was sent, or a HEARTBEAT echo. A frame started inside another shows up as a frame whose
    bytes nobody sent (or an absurd length)."""

    def __init__(self, known: dict[bytes, str]) -> None:
        self.known = known
        self.buf = bytearray()
        self.got: list[str] = []

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = struct.unpack_from(">i", buf, pos)
            assert 0 <= n <= 64 << 20, f"frame {len(self.got)}: length {n}"
            if len(buf) - pos < 4 + n:
                break
            frame = bytes(buf[pos : pos + 4 + n])
            tag = self.known.get(frame)
            if tag is None:
                dec = j5.Decoder(max_frame=64 << 20)
                dec.feed(frame)
                ev = dec.next_event()
                assert isinstance(ev, j5.Heartbeat), (
                    f"frame {len(self.got)} ({n} bytes) is none that was sent: {frame[:80]!r}")
                tag = "heartbeat"
            self.got.append(tag)
            pos += 4 + n
        del buf[:pos]


async def small_window_j5(router: Server) -> J5Client:
    """A 5.x client whose socket takes little at a time (the router's writes to it are
    partial, as to a member that reads slower than the router writes)."""
    assert router.address is not None
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    await sock.connect(router.address)
    return J5Client(trio.SocketStream(sock))


async def test_unicasts_never_land_inside_a_large_frame_being_written(start_router: Start
                                                                    ) -> None:
    """Three 2 MiB multicasts from x (no FRAG2) come back to x through its outbox's writer
    task while y unicasts to x all the time, a route the thread has learned. Every byte x
    and y receive parses into whole frames that were sent, in each sender's order."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    x = await small_window_j5(router)
    y = await J5Client.open(*router.address)  # type: ignore[misc]
    xa, ya = uuid(1, 5), uuid(2, 5)
    await x.register("cluster", xa, "x")
    await y.register("cluster", ya, "y")
    await x.sync()
    await y.sync()
    big = [j5.message("cluster", None, xa, bytes([65 + i]) * (2 << 20)) for i in range(3)]
    small = [j5.message("cluster", xa, ya, b"u%05d" % i) for i in range(20_000)]
    known = {f: f"big{i}" for i, f in enumerate(big)} | {f: f"u{i}" for i, f in enumerate(small)}
    # y's first unicast goes up to Python, which teaches the thread the route to x.
    learned = fast.learned
    await y.send_raw(small[0])
    at_x, at_y = Frames5(known), Frames5(known)
    done = trio.Event()

    async def read_x() -> None:
        while at_x.got.count("big2") == 0:
            data = await x.stream.receive_some(8192)
            assert data, "the router closed x"
            at_x.feed(data)
            await trio.sleep(0.0005)  # slower than the router writes: its sends are partial
        done.set()

    async def read_y() -> None:
        while True:
            data = await y.stream.receive_some(1 << 20)
            if not data:
                return
            at_y.feed(data)

    async def unicasts() -> None:
        for f in small[1:]:
            if done.is_set():
                return
            await y.send_raw(f)
            await trio.sleep(0)

    with trio.fail_after(60):  # a hang guard, not a measurement
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_x)
            nursery.start_soon(read_y)
            while "u0" not in at_x.got:  # routed by Python, which learned it at once
                await trio.sleep(0.001)
            assert fast.learned > learned, "the unicast route was not learned"
            nursery.start_soon(unicasts)
            for f in big:
                await x.send_raw(f)
            await done.wait()
            nursery.cancel_scope.cancel()
    router.hub.sync()
    assert router.hub.counters.fast_relayed > 0  # the thread did write to x meanwhile
    bigs = [t for t in at_x.got if t.startswith("big")]
    assert bigs == ["big0", "big1", "big2"]
    uni = [int(t[1:]) for t in at_x.got if t.startswith("u")]
    assert uni == sorted(uni) and len(uni) > 100, len(uni)
    assert [t for t in at_y.got if t.startswith("big")] == bigs[: len(
        [t for t in at_y.got if t.startswith("big")])]


# --------------------------------------------------------------------------- defect 1


async def test_a_jgroups5_sender_after_leave_is_never_learned(start_router: Start,
                                                              mock_clock: trio.testing.MockClock
                                                              ) -> None:
    """x unregisters; what it sends within AFTER_LEAVE is routed by Python (counted), never
    by the thread; once the window is over (the router's clock, moved by hand) nothing of
    x's reaches y any more."""
    router = await start_router(fast_path="on", idle_timeout=0)
    fast = fast_of(router)
    x, y = await j5_pair(router)
    xa, ya = uuid(1, 5), uuid(2, 5)
    await x.unregister("cluster", xa)
    await x.sync()
    learned = fast.learned
    for i in range(3):
        await x.message("cluster", None, xa, b"late%d" % i)
        await x.message("cluster", ya, xa, b"ack%d" % i)
    await x.sync()
    got = [ev for ev in await y.round_trip() if isinstance(ev, j5.Message)]
    assert [bytes(m.payload) for m in got] == [b"late0", b"ack0", b"late1", b"ack1", b"late2",
                                               b"ack2"]
    assert fast.learned == learned
    assert router.hub.counters.frames_in["jgroups5_after_leave"] == 6  # each one by Python
    mock_clock.jump(6.0)  # past AFTER_LEAVE (5 s)
    await x.message("cluster", None, xa, b"too late")
    await x.message("cluster", ya, xa, b"too late")
    await x.sync()
    assert [ev for ev in await y.round_trip() if isinstance(ev, j5.Message)] == []


async def test_a_jgroups2_sender_after_leave_is_never_learned(start_router: Start,
                                                              mock_clock: trio.testing.MockClock
                                                              ) -> None:
    """As above for JGroups 2.12, whose messages carry no sender: the connection's last
    address in the group left."""
    router = await start_router(fast_path="on", idle_timeout=0)
    fast = fast_of(router)
    x, y = await j2_pair(router)
    await x.disconnect("cluster", uuid(1, 2))
    learned = fast.learned
    for i in range(3):
        await x.message("cluster", None, b"late%d" % i)
        await x.message("cluster", uuid(2, 2), b"uni%d" % i)
    got: list[j2.Message] = []
    await gather(y, j2.Message, 6, got)
    assert [bytes(m.payload) for m in got] == [b"late0", b"uni0", b"late1", b"uni1", b"late2",
                                               b"uni2"]
    await x.round_trip()
    assert fast.learned == learned
    assert router.hub.counters.frames_in["jgroups2_after_leave"] == 6
    mock_clock.jump(6.0)
    await x.message("cluster", None, b"too late")
    await x.message("cluster", uuid(2, 2), b"too late")
    await x.round_trip()
    # 2.12 semantics: y gets its own multicast back, after anything x's frames reached it with.
    await y.message("cluster", None, b"marker")
    got = []
    await gather(y, j2.Message, 1, got)
    assert [bytes(m.payload) for m in got] == [b"marker"]


async def test_frames_held_for_a_member_in_grace_are_never_learned(start_router: Start
                                                                   ) -> None:
    """Frames for a member in reconnect grace are held by Python (within grace_buffer_bytes);
    the thread must not repeat a decision made while the grace lasts, for native and 5.x
    groups alike: every such frame is held, and handed over when the member is back."""
    router = await start_router(fast_path="on", grace=30)
    fast = fast_of(router)
    a, b, c = await NativeClient.several(router, 3)
    for cl, addr in ((a, b"A"), (b, b"B"), (c, b"C")):
        assert await cl.connect("g", addr) == wire.Ok(1)
    await a.send(wire.Route("g", None, b"A", b"before"))
    assert await b.recv() == wire.Route("g", None, b"A", b"before")
    assert await c.recv() == wire.Route("g", None, b"A", b"before")
    await c.stream.aclose()
    with trio.fail_after(5):  # a hang guard
        while not router.hub.table.groups["g"].graced:
            await trio.sleep(0.01)
    learned = fast.learned
    for i in range(5):
        await a.send(wire.Route("g", None, b"A", b"held%d" % i))
        await a.send(wire.Route("g", b"C", b"A", b"uni%d" % i))
    for i in range(5):
        assert await b.recv() == wire.Route("g", None, b"A", b"held%d" % i)
    await round_trip(a, 1)
    assert fast.learned == learned
    entry = router.hub.table.entry("g", b"C")
    assert entry is not None and len(entry.held) == 10
    c2 = await NativeClient.to(router)
    assert await c2.connect("g", b"C") == wire.Ok(1)
    for i in range(5):
        assert await c2.recv() == wire.Route("g", None, b"A", b"held%d" % i)
        assert await c2.recv() == wire.Route("g", b"C", b"A", b"uni%d" % i)
    # Back in the group: now a table decision, learned again.
    await a.send(wire.Route("g", None, b"A", b"after"))
    assert await c2.recv() == wire.Route("g", None, b"A", b"after")
    assert fast.learned > learned


# --------------------------------------------------------------------------- farewells


def _partial_direct(n: int) -> Callable[[bytes], int]:
    """A direct send whose socket takes ``n`` bytes once, then nothing."""
    room = [n]

    def send(data: bytes) -> int:
        took = min(room[0], len(data))
        room[0] -= took
        return took

    return send


def test_a_discarding_close_never_puts_its_farewell_inside_a_frame() -> None:
    """A frame half on the wire, the rest queued, then the queue overflows and the connection
    is closed discarding what is queued: the rest of the started frame stays first, then the
    farewell (before: the farewell went out right after the half frame)."""
    ob = Outbox(1000, 100, "disconnect")
    ob.direct = _partial_direct(300)
    frame = b"F" * 800
    assert ob.push(frame)  # 300 bytes on the wire, 500 queued
    assert not ob.push(b"G" * 800)  # over max_bytes: the session would close it
    ob.close("slow_consumer", b"BYE", discard=True)
    assert ob.chunks == [frame[300:], b"BYE"]
    assert ob.nbytes == 503


def test_a_discarding_close_keeps_what_the_relay_thread_had_not_sent() -> None:
    """The relay thread's unsent bytes (possibly the rest of a frame it started) are claimed
    first and are not discarded by a close either."""
    ob = Outbox(1000, 100, "disconnect")
    ob.reclaim = lambda: b"rest-of-a-frame"
    ob.chunks, ob.nbytes = [b"whole"], 5
    ob.close("slow_consumer", b"BYE", discard=True)
    assert ob.chunks == [b"rest-of-a-frame", b"BYE"]
    # A discarding close with nothing started on the wire drops everything queued.
    ob2 = Outbox(1000, 100, "disconnect")
    ob2.chunks, ob2.nbytes = [b"whole"], 5
    ob2.close("slow_consumer", b"BYE", discard=True)
    assert ob2.chunks == [b"BYE"]
