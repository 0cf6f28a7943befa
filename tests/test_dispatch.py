"""The dispatcher read path (server.dispatch): unit tests on socket pairs with a recording
session, and the server's use of it on real 127.0.0.1 connections."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trustme

from gossiprouter.client.tls import client_context
from gossiprouter.protocol import native as wire
from gossiprouter.server.dispatch import END, READ, Dispatcher
from gossiprouter.server.listener import Server
from gossiprouter.sessions.outbox import BATCH_HOLD_BYTES, BATCH_MAX_PUSH, Outbox, WriteBatch
from tests.conftest import RouterFactory
from tests.hostile import (
    FLOOD_BUDGET,
    Honest,
    during,
    native_control_flood,
    pipelined_pings,
    throttled_then_closed,
)
from tests.nclient import NativeClient
from tests.ops_client import OpsClient
from tests.test_hostile import _boom, honest_traffic, still_serving
from tests.test_ops_tls import _ca_file, _server_files


class Recorder:
    """A Feed (what the dispatcher hands each chunk to) that records what it is given."""

    def __init__(self, name: str, log: list[tuple[str, bytes]], *,
                 fail_on: bytes | None = None, step: int = READ) -> None:
        self.name = name
        self.log = log
        self.outbox = Outbox(1 << 20, 1000, "drop")
        self.fail_on = fail_on
        self.step = step  # what feed() returns
        self.eofs = 0

    @property
    def closed(self) -> bool:
        return self.outbox.closed

    def feed(self, data: bytes) -> int:
        self.log.append((self.name, data))
        if self.fail_on is not None and self.fail_on in data:
            raise ValueError(f"{self.name}: bad bytes")
        return self.step

    def eof(self) -> None:
        self.eofs += 1


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b


async def _started(nursery: trio.Nursery, recv_size: int = 64) -> Dispatcher:
    d = Dispatcher(recv_size)
    await nursery.start(d.run)
    return d


class Settler:
    """The connection task's side of a hand-back: records the steps, says whether to read on."""

    def __init__(self, read_on: bool = True) -> None:
        self.steps: list[int] = []
        self.read_on = read_on

    async def __call__(self, feeder: Recorder, step: int) -> bool:
        self.steps.append(step)
        await trio.sleep(0)
        return self.read_on


async def _until(cond: object, what: str) -> None:
    with trio.fail_after(10):
        while not cond():  # type: ignore[operator]
            await trio.sleep(0.005)


async def _serving(nursery: trio.Nursery, d: Dispatcher, s: Recorder,
                   settle: Settler | None = None
                   ) -> tuple[socket.socket, socket.socket, Callable[[], Awaitable[None]]]:
    """Serve the reading end ``r`` of a new socket pair for ``s`` in the background; returns
    once the connection is registered (the only one: the callers serve one at a time), with
    ``r``, the writing end and a function that waits (bounded) until ``d.serve`` has
    returned."""
    r, w = _pair()
    done = trio.Event()

    async def serve() -> None:
        await d.serve(r, s, Settler() if settle is None else settle)
        done.set()

    async def ended() -> None:
        with trio.fail_after(10):
            await done.wait()

    nursery.start_soon(serve)
    await _until(lambda: len(d) == 1, "registered")
    return r, w, ended


async def test_one_slice_per_connection_per_round(nursery: trio.Nursery) -> None:
    """A connection with much to read gets recv_size bytes per round, so another ready
    connection is served in the same round instead of after the first is drained."""
    d = await _started(nursery, recv_size=64)
    log: list[tuple[str, bytes]] = []
    (ra, wa), (rb, wb) = _pair(), _pair()
    sa, sb = Recorder("a", log), Recorder("b", log)
    nursery.start_soon(d.serve, ra, sa, Settler())
    nursery.start_soon(d.serve, rb, sb, Settler())
    await _until(lambda: len(d) == 2, "both registered")
    wa.sendall(b"x" * 1000)  # 16 slices
    wb.sendall(b"y" * 10)
    await _until(lambda: sum(len(x) for n, x in log if n == "a") == 1000
                 and any(n == "b" for n, _ in log), "everything read")
    assert all(len(x) <= 64 for _, x in log)
    assert [n for n, _ in log].index("b") <= 1  # in the first round with a's first slice
    assert b"".join(x for n, x in log if n == "a") == b"x" * 1000
    assert d.reads == len(log)
    for s in (ra, wa, rb, wb):
        s.close()


