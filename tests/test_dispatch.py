"""The dispatcher read path (gossiprouter.dispatch): unit tests on socket pairs with a recording
session, and the server's use of it on real 127.0.0.1 connections."""

from __future__ import annotations

import socket
from typing import cast

import pytest
import trio

from gossiprouter.config import Config
from gossiprouter.dispatch import Dispatcher
from gossiprouter.protocol import native as wire
from gossiprouter.server import Server
from gossiprouter.sessions.base import Hub, Outbox, Session
from tests.conftest import RouterFactory
from tests.nclient import NativeClient


class Recorder:
    """Just what the dispatcher uses of a session: records what it is given."""

    def __init__(self, name: str, log: list[tuple[str, bytes]], *,
                 fail_on: bytes | None = None, congest: Hub | None = None) -> None:
        self.name = name
        self.log = log
        self.outbox = Outbox(1 << 20, 1000, "drop")
        self.fail_on = fail_on
        self.congest = congest
        self.eof = False

    def on_data(self, data: bytes, now: float) -> None:
        self.log.append((self.name, data))
        if self.fail_on is not None and self.fail_on in data:
            raise ValueError(f"{self.name}: bad bytes")
        if self.congest is not None:
            self.congest.congestion.pending = True

    def on_eof(self) -> None:
        self.eof = True


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b


async def _started(hub: Hub, nursery: trio.Nursery, recv_size: int = 64,
                   throttles: list[int] | None = None) -> Dispatcher:
    async def throttle() -> None:
        if throttles is not None:
            throttles.append(1)
        await trio.sleep(0)

    d = Dispatcher(hub, recv_size, throttle)
    await nursery.start(d.run)
    return d


async def _until(cond: object, what: str) -> None:
    with trio.fail_after(10):
        while not cond():  # type: ignore[operator]
            await trio.sleep(0.005)


async def test_one_slice_per_connection_per_round(nursery: trio.Nursery) -> None:
    """A connection with much to read gets recv_size bytes per round, so another ready
    connection is served in the same round instead of after the first is drained."""
    hub = Hub(Config())
    d = await _started(hub, nursery, recv_size=64)
    log: list[tuple[str, bytes]] = []
    (ra, wa), (rb, wb) = _pair(), _pair()
    sa, sb = Recorder("a", log), Recorder("b", log)
    nursery.start_soon(d.serve, ra, cast(Session, sa))
    nursery.start_soon(d.serve, rb, cast(Session, sb))
    await _until(lambda: len(d) == 2, "both registered")
    wa.sendall(b"x" * 1000)  # 16 slices
    wb.sendall(b"y" * 10)
    await _until(lambda: sum(len(x) for n, x in log if n == "a") == 1000
                 and any(n == "b" for n, _ in log), "everything read")
    assert all(len(x) <= 64 for _, x in log)
    assert [n for n, _ in log].index("b") <= 1  # in the first round with a's first slice
    assert b"".join(x for n, x in log if n == "a") == b"x" * 1000
    assert hub.counters.bytes_in == 1010 and d.reads == len(log)
    for s in (ra, wa, rb, wb):
        s.close()


async def test_eof_ends_serve_and_unregisters(nursery: trio.Nursery) -> None:
    hub = Hub(Config())
    d = await _started(hub, nursery)
    r, w = _pair()
    s = Recorder("a", [])
    done = trio.Event()

    async def serve() -> None:
        await d.serve(r, cast(Session, s))
        done.set()

    nursery.start_soon(serve)
    await _until(lambda: len(d) == 1, "registered")
    w.sendall(b"hello")
    w.close()
    with trio.fail_after(10):
        await done.wait()
    assert s.eof and s.log == [("a", b"hello")] and len(d) == 0
    r.close()


async def test_session_error_raised_in_its_own_task_others_served(
        nursery: trio.Nursery) -> None:
    """An exception from one session's on_data ends that connection's serve() (where the
    server handles it as for a reader task); the dispatcher goes on reading the others."""
    hub = Hub(Config())
    d = await _started(hub, nursery)
    log: list[tuple[str, bytes]] = []
    (ra, wa), (rb, wb) = _pair(), _pair()
    bad, good = Recorder("bad", log, fail_on=b"!"), Recorder("good", log)
    caught: list[BaseException] = []

    async def serve_bad() -> None:
        try:
            await d.serve(ra, cast(Session, bad))
        except ValueError as e:
            caught.append(e)

    nursery.start_soon(serve_bad)
    nursery.start_soon(d.serve, rb, cast(Session, good))
    await _until(lambda: len(d) == 2, "registered")
    wa.sendall(b"!")
    await _until(lambda: bool(caught), "error raised")
    assert str(caught[0]) == "bad: bad bytes" and len(d) == 1
    wb.sendall(b"still read")
    await _until(lambda: ("good", b"still read") in log, "other connection read")
    for s in (ra, wa, rb, wb):
        s.close()


async def test_congestion_hands_back_for_throttle_then_reregisters(
        nursery: trio.Nursery) -> None:
    hub = Hub(Config())
    throttles: list[int] = []
    d = await _started(hub, nursery, throttles=throttles)
    log: list[tuple[str, bytes]] = []
    r, w = _pair()
    s = Recorder("a", log, congest=hub)
    nursery.start_soon(d.serve, r, cast(Session, s))
    await _until(lambda: len(d) == 1, "registered")
    w.sendall(b"one")
    await _until(lambda: len(throttles) == 1 and len(d) == 1, "throttled, back")
    assert not hub.congestion.pending
    w.sendall(b"two")
    await _until(lambda: len(throttles) == 2, "read again after the throttle")
    assert b"".join(x for _, x in log) == b"onetwo"
    r.close()
    w.close()


async def test_closed_session_handed_back_without_reading(nursery: trio.Nursery) -> None:
    hub = Hub(Config())
    d = await _started(hub, nursery)
    r, w = _pair()
    s = Recorder("a", [])
    done = trio.Event()

    async def serve() -> None:
        await d.serve(r, cast(Session, s))
        done.set()

    nursery.start_soon(serve)
    await _until(lambda: len(d) == 1, "registered")
    s.outbox.close("test")
    w.sendall(b"late")
    with trio.fail_after(10):
        await done.wait()
    assert s.log == [] and not s.eof and len(d) == 0 and d.reads == 0
    r.close()
    w.close()


async def test_cancelled_serve_unregisters(nursery: trio.Nursery) -> None:
    hub = Hub(Config())
    d = await _started(hub, nursery)
    r, w = _pair()
    with trio.move_on_after(0.05):
        await d.serve(r, cast(Session, Recorder("a", [])))
    assert len(d) == 0
    r.close()
    w.close()


@pytest.mark.parametrize("on", [True, False])
async def test_server_reads_plain_tcp_through_dispatcher_when_on(
        start_router: RouterFactory, on: bool) -> None:
    router: Server = await start_router(dispatcher=on)
    assert router.address is not None
    a = await NativeClient.open(*router.address)
    b = await NativeClient.open(*router.address)
    try:
        await a.connect("g", b"A")
        await b.connect("g", b"B")
        # Every established plain-TCP connection is registered with the dispatcher when on.
        assert len(router.dispatcher) == (2 if on else 0)
        for i in range(20):
            await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
            assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
        assert (router.dispatcher.reads >= 20) if on else router.dispatcher.reads == 0
    finally:
        await a.aclose()
        await b.aclose()
    # The server's close path ran: nothing stays registered.
    with trio.fail_after(10):
        while router.connections:
            await trio.sleep(0.01)
    assert len(router.dispatcher) == 0
