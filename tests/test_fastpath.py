"""The compiled fast path (gossiprouter.server.fastpath, gossiprouter/server/relay/; issue 16).

Every test here starts its router with ``fast_path="on"``, which does not depend on the
environment: in the suite's second pass (GOSSIPROUTER_FAST_PATH=off, the pure-Python path)
these still test the thread, and a machine without the extension fails them with the reason
(the ConfigError), never skips them.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import trio

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.ops.runtime import Operations
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server import fastpath
from gossiprouter.server.fastpath import FastPath
from gossiprouter.server.listener import Server
from tests.jgroups_clients import J2Client, J5Client, JAddress, uuid
from tests.nclient import NativeClient
from tests.test_ops_metrics import scrape, v

Start = Callable[..., Awaitable[Server]]


def fast_of(router: Server) -> FastPath:
    assert router.fast is not None, "the fast path is not running"
    return router.fast


async def read_exactly(c: NativeClient, n: int, timeout: float = 5.0) -> bytes:
    """``n`` raw bytes from ``c``'s socket (what the router wrote, byte for byte)."""
    got = b""
    with trio.fail_after(timeout):
        while len(got) < n:
            got += await c.stream.receive_some(n - len(got))
    return got


async def round_trip(c: NativeClient, nonce: int) -> None:
    """PING/PONG: everything ``c`` sent before was handled by the router."""
    await c.send(wire.Ping(nonce))
    while True:
        f = await c.recv()
        if f == wire.Pong(nonce):
            return


C = TypeVar("C", J2Client, J5Client)


async def jgroups_pair(router: Server, cls: type[C]) -> tuple[C, C]:
    """Two ``cls`` clients with members x and y in "cluster", registered."""
    assert router.address is not None
    x = await cls.open(*router.address)
    y = await cls.open(*router.address)
    await x.join("cluster", uuid(1, cls.version), "x")
    await y.join("cluster", uuid(2, cls.version), "y")
    await x.settle()
    await y.settle()
    return x, y


async def j2_pair(router: Server) -> tuple[J2Client, J2Client]:
    """Two JGroups 2.12 clients with members x and y in "cluster", registered."""
    return await jgroups_pair(router, J2Client)


async def j5_pair(router: Server) -> tuple[J5Client, J5Client]:
    """Two JGroups 5.x clients with members x and y in "cluster", registered."""
    return await jgroups_pair(router, J5Client)


async def learned_pair(router: Server) -> tuple[NativeClient, NativeClient]:
    """A and B in "g", and the route from A to B, which the thread learned from its first
    frame (Python handled that one)."""
    a, b = await NativeClient.joined(router, "g", b"A", b"B")
    await a.send(wire.Route("g", b"B", b"A", b"learn"))
    assert await b.recv() == wire.Route("g", b"B", b"A", b"learn")
    return a, b


async def test_routed_frames_are_relayed_by_the_thread_byte_for_byte(start_router: Start
                                                                    ) -> None:
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b, c = await NativeClient.several(router, 3)
    for cl, addr in ((a, b"A"), (b, b"B"), (c, b"C")):
        assert await cl.connect("g", addr) == wire.Ok(1)
    await round_trip(a, 1)
    before = fast.upcalls
    # A non-minimal but valid encoding (bin32 payload): relayed as received, not re-encoded.
    uni = [struct.pack(">I", 15 + len(p)) + b"\x95\x06\xa1g\xc4\x01B\xc4\x01A\xc6"
           + struct.pack(">I", len(p)) + p for p in (b"u%03d" % i for i in range(300))]
    multi = [wire.encode(wire.Route("g", None, b"A", b"m%03d" % i)) for i in range(300)]
    for f in uni:
        await a.send_raw(f)
    for f in multi:
        await a.send_raw(f)
    assert await read_exactly(b, sum(map(len, uni + multi))) == b"".join(uni + multi)
    assert await read_exactly(c, sum(map(len, multi))) == b"".join(multi)
    # The first frame of each header went up to Python, which taught the thread the route;
    # the other 598 never reached the interpreter.
    assert fast.upcalls - before <= 4, fast.upcalls - before
    assert fast.learned >= 2
    router.hub.sync()
    assert router.hub.counters.routed == 600
    assert router.hub.counters.delivered == 300 + 2 * 300