async def test_eof_ends_serve_and_unregisters(nursery: trio.Nursery) -> None:
    d = await _started(nursery)
    s = Recorder("a", [])
    r, w, ended = await _serving(nursery, d, s)
    w.sendall(b"hello")
    w.close()
    await ended()
    assert s.eofs == 1 and s.log == [("a", b"hello")] and len(d) == 0
    r.close()


async def test_session_error_raised_in_its_own_task_others_served(
        nursery: trio.Nursery) -> None:
    """An exception from one session's on_data ends that connection's serve() (where the
    server handles it as for a reader task); the dispatcher goes on reading the others."""
    d = await _started(nursery)
    log: list[tuple[str, bytes]] = []
    (ra, wa), (rb, wb) = _pair(), _pair()
    bad, good = Recorder("bad", log, fail_on=b"!"), Recorder("good", log)
    caught: list[BaseException] = []

    async def serve_bad() -> None:
        try:
            await d.serve(ra, bad, Settler())
        except ValueError as e:
            caught.append(e)

    nursery.start_soon(serve_bad)
    nursery.start_soon(d.serve, rb, good, Settler())
    await _until(lambda: len(d) == 2, "registered")
    wa.sendall(b"!")
    await _until(lambda: bool(caught), "error raised")
    assert str(caught[0]) == "bad: bad bytes" and len(d) == 1
    wb.sendall(b"still read")
    await _until(lambda: ("good", b"still read") in log, "other connection read")
    for s in (ra, wa, rb, wb):
        s.close()


async def test_wait_step_handed_back_to_settle_then_reregisters(
        nursery: trio.Nursery) -> None:
    """A step other than READ/END (a wait the Feeder asks for) is passed to settle in the
    connection's own task; when settle says read on, the connection is registered again."""
    d = await _started(nursery)
    log: list[tuple[str, bytes]] = []
    r, w = _pair()
    s = Recorder("a", log, step=4)
    settle = Settler()
    nursery.start_soon(d.serve, r, s, settle)
    await _until(lambda: len(d) == 1, "registered")
    w.sendall(b"one")
    await _until(lambda: settle.steps == [4] and len(d) == 1, "handed back, registered again")
    w.sendall(b"two")
    await _until(lambda: len(settle.steps) == 2, "read again after settling")
    assert b"".join(x for _, x in log) == b"onetwo"
    r.close()
    w.close()


async def test_settle_false_or_end_ends_serve(nursery: trio.Nursery) -> None:
    d = await _started(nursery)
    for step, read_on in ((4, False), (END, True)):
        s = Recorder("a", [], step=step)
        settle = Settler(read_on)
        r, w, ended = await _serving(nursery, d, s, settle)
        w.sendall(b"x")
        await ended()
        # END never reaches settle; a wait step does, and its False ends the reader.
        assert settle.steps == ([] if step == END else [step]) and len(d) == 0
        r.close()
        w.close()


async def test_closed_session_handed_back_without_reading(nursery: trio.Nursery) -> None:
    d = await _started(nursery)
    s = Recorder("a", [])
    r, w, ended = await _serving(nursery, d, s)
    s.outbox.close("test")
    w.sendall(b"late")
    await ended()
    assert s.log == [] and not s.eofs and len(d) == 0 and d.reads == 0
    r.close()
    w.close()


async def test_cancelled_serve_unregisters(nursery: trio.Nursery) -> None:
    d = await _started(nursery)
    r, w = _pair()
    with trio.move_on_after(0.05):
        await d.serve(r, Recorder("a", []), Settler())
    assert len(d) == 0
    r.close()
    w.close()


@pytest.mark.parametrize("on", [True, False])
async def test_server_reads_plain_tcp_through_dispatcher_when_on(
        start_router: RouterFactory, on: bool) -> None:
    # The pure-Python dispatcher (the compiled fast path reads these itself: test_fastpath).
    router: Server = await start_router(dispatcher=on, fast_path="off")
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


# ------------------------------------------------------------------ fairness and containment
# The socket suites (tests/test_hostile_fairness.py, tests/test_hostile.py) run with whatever
# read path the conftest option --dispatcher selects (default: on) and the fast path as the
# environment says (scripts/test runs both); these tests pin each read path in turn (the
# pure-Python dispatcher, and the compiled fast path, whose thread hands what it cannot relay
# to the same Feeders) and check that what they attack was read by it, and that the waits
# (turns, control budget) went through the hand-back to the connection's task.


def _fed(router: Server) -> int:
    """Chunks the read path under test handed to Feeders: the pure-Python dispatcher's
    reads, or the compiled fast path's upcalls (what its thread could not relay)."""
    return router.dispatcher.reads if router.fast is None else router.fast.upcalls


