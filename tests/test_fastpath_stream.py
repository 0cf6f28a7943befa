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

import trio

from gossiprouter.fastpath import FastPath
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.server import Server
from tests.jgroups_clients import J5Client, uuid
from tests.test_fastpath import Start


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
            await trio.sleep(0.05)
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
