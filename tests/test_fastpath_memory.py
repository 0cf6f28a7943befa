"""What the compiled fast path's thread holds (issue 24, defect 2): nothing for an idle
connection, nothing per receiver once the receivers have read, and never more than
``fast_path_max_bytes`` router-wide. The figures in bytes are in
benchmarks/bench_fastpath_memory.py; these check the thread's own accounts (``Relay.info``)
and the gauges, by work done, never by time.
"""

from __future__ import annotations

import trio

from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.nclient import NativeClient
from tests.test_fastpath import Start, fast_of, read_exactly, round_trip


async def _group(router: Server, n: int) -> list[NativeClient]:
    """``n`` clients in group g: the first (A) sends, the others receive."""
    clients = await NativeClient.several(router, n)
    for i, c in enumerate(clients):
        assert await c.connect("g", b"A" if i == 0 else b"R%d" % i) == wire.Ok(1)
    return clients


async def _until(cond: object, what: str) -> None:
    """Wait (bounded) for the thread to have done something ``cond()`` observes."""
    with trio.fail_after(5):
        while not cond():  # type: ignore[operator]
            await trio.sleep(0.005)


async def test_a_relayed_multicast_leaves_nothing_held_once_read(start_router: Start) -> None:
    """A 60 KB multicast relayed by the thread, cut between reads, to 20 receivers: once they
    have read it the thread holds no byte and no buffer for any of them or for the sender
    (before: a copy per receiver, kept up to 256 KiB each, and a 64 KiB read buffer each)."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, *rs = await _group(router, 21)
    learn = wire.encode(wire.Route("g", None, b"A", b"learn"))
    await a.send_raw(learn)
    for r in rs:
        assert await read_exactly(r, len(learn)) == learn
    relayed = fast.hub.counters.fast_relayed
    big = wire.encode(wire.Route("g", None, b"A", b"x" * 60_000))
    await a.send_raw(big[:30_000])
    # The thread holds the start of the frame (the sender's only buffer), counted in the gauge.
    await _until(lambda: fast.info()["held_partial"] == 30_000, "the cut frame held")
    router.hub.sync()
    assert router.hub.counters.fast_partial_bytes == 30_000
    await a.send_raw(big[30_000:])
    for r in rs:
        assert await read_exactly(r, len(big)) == big
    await round_trip(a, 1)  # the PING's read goes to Python: the thread is done with A's
    router.hub.sync()
    assert router.hub.counters.fast_relayed == relayed + 1
    info = fast.info()
    assert (info["held_partial"], info["held_pending"], info["holding"], info["buffers"]) \
        == (0, 0, 0, 0), info
    assert (router.hub.counters.fast_partial_bytes, router.hub.counters.fast_pending_bytes) \
        == (0, 0)


async def test_forgotten_routes_free_the_route_table(start_router: Start) -> None:
    """A membership change makes the thread forget its routes: the connection's table (64
    entries) goes with them, so an idle connection keeps none."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b = await _group(router, 2)
    await a.send(wire.Route("g", b"R1", b"A", b"learn"))
    assert await b.recv() == wire.Route("g", b"R1", b"A", b"learn")
    await a.send(wire.Route("g", b"R1", b"A", b"relayed"))
    assert await b.recv() == wire.Route("g", b"R1", b"A", b"relayed")
    assert fast.info()["route_tables"] == 1
    c = await NativeClient.to(router)
    assert await c.connect("g", b"C") == wire.Ok(1)  # a change: every route is forgotten
    await a.send(wire.Route("g", b"R1", b"A", b"after"))  # read by the thread: table freed
    assert await b.recv() == wire.Route("g", b"R1", b"A", b"after")
    await round_trip(a, 2)
    assert fast.info()["route_tables"] <= 1  # at most the one learned again by "after"
    await c.send(wire.Disconnect(2, "g", b"C"))
    assert await c.recv() == wire.Ok(2)
    await round_trip(a, 3)  # A's read after the change: its table is freed, none learned
    assert fast.info()["route_tables"] == 0, fast.info()


async def test_copies_that_could_exceed_the_cap_go_through_python(start_router: Start
                                                                   ) -> None:
    """fast_path_max_bytes bounds what the thread could hold: a 20 KB multicast to 8
    receivers (160 KB of possible copies) over a 100 KB cap is routed by Python, byte for byte;
    a small one is still relayed by the thread."""
    router = await start_router(fast_path="on", fast_path_max_bytes=100_000)
    fast = fast_of(router)
    a, *rs = await _group(router, 9)
    small = [wire.encode(wire.Route("g", None, b"A", b"s%d" % i)) for i in range(3)]
    big = wire.encode(wire.Route("g", None, b"A", b"y" * 20_000))
    for f in small:
        await a.send_raw(f)
        for r in rs:
            assert await read_exactly(r, len(f)) == f
    router.hub.sync()
    relayed = router.hub.counters.fast_relayed
    assert relayed >= 1  # the route was learned and used
    await a.send_raw(big)
    for r in rs:
        assert await read_exactly(r, len(big)) == big
    router.hub.sync()
    assert router.hub.counters.fast_relayed == relayed
    assert fast.info()["over_cap"] >= 1
    await a.send_raw(small[0])
    for r in rs:
        assert await read_exactly(r, len(small[0])) == small[0]
    router.hub.sync()
    assert router.hub.counters.fast_relayed == relayed + 1


async def test_a_cut_frame_over_the_cap_stays_with_python(start_router: Start) -> None:
    """With no room under the cap the thread does not take a cut frame: Python keeps it
    (counted in partial_frame_bytes as without the fast path) and the frame arrives whole."""
    router = await start_router(fast_path="on", fast_path_max_bytes=0)
    fast = fast_of(router)
    a, b = await _group(router, 2)
    frame = wire.encode(wire.Route("g", b"R1", b"A", b"z" * 5000))
    await a.send_raw(frame[:1000])
    with trio.fail_after(5):
        while router.hub.counters.partial_bytes == 0:
            await trio.sleep(0.005)
    assert fast.info()["held_partial"] == 0
    await a.send_raw(frame[1000:])
    assert await read_exactly(b, len(frame)) == frame


async def test_what_a_full_socket_did_not_take_is_copied_once_and_taken_by_python(
        start_router: Start) -> None:
    """A receiver that does not read: the thread's send is cut short, the unsent rest is its
    only copy, and Python's outbox takes it at once (the EVICT upcall), so the thread holds
    none of it for long; then the receiver reads every byte, in order."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b = await _group(router, 2)
    frames = [wire.encode(wire.Route("g", b"R1", b"A", bytes([i % 251]) * 60_000))
              for i in range(200)]
    await a.send_raw(frames[0])  # teaches the thread the route
    assert await read_exactly(b, len(frames[0])) == frames[0]
    evicted = fast.by_kind[fast.mod.EVICT]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.send_raw, b"".join(frames[1:]))
        await _until(lambda: fast.by_kind[fast.mod.EVICT] > evicted, "b evicted")
        await _until(lambda: fast.info()["queued"] == 0, "the upcalls handled")
        assert fast.info()["held_pending"] == 0
        got = await read_exactly(b, sum(map(len, frames[1:])), timeout=30)
    assert got == b"".join(frames[1:])
    router.hub.sync()
    assert router.hub.counters.fast_pending_bytes == 0