async def test_membership_changes_are_seen_by_the_next_frame(start_router: Start) -> None:
    router = await start_router(fast_path="on")
    a, b, c = await NativeClient.several(router, 3)
    for cl, addr in ((a, b"A"), (b, b"B"), (c, b"C")):
        await cl.connect("g", addr)
    await a.send(wire.Route("g", None, b"A", b"one"))
    assert await b.recv() == wire.Route("g", None, b"A", b"one")
    assert await c.recv() == wire.Route("g", None, b"A", b"one")
    # C leaves: the thread's learned multicast must not reach it any more.
    assert await c.request(wire.Disconnect(c.req(), "g", b"C")) == wire.Ok(2)
    await a.send(wire.Route("g", None, b"A", b"two"))
    assert await b.recv() == wire.Route("g", None, b"A", b"two")
    await round_trip(c, 7)  # c got nothing before its PONG
    # B's connection goes; B registers again on a new one: the unicast follows it.
    await a.send(wire.Route("g", b"B", b"A", b"to-b-1"))
    assert await b.recv() == wire.Route("g", b"B", b"A", b"to-b-1")
    await b.stream.aclose()
    b2 = await NativeClient.to(router)
    with trio.fail_after(5):
        while await b2.connect("g", b"B") != wire.Ok(1):  # until the old connection is gone
            await trio.sleep(0.01)
            b2 = await NativeClient.to(router)
    await a.send(wire.Route("g", b"B", b"A", b"to-b-2"))
    assert await b2.recv() == wire.Route("g", b"B", b"A", b"to-b-2")
    # C joins again: multicasts reach it again.
    await c.connect("g", b"C")
    await a.send(wire.Route("g", None, b"A", b"three"))
    assert await c.recv() == wire.Route("g", None, b"A", b"three")
    assert await b2.recv() == wire.Route("g", None, b"A", b"three")


def _script(rng: random.Random) -> list[bytes]:
    """A sender's frames: routes to B, C, the group, an unknown member and a group it is not
    in, PINGs, and a leave and join of one of its addresses, in a random order."""
    frames: list[bytes] = []
    for i in range(400):
        k = rng.randrange(10)
        payload = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 5, 200, 3000))))
        if k < 3:
            frames.append(wire.encode(wire.Route("g", b"B", b"A", payload)))
        elif k < 5:
            frames.append(wire.encode(wire.Route("g", b"C", b"A2", payload)))
        elif k < 7:
            frames.append(wire.encode(wire.Route("g", None, rng.choice((b"A", b"A2")), payload)))
        elif k == 7:
            frames.append(wire.encode(wire.Ping(i)))
        elif k == 8:
            frames.append(wire.encode(wire.Route("h", None, b"A", payload)))  # not a member
        elif rng.random() < 0.5:
            frames.append(wire.encode(wire.Disconnect(10_000 + i, "g", b"A2")))
            frames.append(wire.encode(wire.Connect(20_000 + i, "g", b"A2", None, ())))
        else:
            frames.append(wire.encode(wire.Route("g", b"nobody", b"A", payload)))
    return frames


async def _run_script(router: Server, seed: int) -> dict[str, bytes]:
    """Play ``_script(seed)`` from one client, cut at random points, against ``router``;
    what each client received, byte for byte."""
    rng = random.Random(seed)
    a, b, c = await NativeClient.joined(router, "g", (b"A", b"A2"), b"B", b"C")
    stream = b"".join(_script(rng)) + wire.encode(wire.Route("g", None, b"A", b"END"))
    end = wire.encode(wire.Route("g", None, b"A", b"END"))
    pos = 0
    while pos < len(stream):
        n = rng.choice((1, 7, 100, 1500, 20_000))
        await a.send_raw(stream[pos : pos + n])
        pos += n
        if rng.random() < 0.3:
            await trio.sleep(0.002)  # a separate read, often
    out: dict[str, bytes] = {}
    for name, cl in (("B", b), ("C", c)):
        got = b""
        with trio.fail_after(10):
            while not got.endswith(end):
                got += await cl.stream.receive_some(65536)
        out[name] = got
    await a.send(wire.Ping(999_999))
    got = b""
    pong = wire.encode(wire.Pong(999_999))
    with trio.fail_after(10):
        while not got.endswith(pong):
            got += await a.stream.receive_some(65536)
    out["A"] = got
    for cl in (a, b, c):
        await cl.stream.aclose()
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_same_bytes_as_the_pure_python_path(start_router: Start, seed: int) -> None:
    """Differential: the same sender stream, cut differently into reads, gives every receiver
    exactly the bytes the pure-Python path gives it (and the sender the same replies)."""
    fast = await start_router(fast_path="on")
    slow = await start_router(fast_path="off")
    assert slow.fast is None
    want = await _run_script(slow, seed)
    got = await _run_script(fast, seed)
    assert fast_of(fast).learned > 0
    for name in want:
        assert got[name] == want[name], name


