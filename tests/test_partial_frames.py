"""Memory an unauthenticated client can pin (issue 12, item 3), on real sockets.

* Before a connection is authenticated (native: HELLO accepted; JGroups: a member registered)
  it may not announce a frame above ``preauth_max_frame``: refused on the length prefix.
* ``partial_frames_budget`` bounds the bytes held in larger incomplete frames router-wide:
  past it a JGroups frame is skipped (the connection stays), a native connection is closed.
* A closed connection's session and buffers are freed at once, without the cycle collector.

Honest members of all three protocols exchange sequenced messages throughout and lose nothing.
"""

from __future__ import annotations

import gc
import hashlib
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import trio

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from gossiprouter.sessions.base import Session
from tests.conftest import RouterFactory
from tests.jgroups_clients import V2, V5, J2Client, J5Client, ip, uuid
from tests.nclient import NativeClient
from tests.ops_client import tokens_file
from tests.test_ops_metrics import scrape, v

MiB = 1 << 20
TOKEN = "partial-frames-token-0123456789"
COUNT = 300  # sequenced messages per honest protocol


def _tokens(tmp_path: Path) -> Path:
    return tokens_file(tmp_path, f'''
[[token]]
identity = "honest"
sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"
groups = ["*"]
''')


def _addr(router: Server) -> tuple[str, int]:
    assert router.address is not None
    return router.address


async def _wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.01)
    assert cond(), what


async def _native_pair(router: Server) -> tuple[NativeClient, NativeClient]:
    a = await NativeClient.open(*_addr(router), token=TOKEN)
    b = await NativeClient.open(*_addr(router), token=TOKEN)
    assert isinstance(await a.connect("honest", b"A"), wire.Ok)
    assert isinstance(await b.connect("honest", b"B"), wire.Ok)
    return a, b


async def _sequenced(send: Callable[[bytes], Awaitable[object]],
                     next_seq: Callable[[], Awaitable[int | None]], started: trio.Event) -> None:
    """Send COUNT sequenced payloads (a 4-byte number, 200 filler bytes) a few at a time,
    setting ``started`` after the tenth; ``next_seq`` receives one event and returns the
    number it carries (None for anything but a message). All must arrive, in order."""
    got: list[int] = []

    async def recv() -> None:
        while len(got) < COUNT:
            seq = await next_seq()
            if seq is not None:
                got.append(seq)

    async with trio.open_nursery() as n:
        n.start_soon(recv)
        for i in range(COUNT):
            await send(i.to_bytes(4, "big") + b"." * 200)
            if i == 10:
                started.set()
            await trio.sleep(0.001)
    assert got == list(range(COUNT))


async def _native_traffic(a: NativeClient, b: NativeClient, started: trio.Event) -> None:
    """A sends COUNT sequenced unicasts to B, a few at a time; B gets all, in order."""
    async def seq() -> int | None:
        f = await b.recv(timeout=20)
        return int.from_bytes(f.payload[:4], "big") if isinstance(f, wire.Route) else None

    await _sequenced(lambda p: a.send(wire.Route("honest", b"B", b"A", p)), seq, started)


async def _j5_traffic(router: Server, started: trio.Event) -> None:
    a = await J5Client.open(*_addr(router))
    b = await J5Client.open(*_addr(router))
    await a.register("honest", uuid(1, V5), "A", ip(7800, V5))
    await b.register("honest", uuid(2, V5), "B", ip(7801, V5))
    await a.sync()
    await b.sync()

    async def seq() -> int | None:
        ev = await b.recv(timeout=20)
        # The payload is the frame's tail.
        return int.from_bytes(ev.raw[-204:-200], "big") if isinstance(ev, j5.Message) else None

    await _sequenced(lambda p: a.message("honest", uuid(2, V5), uuid(1, V5), p), seq, started)


async def _j2_traffic(router: Server, started: trio.Event) -> None:
    a = await J2Client.open(*_addr(router))
    b = await J2Client.open(*_addr(router))
    assert (await a.connect("honest", uuid(1, V2), "A", [ip(7800, V2)])).ok
    assert (await b.connect("honest", uuid(2, V2), "B", [ip(7801, V2)])).ok

    async def seq() -> int | None:
        ev = await b.recv(timeout=20)
        return int.from_bytes(ev.payload[:4], "big") if isinstance(ev, j2.Message) else None

    await _sequenced(lambda p: a.message("honest", uuid(2, V2), p), seq, started)