def _handbacks(router: Server) -> int:
    """Connections the read path handed back to their task for a wait."""
    return router.dispatcher.handbacks if router.fast is None else router.fast.handbacks


@pytest.mark.parametrize("fast_path", ["off", "on"])
async def test_pipelined_pings_take_turns_on_the_dispatcher(start_router: RouterFactory,
                                                            fast_path: str) -> None:
    """The pipeline (one read) is fed in turns: the dispatcher (or the fast path) hands the
    flooder back for a checkpoint, the honest pair is served meanwhile, and every PONG
    arrives."""
    router = await start_router(dispatcher=True, control_rate=0, fast_path=fast_path)
    assert (router.fast is not None) == (fast_path == "on")
    pipeline = pipelined_pings(router, 5000)

    async def attack(honest: Honest) -> None:
        fed = _fed(router)
        await pipeline(honest)
        assert _fed(router) > fed

    await during(router, attack)
    assert router.hub.counters.turns_cut > 0 and _handbacks(router) > 0


@pytest.mark.parametrize("fast_path", ["off", "on"])
async def test_control_flood_throttled_then_closed_on_the_dispatcher(
        start_router: RouterFactory, fast_path: str) -> None:
    router = await start_router(dispatcher=True, fast_path=fast_path, **FLOOD_BUDGET)
    assert (router.fast is not None) == (fast_path == "on")
    frame = wire.encode(wire.Ping(3))
    await throttled_then_closed(router, lambda: native_control_flood(router, frame))
    assert _handbacks(router) > 0 and _fed(router) > 0


def _reads(router: Server) -> int:
    """What the read path under test has handled: the pure-Python dispatcher's reads, or the
    frames the compiled fast path's thread relayed."""
    if router.fast is None:
        return router.dispatcher.reads
    router.hub.sync()
    return router.hub.counters.fast_relayed


@pytest.mark.parametrize("fast_path", ["off", "on"])
async def test_exception_contained_on_the_dispatcher(
        start_router: RouterFactory, monkeypatch: pytest.MonkeyPatch, fast_path: str) -> None:
    """An exception from a session read by the dispatcher (or the fast path's thread) closes
    only that connection (ERROR internal_error), and the reading goes on for everyone else."""
    router = await start_router(dispatcher=True, fast_path=fast_path)
    assert (router.fast is not None) == (fast_path == "on")
    async with honest_traffic(router):
        await trio.sleep(0.05)
        monkeypatch.setattr(wire, "encode_members", _boom)
        assert router.address is not None
        nc = await NativeClient.open(*router.address)
        await nc.send(wire.GetMembers(7, "honest"))
        frames = await nc.recv_until_closed(timeout=5)
        assert frames == [wire.Error(None, "internal_error",
                                     "internal router error; see the router's log")]
        monkeypatch.undo()
        reads = _reads(router)
        await trio.sleep(0.05)
        assert _reads(router) > reads  # honest traffic still read by the same path
    assert router.hub.counters.internal_errors == 1
    await still_serving(router)


async def test_tls_connections_stay_on_their_reader_task(start_router: RouterFactory,
                                                         tmp_path: Path) -> None:
    """The dispatcher reads raw sockets: a TLS connection (its bytes are records, not frames)
    is never registered with it; its own reader task serves it."""
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca)
    router = await start_router(dispatcher=True, tls_cert=str(cert), tls_key=str(key))
    assert router.address is not None
    ctx = client_context(_ca_file(tmp_path, ca, "server"))
    a = await OpsClient.open(*router.address, ssl_context=ctx)
    b = await OpsClient.open(*router.address, ssl_context=ctx)
    assert await a.connect("g", b"A") == wire.Ok(1)
    assert await b.connect("g", b"B") == wire.Ok(1)
    for i in range(5):
        await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
        assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
    assert len(router.dispatcher) == 0 and router.dispatcher.reads == 0
    assert router.hub.counters.routed >= 5  # counted by the sessions, fed by the readers