async def test_a_frame_cut_between_reads_is_held_by_the_thread(start_router: Start) -> None:
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b = await learned_pair(router)
    before = fast.upcalls
    frame = wire.encode(wire.Route("g", b"B", b"A", b"x" * 5000))
    for cut in (2, 10, 4000):  # in the length prefix, in the header, in the payload
        await a.send_raw(frame[:cut])
        await trio.sleep(0.05)
        await a.send_raw(frame[cut:])
        assert await read_exactly(b, len(frame)) == frame
    assert fast.upcalls == before


async def test_a_frame_cut_after_an_upcall_goes_back_to_the_thread(start_router: Start
                                                                    ) -> None:
    """A read that Python handles (here: a PING) and that ends inside a routed frame: Python
    hands the frame's start back to the thread, which completes it and relays the rest of the
    stream itself (without that, every later read would go to Python whole)."""
    router = await start_router(fast_path="on")
    fast = fast_of(router)
    a, b = await learned_pair(router)
    frames = [wire.encode(wire.Route("g", b"B", b"A", b"%03d" % i)) for i in range(30)]
    router.hub.sync()
    relayed, upcalls = router.hub.counters.fast_relayed, fast.upcalls
    for k in range(3):  # PING + half a frame | the rest of it + nine whole frames
        batch = frames[10 * k : 10 * k + 10]
        head = wire.encode(wire.Ping(k)) + batch[0][:9]
        await a.send_raw(head)
        assert await a.recv() == wire.Pong(k)
        await a.send_raw(batch[0][9:] + b"".join(batch[1:]))
        assert await read_exactly(b, sum(map(len, batch))) == b"".join(batch)
    router.hub.sync()
    assert fast.upcalls - upcalls == 3, fast.by_kind  # the PINGs' reads, nothing else
    assert router.hub.counters.fast_relayed - relayed == 30


E = TypeVar("E")


async def gather(client: J2Client | J5Client, kind: type[E], n: int, out: list[E]) -> None:
    """Read ``client`` until it got ``n`` events of ``kind`` (concurrently with the sender:
    receivers that keep reading are never evicted to Python)."""
    with trio.fail_after(10):
        while len(out) < n:
            ev = await client.recv()
            if isinstance(ev, kind):
                out.append(ev)


R = TypeVar("R")


async def relayed_by_the_thread(
        router: Server, x: J2Client | J5Client, y: J2Client | J5Client, kind: type[E],
        send: Callable[[JAddress | None, bytes], Awaitable[R]],
) -> tuple[list[R], list[E], list[E]]:
    """x sends 200 unicasts to y, then 200 multicasts (``send(dest, payload)``) while y reads
    all 400 and x its 200 multicasts back (JGroups semantics: the sender gets its own
    multicasts back). The thread relayed them: at most 4 went up to Python, and all 400 were
    routed. Returns what ``send`` returned, and the events of ``kind`` x and y got."""
    fast = fast_of(router)
    before = fast.upcalls
    sent: list[R] = []
    got_x: list[E] = []
    got_y: list[E] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gather, y, kind, 400, got_y)
        nursery.start_soon(gather, x, kind, 200, got_x)
        for i in range(200):
            sent.append(await send(uuid(2, x.version), b"u%03d" % i))
        for i in range(200):
            sent.append(await send(None, b"m%03d" % i))
    assert fast.upcalls - before <= 4, (fast.by_kind, fast.learned, fast.info())
    router.hub.sync()
    assert router.hub.counters.routed == 400
    return sent, got_x, got_y