async def test_preauth_limit_and_budget_with_honest_traffic(
        start_router: RouterFactory, tmp_path: Path) -> None:
    """With tokens on, the attacks of the issue (pre-auth partial frames of megabytes, on every
    protocol) are refused on the length prefix; authenticated connections are bounded by the
    budget; honest members of all three protocols lose nothing meanwhile, and once the
    attackers are gone nothing stays reserved."""
    router = await start_router(
        tokens_file=str(_tokens(tmp_path)), max_frame=4 * MiB, jgroups_max_frame=4 * MiB,
        partial_frames_budget=8 * MiB)
    counters = router.hub.counters
    host, port = _addr(router)
    na, nb = await _native_pair(router)
    started = [trio.Event() for _ in range(3)]
    attackers: list[trio.SocketStream] = []

    def holds(attack: int) -> bool:
        """The budget gauge shows ``attack`` bytes held by the attackers, give or take one
        honest frame per honest connection split across two reads."""
        return 0 <= counters.partial_bytes - attack < 6 * 300

    async def attack() -> None:
        for ev in started:
            await ev.wait()
        # Pre-auth: a 3 MiB HELLO (native), frame (5.x), message buffer (2.12), all within
        # max_frame / jgroups_max_frame but above preauth_max_frame: refused at once.
        openings = [
            wire.PREAMBLE + (3 * MiB).to_bytes(4, "big") + b"\x94" * 1000,
            (3 * MiB).to_bytes(4, "big") + b"\x00" * 1000,
            j2.message("g", None, b"x")[:-5] + (3 * MiB).to_bytes(4, "big") + b"x" * 1000,
        ]
        refused = []
        for i in range(30):
            s = await trio.open_tcp_stream(host, port)
            await s.send_all(openings[i % 3])
            refused.append(s)
        for s in refused:
            with trio.fail_after(10):
                while await s.receive_some(65536):
                    pass  # until the router closes it
            await s.aclose()
        assert holds(0)
        # Pre-auth but small (a slow HELLO is legitimate): held, and counted.
        for _ in range(10):
            s = await trio.open_tcp_stream(host, port)
            await s.send_all(wire.PREAMBLE + (60_000).to_bytes(4, "big") + b"\x94" * 100)
            attackers.append(s)
        await _wait_for(lambda: holds(10 * 60_004), "pre-auth partials held")
        # Authenticated (registered) 5.x connections start 3 MiB frames: two fit the budget,
        # the third is skipped (and its connection stays usable).
        j5s = []
        for i in range(3):
            c = await J5Client.open(host, port)
            await c.register("attack", uuid(10 + i, V5), f"X{i}")
            await c.sync()
            await c.send_raw((3 * MiB).to_bytes(4, "big") + b"\x04" * 1000)
            j5s.append(c)
            if i < 2:
                want = 10 * 60_004 + (i + 1) * (3 * MiB + 4)
                await _wait_for(partial(holds, want), "5.x partial frame held")
        await _wait_for(lambda: counters.drops.get("partial_frames_budget") == 1,
                        "the third 5.x partial frame skipped")
        assert holds(10 * 60_004 + 2 * (3 * MiB + 4))
        # The skipped frame streams past; the connection is still in sync.
        await j5s[2].send_raw(b"\x04" * (3 * MiB - 1000))
        await j5s[2].sync()
        # An authenticated native connection starting a 3 MiB frame: no room, ERROR limit.
        n = await NativeClient.open(host, port, token=TOKEN)
        await n.send_raw((3 * MiB).to_bytes(4, "big") + b"\x94" * 1000)
        frames = await n.recv_until_closed()
        assert [(f.code if isinstance(f, wire.Error) else f) for f in frames] == ["limit"]
        assert counters.drops.get("partial_frames_budget") == 2
        for c in j5s:
            await c.aclose()
        for s in attackers:
            await s.aclose()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attack)
            nursery.start_soon(_native_traffic, na, nb, started[0])
            nursery.start_soon(_j5_traffic, router, started[1])
            nursery.start_soon(_j2_traffic, router, started[2])
    await _wait_for(lambda: counters.partial_bytes == 0, "budget back to 0 after the closes")
    assert counters.drops.get("slow_consumer", 0) == 0


def _count_is(router: Server, n: int) -> bool:
    return len(router.connections) == n


