"""What a hostile (or broken) client can do to the compiled fast path (gossiprouter/server/relay/)
that it cannot do to the pure-Python path. Each test runs with ``fast_path="on"`` and, where
the answer is the same, ``"off"`` too: the thread must never change what the router does.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Awaitable, Callable

import pytest
import trio

from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server import fastpath
from gossiprouter.server.listener import Server
from tests.jgroups_clients import uuid
from tests.nclient import NativeClient
from tests.test_fastpath import j5_pair

Start = Callable[..., Awaitable[Server]]


async def closed_with(stream: trio.abc.Stream, timeout: float = 5.0) -> bytes:
    """Everything the router sends ``stream`` until it closes it (fails after ``timeout``)."""
    got = b""
    with trio.fail_after(timeout):
        try:
            while data := await stream.receive_some(65536):
                got += data
        except trio.BrokenResourceError:
            pass
    return got


@pytest.mark.parametrize("fast_path", ["on", "off"])
async def test_native_frame_shorter_than_a_learned_header_is_refused_at_once(
        start_router: Start, fast_path: str) -> None:
    """A whole frame whose body is the start of a header the thread learned is not a cut
    header: it goes to Python now (which refuses it), not held for bytes that never come."""
    router = await start_router(fast_path=fast_path)
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    learned = wire.encode(wire.Route("g", b"B", b"A", b"learn"))
    for _ in range(2):  # the first goes up and teaches the thread the header
        await a.send_raw(learned)
        assert await b.recv() == wire.Route("g", b"B", b"A", b"learn")
    await a.send_raw(struct.pack(">I", 3) + learned[4:7])
    got = await closed_with(a.stream)
    d = wire.Decoder()
    d.feed(got)
    err = d.next_frame()
    assert isinstance(err, wire.Error) and err.code == "protocol", err


@pytest.mark.parametrize("fast_path", ["on", "off"])
async def test_jgroups5_frame_shorter_than_a_learned_header_is_handled_at_once(
        start_router: Start, fast_path: str) -> None:
    router = await start_router(fast_path=fast_path)
    x, y = await j5_pair(router)
    for i in range(2):  # the first goes up and teaches the thread the header
        frame = await x.message("cluster", uuid(2, 5), uuid(1, 5), b"m%d" % i)
        with trio.fail_after(5):
            while not isinstance(ev := await y.recv(), j5.Message):
                pass
        assert ev.raw == frame
    # 5.x skips a malformed frame (counted) and reads on: nothing else is sent, so a thread
    # that held it would leave it unhandled.
    await x.send_raw(struct.pack(">I", 3) + frame[4:7])
    drops = router.hub.counters.drops
    with trio.fail_after(5):
        while drops.get("malformed", 0) < 1:
            await trio.sleep(0.01)
    await x.sync()  # and the connection is still served


@pytest.mark.parametrize("fast_path", ["on", "off"])
async def test_held_frames_count_against_the_partial_frames_budget(start_router: Start,
                                                                   fast_path: str) -> None:
    """Frames larger than preauth_max_frame cut by a read are charged to the router-wide
    partial_frames_budget: the thread does not hold them outside it (many connections each
    holding the start of a learned route's large frame would pin memory past the bound)."""
    router = await start_router(fast_path=fast_path, preauth_max_frame=4096, max_frame=100_000,
                                jgroups_max_frame=100_000, partial_frames_budget=100_000)
    a1, a2, b = await NativeClient.several(router, 3)
    await a1.connect("g", b"A1")
    await a2.connect("g", b"A2")
    await b.connect("g", b"B")
    starts = []
    for cl, addr in ((a1, b"A1"), (a2, b"A2")):
        for _ in range(2):  # the first teaches the thread the header
            await cl.send(wire.Route("g", b"B", addr, b"learn"))
            assert await b.recv() == wire.Route("g", b"B", addr, b"learn")
        starts.append(wire.encode(wire.Route("g", b"B", addr, b"x" * 90_000))[:30_000])
    await a1.send_raw(starts[0])  # 90 kB of the 100 kB budget, held for A1
    with trio.fail_after(5):
        while router.hub.counters.partial_bytes < 90_000:
            await trio.sleep(0.01)
    await a2.send_raw(starts[1])  # does not fit: refused, as the pure-Python path does
    err = await a2.recv()
    assert isinstance(err, wire.Error) and err.code == "limit", err
    assert router.hub.counters.drops.get("partial_frames_budget") == 1


def test_a_relay_started_again_after_stop_waits_instead_of_spinning() -> None:
    """Relay.stop() wakes the thread through an eventfd; a later start() must drain it, or
    the new thread would find it readable forever and spin on a core."""
    mod = fastpath._relay
    assert mod is not None, "the compiled extension is not built (scripts/setup)"
    relay = mod.Relay()
    relay.start()
    relay.stop()
    relay.start()
    try:
        before = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - before < 0.1  # a spinning thread burns ~0.3 s here
    finally:
        relay.stop()