async def test_jgroups2_messages_are_relayed_by_the_thread(start_router: Start) -> None:
    router = await start_router(fast_path="on")
    x, y = await j2_pair(router)
    _, got_x, got_y = await relayed_by_the_thread(
        router, x, y, j2.Message, lambda dest, payload: x.message("cluster", dest, payload))
    assert [bytes(m.payload) for m in got_y] == (
        [b"u%03d" % i for i in range(200)] + [b"m%03d" % i for i in range(200)])
    # 2.12 semantics: the sender gets its own multicasts back.
    assert [bytes(m.payload) for m in got_x] == [b"m%03d" % i for i in range(200)]


async def test_jgroups5_messages_are_relayed_by_the_thread_as_received(start_router: Start
                                                                      ) -> None:
    router = await start_router(fast_path="on")
    x, y = await j5_pair(router)
    sent, got_x, got_y = await relayed_by_the_thread(
        router, x, y, j5.Message,
        lambda dest, payload: x.message("cluster", dest, uuid(1, 5), payload))
    assert [m.raw for m in got_y] == sent  # byte for byte, in order
    # JGroups semantics: the sender gets its own multicasts back.
    assert [m.raw for m in got_x] == sent[200:]


async def test_traffic_relayed_by_the_thread_counts_for_the_idle_timeout(start_router: Start
                                                                       ) -> None:
    router = await start_router(fast_path="on", idle_timeout=0.6)
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    # Only routed frames for 2 s: the thread relays them all after the first of each; if
    # their reception did not reach the reaper, both would be closed after 0.6 s.
    for i in range(20):
        await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
        await b.send(wire.Route("g", b"A", b"B", b"%d" % i))
        assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
        assert await a.recv() == wire.Route("g", b"A", b"B", b"%d" % i)
        await trio.sleep(0.1)
    assert fast_of(router).learned >= 2
    router.hub.sync()
    assert router.hub.counters.closes.get("idle_timeout", 0) == 0
    # ...and the timeout still works once nothing comes.
    with trio.fail_after(5):
        f = await a.recv(timeout=5)
    assert isinstance(f, wire.Error) and f.code == "idle_timeout"


async def test_a_receiver_that_stops_reading_is_closed_as_a_slow_consumer(start_router: Start
                                                                         ) -> None:
    # A queue bound well above one read's worth of frames (64 KiB), as in production (16 MiB
    # by default): a receiver that keeps reading is never cut off, one that stopped is.
    router = await start_router(fast_path="on", max_frame=65536, outbound_queue_bytes=262144)
    a, b, c = await NativeClient.several(router, 3)
    for cl, addr in ((a, b"A"), (b, b"B"), (c, b"C")):
        await cl.connect("g", addr)
    frame = wire.encode(wire.Route("g", None, b"A", b"z" * 3000))
    # B never reads. C reads everything. Bounded: at most 40 MB offered.
    routes_c = 0  # ROUTE frames C received (it also gets B's suspect EVENT)

    async def drain_c() -> None:
        nonlocal routes_c
        while True:
            data = await c.stream.receive_some(1 << 20)
            if not data:
                return
            c.decoder.feed(data)
            while (f := c.decoder.next_frame()) is not None:
                routes_c += isinstance(f, wire.Route)

    sent = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain_c)
        with trio.fail_after(30):
            while router.hub.counters.slow_consumer_disconnects == 0 and sent < 13_000:
                await a.send_raw(frame * 10)
                sent += 10
        await round_trip(a, 5)  # A is still served
        with trio.fail_after(10):
            while routes_c < sent:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert router.hub.counters.slow_consumer_disconnects == 1
    assert routes_c == sent  # C lost nothing


async def test_fast_path_on_needs_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "_relay", None)
    monkeypatch.delenv(fastpath.ENV, raising=False)
    cfg = Config(host="127.0.0.1", port=0, fast_path="on")
    with pytest.raises(ConfigError, match=r"gossiprouter\.server\._relay is not built"):
        Server(cfg, hooks=Operations(cfg))
    auto = Config(host="127.0.0.1", port=0)
    assert Server(auto, hooks=Operations(auto)).fast is None  # auto: runs without it