async def test_write_deadline_counts_from_the_wake_up(start_router: RouterFactory,
                                                      tmp_path: Path) -> None:
    """A connection idle for longer than write_timeout gets data that its writer task must
    send (TLS: no direct send). If the reaper runs before that task does, the connection
    has not stalled: it must not be closed as a slow consumer."""
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca)
    router = await start_router(write_timeout=0.5, tls_cert=str(cert), tls_key=str(key))
    assert router.address is not None
    ctx = client_context(_ca_file(tmp_path, ca, "server"))
    b = await OpsClient.open(*router.address, ssl_context=ctx)
    assert await b.connect("g", b"B") == wire.Ok(1)
    session = next(c.session for c in router.connections if c.session is not None)
    await trio.sleep(0.6)  # idle for longer than write_timeout
    session.push(wire.encode_route("g", b"B", b"A", b"late"))  # wakes the writer
    # One reaper round now, before the writer task has run (no checkpoint in between).
    with trio.move_on_after(0):
        await router._reap(0, 0.5)
    assert not session.outbox.closed and router.hub.counters.write_timeouts == 0
    assert await b.recv() == wire.Route("g", b"B", b"A", b"late")


# ------------------------------------------------------------------ coalesced writes
# While a dispatcher round runs, the hub's WriteBatch is open: a push to an idle receiver is
# held and each receiver's frames go out in one send when the round ends.


class Wire:
    """A receiver's direct send that records what it was given and takes at most ``take``."""

    def __init__(self, take: int = 1 << 30) -> None:
        self.sends: list[bytes] = []
        self.take = take
        self.wakes = 0

    def send(self, data: bytes) -> int:
        self.sends.append(bytes(data))
        return min(len(data), self.take)

    def wake(self) -> None:
        self.wakes += 1


def _receiver(batch: WriteBatch, wire_: Wire, max_bytes: int = 1 << 20,
              policy: str = "drop") -> Outbox:
    ob = Outbox(max_bytes, 1000, policy, batch=batch)
    ob.direct = wire_.send
    ob.wake = wire_.wake
    return ob


def test_batch_sends_once_per_receiver_in_push_order() -> None:
    batch = WriteBatch()
    w1, w2 = Wire(), Wire()
    ob1, ob2 = _receiver(batch, w1), _receiver(batch, w2)
    batch.open = True
    assert ob1.push(b"a0") and ob2.push(b"c0") and ob1.push(b"b0") and ob1.push(b"a1")
    assert w1.sends == [] and w2.sends == []  # nothing written during the round
    batch.close()
    assert w1.sends == [b"a0b0a1"] and w2.sends == [b"c0"]
    assert batch.merged == 2 and not batch.open and not ob1.held
    assert ob1.chunks == [] and ob1.nbytes == 0 and w1.wakes == 0  # no writer task needed
    ob1.push(b"after")  # the batch is closed: a direct send again
    assert w1.sends == [b"a0b0a1", b"after"]


def test_batch_partial_send_leaves_the_rest_to_the_writer_in_order() -> None:
    batch = WriteBatch()
    w = Wire(take=3)
    ob = _receiver(batch, w)
    batch.open = True
    ob.push(b"abcd")
    ob.push(b"efgh")
    batch.close()
    assert w.sends == [b"abcdefgh"]
    assert ob.chunks == [b"defgh"] and ob.nbytes == 5 and w.wakes == 1
    ob.push(b"ij")  # queued behind the rest, as for any receiver with a queue
    assert ob.chunks == [b"defgh", b"ij"] and w.sends == [b"abcdefgh"]


def test_batch_holds_only_idle_receivers_queue_bounds_unchanged() -> None:
    """A receiver whose writer already has a queue is not held: its pushes meet the queue's
    bounds (and the slow-consumer policy) exactly as without a batch."""
    batch = WriteBatch()
    w = Wire()
    ob = _receiver(batch, w, max_bytes=10)
    ob.chunks, ob.nbytes = [b"x" * 8], 8  # queued for the writer before the round
    batch.open = True
    assert not ob.push(b"y" * 5)  # 13 > 10: refused, the caller applies the policy
    assert ob.push(b"z")
    batch.close()
    assert batch.held == [] and not ob.held and w.sends == []
    assert ob.chunks == [b"x" * 8, b"z"]


