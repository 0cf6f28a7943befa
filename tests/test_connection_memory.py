"""What an idle registered connection costs the router in Python objects (issue 24, defect 2:
at most 8 KiB of RSS per idle registered connection, on both paths).

Measured with tracemalloc in this process, not by time: ``N`` native connections, each HELLO'd
and registered in a group of its own, over blocking sockets in a worker thread (whose own
allocations are left out by their frames in this file). RSS, which adds the allocators'
overheads, is measured by benchmarks/bench_fastpath_memory.py (case ``idle``).

Before the cuts of this test's change (a nursery per connection, closures for the outbox's
callbacks, the handshake's and the reader's coroutine frames kept for the connection's life)
it was about 10,500 bytes per connection here (10,600 with the fast path); after, about 7,400
(7,550).
"""

from __future__ import annotations

import gc
import socket
import tracemalloc

import trio

from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.nclient import NativeClient
from tests.test_fastpath import Start

N = 300
WARM = 20
# Bytes of Python objects per idle registered connection: fails on the code before the cuts
# (~10,500), with ~13 % headroom above today's figures for noise (dict and heap growth steps).
BOUND = 8_500


def _registered(port: int, first: int, n: int) -> list[socket.socket]:
    """``n`` connections that said HELLO and CONNECTed in groups of their own, with their
    WELCOME and OK read (in a worker thread: blocking sockets)."""
    socks = []
    for i in range(first, first + n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "memory"))
                  + wire.encode(wire.Connect(1, f"m{i}", b"m")))
        socks.append(s)
    for s in socks:
        decoder = wire.Decoder(max_frame=1 << 16)
        replies: list[wire.Frame] = []
        while len(replies) < 2:
            f = decoder.next_frame()
            if f is None:
                data = s.recv(65536)
                assert data, "the router closed a connection"
                decoder.feed(data)
                continue
            replies.append(f)
        assert isinstance(replies[0], wire.Welcome) and replies[1] == wire.Ok(1), replies
    return socks


def _readers(router: Server) -> int:
    """Connections whose reader waits in the dispatcher or the fast path (idle)."""
    return len(router.fast) if router.fast is not None else len(router.dispatcher)


async def _idle(router: Server, first: int, n: int) -> list[socket.socket]:
    assert router.address is not None
    want = _readers(router) + n
    socks = await trio.to_thread.run_sync(_registered, router.address[1], first, n)
    with trio.fail_after(30):  # a bound on a wait for work done, not a time measurement
        while _readers(router) < want:
            await trio.sleep(0.005)
    return socks


async def test_an_idle_registered_connection_holds_under_8500_bytes_of_python_objects(
        start_router: Start) -> None:
    router = await start_router(dispatcher=True, idle_timeout=0, control_rate=0)
    socks = await _idle(router, 0, WARM)  # the router's one-time allocations first
    tracemalloc.start(30)
    try:
        gc.collect()
        before = tracemalloc.take_snapshot()
        socks += await _idle(router, WARM, N)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    mine = [tracemalloc.Filter(False, __file__, all_frames=True),
            tracemalloc.Filter(False, tracemalloc.__file__)]
    grown = sum(s.size_diff for s in after.filter_traces(mine).compare_to(
        before.filter_traces(mine), "filename"))
    per_connection = grown / N
    assert len(router.connections) == WARM + N
    for s in socks:
        s.close()
    assert per_connection < BOUND, (
        f"{per_connection:.0f} bytes of Python objects per idle registered connection "
        f"(fast path {'on' if router.fast is not None else 'off'})")


async def test_a_stalled_writer_is_cut_at_the_close_linger_and_the_connection_ends(
        start_router: Start) -> None:
    """The writer task runs in the server's nursery now, not in a nursery of its connection:
    it still ends with its connection. B never reads; its writer is blocked on a full socket
    when B is closed; the close linger (close_timeout) cuts the writer, B's connection ends
    (its task waited for the writer, then closed the socket) and A is served on."""
    router = await start_router(close_timeout=0.2, write_timeout=0,
                                outbound_queue_bytes=64 << 20, outbound_queue_frames=100_000)
    a, b = await NativeClient.several(router, 2)
    assert await a.connect("g", b"A") == wire.Ok(1)
    assert await b.connect("g", b"B") == wire.Ok(1)
    conn = next(c for c in router.connections
                if c.session is not None and c.session.hub.table.holds(c.session, "g", b"B"))
    frame = wire.encode_route("g", b"B", b"A", b"x" * 60_000)
    with trio.fail_after(30):  # bounds on waits for work done, not time measurements
        while conn.writer is None or not conn.session.outbox.chunks:  # type: ignore[union-attr]
            await a.send_raw(frame * 8)
            await a.round_trip()
        conn.session.close("protocol", "closed by the test")  # type: ignore[union-attr]
        while conn in router.connections:
            await trio.sleep(0.01)
    assert conn.writer.is_set()
    assert conn.session is not None and conn.session.outbox.closed
    assert isinstance(await a.connect("h", b"A"), wire.Ok)  # A's connection is served on