async def test_the_environment_switches_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config(host="127.0.0.1", port=0)
    monkeypatch.setenv(fastpath.ENV, "off")
    assert Server(cfg, hooks=Operations(cfg)).fast is None
    monkeypatch.setenv(fastpath.ENV, "on")
    assert Server(cfg, hooks=Operations(cfg)).fast is not None
    # ...but not with the dispatcher or direct sends switched off in the config (the suite's
    # tests of those paths), while the option itself refuses that.
    nodisp = Config(host="127.0.0.1", port=0, dispatcher=False)
    assert Server(nodisp, hooks=Operations(nodisp)).fast is None
    bad = Config(host="127.0.0.1", port=0, dispatcher=False, fast_path="on")
    with pytest.raises(ConfigError, match="needs dispatcher and direct_send"):
        Server(bad, hooks=Operations(bad))
    monkeypatch.setenv(fastpath.ENV, "maybe")
    with pytest.raises(ConfigError, match="GOSSIPROUTER_FAST_PATH"):
        Server(cfg, hooks=Operations(cfg))
    # An explicit setting wins over the environment.
    monkeypatch.setenv(fastpath.ENV, "on")
    off = Config(host="127.0.0.1", port=0, fast_path="off")
    assert Server(off, hooks=Operations(off)).fast is None



async def test_metrics_count_what_the_thread_relayed(start_router: Start) -> None:
    """The operations layer folds the thread's counters in before it reads them: a scrape
    right after the traffic counts every frame (nothing here calls hub.sync)."""
    router = await start_router(fast_path="on", metrics="127.0.0.1:0")
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    # The first goes to Python, which teaches the thread its route; the other 49 follow.
    await a.send(wire.Route("g", b"B", b"A", b"0"))
    assert await b.recv() == wire.Route("g", b"B", b"A", b"0")
    for i in range(1, 50):
        await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
    for i in range(1, 50):
        assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
    samples = await scrape(router)
    assert v(samples, "gossiprouter_frames_in_total", type="route") == 50
    assert v(samples, "gossiprouter_frames_out_total", type="route") == 50
    assert v(samples, "gossiprouter_fast_path_relayed_frames_total") >= 49


async def test_the_start_up_line_says_whether_it_is_on(
        start_router: Start, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level("INFO", logger="gossiprouter")
    await start_router(fast_path="on")
    await start_router(fast_path="on", fast_path_threads=0, fast_path_sched="normal")
    monkeypatch.setenv(fastpath.ENV, "off")
    await start_router()
    lines = [r.getMessage() for r in caplog.records if "listening on" in r.getMessage()]
    assert lines[0].endswith(
        "fast path: on (compiled relay thread, and up to 16 for busy connections; scheduled "
        "batch)"), lines
    assert lines[1].endswith("fast path: on (compiled relay thread; scheduled normal)"), lines
    assert lines[2].endswith("fast path: off (GOSSIPROUTER_FAST_PATH=off)"), lines



async def test_the_shutdown_line_is_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    """The line at shutdown breaks the routed frames down (thread / Python), not "relayed 0
    of 16" that reads like an error after a small demo."""
    caplog.set_level("INFO", logger="gossiprouter")
    cfg = Config(host="127.0.0.1", port=0, fast_path="on")
    router = Server(cfg, hooks=Operations(cfg))
    async with trio.open_nursery() as nursery:
        await nursery.start(router.serve)
        a, b = await learned_pair(router)
        for i in range(5):
            await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
            assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
        router.hub.sync()
        c = router.hub.counters
        routed, relayed = c.routed, c.fast_relayed
        await a.aclose()
        await b.aclose()
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if "fast path summary" in r.getMessage()]
    assert lines == [
        f"fast path summary: {routed} routed frames, {relayed} relayed by the relay thread "
        f"and {routed - relayed} handled in Python ({fast_of(router).learned} routes learned, "
        f"{fast_of(router).upcalls} upcalls)"], lines
    assert routed >= 5 and relayed >= 4