def test_batch_writes_a_receiver_early_past_the_hold_limit() -> None:
    """Held bytes never grow towards the queue's high-water mark: a push that would take the
    held bytes to BATCH_HOLD_BYTES first writes what is held, then is held itself; a push of
    BATCH_MAX_PUSH or more is never held (nor copied into a join with others)."""
    batch = WriteBatch()
    w = Wire()
    ob = _receiver(batch, w, max_bytes=4 * BATCH_HOLD_BYTES)
    part = b"q" * (BATCH_MAX_PUSH - 1)
    batch.open = True
    ob.push(b"a")
    for _ in range(BATCH_HOLD_BYTES // len(part)):
        ob.push(part)
    held = b"a" + part * (BATCH_HOLD_BYTES // len(part))
    assert w.sends == [] and ob.nbytes == len(held)
    ob.push(part)  # would reach the limit: the held bytes go now, this one is held
    assert w.sends == [held] and ob.chunks == [part] and ob.held
    big = b"B" * BATCH_MAX_PUSH
    ob.push(big)  # written after what is held, in order, and not held
    assert w.sends == [held, part, big] and ob.chunks == [] and not ob.held
    ob.push(big)  # an idle receiver: a large push goes out at once
    assert w.sends[-1] == big and not ob.held
    assert not ob.congestion.pending
    batch.close()
    assert w.sends == [held, part, big, big] and batch.merged == 0


def test_batch_skips_a_receiver_closed_during_the_round() -> None:
    batch = WriteBatch()
    w = Wire()
    ob = _receiver(batch, w)
    batch.open = True
    ob.push(b"frame")
    ob.close("slow_consumer", b"bye", discard=True)  # wakes the writer for the farewell
    batch.close()
    assert w.sends == [] and ob.chunks == [b"bye"] and w.wakes == 1


async def test_dispatcher_round_coalesces_sends_to_one_receiver(nursery: trio.Nursery) -> None:
    """Two connections ready in one round both route to one receiver: one send."""
    batch = WriteBatch()
    d = Dispatcher(64, batch)
    await nursery.start(d.run)
    w = Wire()
    target = _receiver(batch, w)

    held: list[bool] = []

    class Router(Recorder):
        def feed(self, data: bytes) -> int:
            super().feed(data)
            held.append(batch.open)
            target.push(self.name.encode() + data)
            return READ

    log: list[tuple[str, bytes]] = []
    (ra, wa), (rb, wb) = _pair(), _pair()
    nursery.start_soon(d.serve, ra, Router("a", log), Settler())
    nursery.start_soon(d.serve, rb, Router("b", log), Settler())
    await _until(lambda: len(d) == 2, "both registered")
    wakeups = d.wakeups
    wa.send(b"1")  # both readable before the dispatcher's next round
    wb.send(b"2")
    await _until(lambda: len(log) == 2, "both read")
    assert d.wakeups == wakeups + 1
    assert len(w.sends) == 1 and sorted([w.sends[0][:2], w.sends[0][2:]]) == [b"a1", b"b2"]
    assert w.sends[0] == b"".join(n.encode() + x for n, x in log)  # in routing order
    assert batch.merged == 1 and not batch.open and held == [True, True]
    # A round with one ready connection holds nothing (its chunk is usually one message).
    wa.send(b"3")
    await _until(lambda: len(log) == 3, "read")
    assert held[2] is False and w.sends[1:] == [b"a3"] and batch.merged == 1
    for s in (ra, wa, rb, wb):
        s.close()


@pytest.mark.parametrize("coalesce", [True, False])
async def test_server_coalesces_a_rounds_multicasts_per_receiver(
        start_router: RouterFactory, coalesce: bool) -> None:
    """Two members multicast in the same round: the third member gets both in one send when
    coalesce_writes is on; every frame arrives, each sender's in order, either way."""
    router: Server = await start_router(dispatcher=True, coalesce_writes=coalesce,
                                        fast_path="off")
    assert router.address is not None
    a, b, r = [await NativeClient.open(*router.address) for _ in range(3)]
    try:
        for c, addr in ((a, b"A"), (b, b"B"), (r, b"R")):
            await c.connect("g", addr)
        await _until(lambda: len(router.dispatcher) == 3, "all on the dispatcher")
        batch = router.hub.batch
        rounds = 0
        for i in range(20):
            merged = batch.merged
            # Written without a checkpoint in between: one dispatcher round reads both.
            os.write(a.raw.socket.fileno(), wire.encode(wire.Route("g", None, b"A", b"a%d" % i)))
            os.write(b.raw.socket.fileno(), wire.encode(wire.Route("g", None, b"B", b"b%d" % i)))
            got = {await r.recv(), await r.recv()}
            assert got == {wire.Route("g", None, b"A", b"a%d" % i),
                           wire.Route("g", None, b"B", b"b%d" % i)}
            assert await a.recv() == wire.Route("g", None, b"B", b"b%d" % i)
            assert await b.recv() == wire.Route("g", None, b"A", b"a%d" % i)
            rounds += batch.merged - merged
        assert rounds == (20 if coalesce else 0)
    finally:
        for c in (a, b, r):
            await c.aclose()