async def _session_of(router: Server, before: set[int]) -> Session:
    """The session of the one connection opened since ``before`` (ids of connections)."""
    with trio.fail_after(5):
        while True:
            new = [c for c in router.connections if id(c) not in before and c.session]
            if new:
                s = new[0].session
                assert s is not None
                return s
            await trio.sleep(0.005)


async def test_closed_connection_freed_without_gc(start_router: RouterFactory) -> None:
    """A closed connection's session (with its half-received frame) is freed as soon as the
    connection is over, with the cycle collector off: no reference cycle keeps it (and its
    buffers) alive, and the budget gauge returns to 0. All three protocols."""
    router = await start_router()
    counters = router.hub.counters
    host, port = _addr(router)
    openers: list[Callable[[], Awaitable[trio.SocketStream]]] = []

    async def native() -> trio.SocketStream:
        s = await trio.open_tcp_stream(host, port)
        await s.send_all(wire.PREAMBLE + wire.encode(wire.Hello((1,), "t", None)))
        await s.send_all((1 << 20).to_bytes(4, "big") + b"\x94" * 50_000)
        return s

    async def jg5() -> trio.SocketStream:
        c = await J5Client.open(host, port)
        await c.register("g", uuid(1, V5), "A")
        await c.sync()
        await c.send_raw(j5.message("g", None, uuid(1, V5), b"x" * 300_000)[:200_000])
        return c.stream

    async def jg2() -> trio.SocketStream:
        c = await J2Client.open(host, port)
        assert (await c.connect("g", uuid(1, V2), "A")).ok
        await c.send_raw(j2.message("g", None, b"x" * 300_000)[:200_000])
        return c.stream

    openers = [native, jg5, jg2]
    gc.collect()
    gc.disable()
    try:
        for open_ in openers:
            before = {id(c) for c in router.connections}
            stream = await open_()
            session = await _session_of(router, before)
            await _wait_for(lambda: counters.partial_bytes > 100_000, "partial frame held")
            ref = weakref.ref(session)
            del session
            await stream.aclose()
            await _wait_for(partial(_count_is, router, len(before)), "closed")
            await _wait_for(lambda: counters.partial_bytes == 0, "budget released")
            await trio.sleep(0.05)  # the connection's task is over
            assert ref() is None, f"{open_.__name__}: session kept alive after close"
    finally:
        gc.enable()


async def test_native_preauth_error_and_budget_gauge(
        start_router: RouterFactory, tmp_path: Path) -> None:
    """Before HELLO, a frame above preauth_max_frame (but within max_frame) gets ERROR
    frame_too_large naming the limit; a small partial HELLO is held and shows in the
    gossiprouter_partial_frame_bytes gauge until its connection closes."""
    router = await start_router(tokens_file=str(_tokens(tmp_path)), metrics="127.0.0.1:0")
    host, port = _addr(router)
    bad = await NativeClient.open(host, port, hello=False)
    await bad.send_raw((1 * MiB).to_bytes(4, "big") + b"\x94" * 100)
    [err] = await bad.recv_until_closed()
    assert isinstance(err, wire.Error) and err.code == "frame_too_large", err
    assert "preauth_max_frame 65536" in err.message
    slow = await NativeClient.open(host, port, hello=False)
    await slow.send_raw((50_000).to_bytes(4, "big") + b"\x94" * 100)
    await _wait_for(lambda: router.hub.counters.partial_bytes == 50_004, "partial HELLO held")
    assert v(await scrape(router), "gossiprouter_partial_frame_bytes") == 50_004
    await slow.aclose()
    await _wait_for(lambda: router.hub.counters.partial_bytes == 0, "released")
    assert v(await scrape(router), "gossiprouter_partial_frame_bytes") == 0


def test_budget_must_hold_the_largest_frame() -> None:
    """partial_frames_budget below max_frame or jgroups_max_frame is refused at start-up with
    one line naming both options (no such frame could ever be buffered)."""
    with pytest.raises(ConfigError, match="partial_frames_budget = 1048576: expected at least "
                       "jgroups_max_frame"):
        Config(partial_frames_budget=1 << 20, max_frame=1 << 20)
    with pytest.raises(ConfigError, match="expected at least max_frame"):
        Config(partial_frames_budget=1 << 20, jgroups_max_frame=1 << 20, max_frame=2 << 20,
               outbound_queue_bytes=4 << 20)
    Config(partial_frames_budget=1 << 20, jgroups_max_frame=1 << 20, max_frame=1 << 20)
