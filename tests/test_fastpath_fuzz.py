"""Differential fuzz of the compiled fast path (server/relay/) against the pure-Python
path: the same seeded sender stream, cut at random read boundaries, played against a router
with ``fast_path="on"`` and one with ``fast_path="off"``; every receiver must get the same
bytes and the sender the same replies (or the same close).

The streams (native, JGroups 5.x, JGroups 2.12) mix frames of learned routes (the thread
relays them), control frames, frames whose header bytes are mutated (a route the thread has
not learned: Python's), the same header with another payload encoding (native), frames shorter
than a learned header, payloads larger than one read and than the thread's hold bound,
oversized messages (JGroups: skipped as they stream past), membership changes in the middle
and, for some seeds, a last frame the router refuses (an oversized, inconsistent or negative
length), after which it closes the sender. Writes end mostly at frame boundaries, as clients
write (a read that ends inside a frame hands the connection's next chunk to Python whole), and
inside a frame one time in five.

Bounded: 16 cases of about 300 frames each, about 5 s in all.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Awaitable, Callable

import pytest
import trio

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.jgroups_clients import ROUND_TRIP_GROUP, J2Client, J5Client, uuid
from tests.nclient import NativeClient

Start = Callable[..., Awaitable[Server]]

# What ends a sender's stream: nothing (it is answered PONG), or a frame the router refuses.
TERMINALS = ("none", "oversized", "trailing_byte", "short_length", "garbage")


def _mutate_header(rng: random.Random, frame: bytes) -> bytes:
    """The same frame with one byte of its group or sender string changed (same lengths):
    a header the thread has not learned, which Python answers ``not_member``."""
    # Body: fixarray(5), type, group (fixstr), dest, sender, payload. Mutate the group's or
    # the sender's characters, never a length byte, so the frame stays well formed.
    body = bytearray(frame[4:])
    assert body[0] == 0x95
    glen = body[2] & 0x1F
    group = list(range(3, 3 + glen))
    pos = 3 + glen
    if body[pos] == 0xC0:  # dest nil
        pos += 1
    else:  # bin8 dest
        pos += 2 + body[pos + 1]
    slen = body[pos + 1]
    i = rng.choice(group + list(range(pos + 2, pos + 2 + slen)))
    if i in group:  # still UTF-8 (a group name that is not is a protocol error)
        body[i] = rng.choice([c for c in b"ghxyz" if c != body[i]])
    else:
        body[i] = (body[i] + 1 + rng.randrange(255)) % 256
    return frame[:4] + bytes(body)


def _rebin32(frame: bytes) -> bytes:
    """The same ROUTE with its payload as a bin32 (a valid, non-minimal encoding): the same
    header, another payload shape."""
    d = wire.Decoder()
    d.feed(frame)
    r = d.next_frame()
    assert isinstance(r, wire.Route)
    head = wire.encode(wire.Route(r.group, r.dest, r.sender, b""))[4:-2]  # without bin8 b""
    body = head + b"\xc6" + struct.pack(">I", len(r.payload)) + r.payload
    return struct.pack(">I", len(body)) + body


def _payload(rng: random.Random) -> bytes:
    n = rng.choice((0, 1, 5, 200, 3000, 3000, 70_000, 300_000) if rng.random() < 0.05
                   else (0, 1, 5, 200, 3000))
    return rng.randbytes(n)


def _native_script(rng: random.Random, terminal: str) -> list[bytes]:
    frames: list[bytes] = []
    joined = True
    for i in range(300):
        k = rng.randrange(20)
        if k < 5:
            f = wire.encode(wire.Route("g", b"B", b"A", _payload(rng)))
        elif k < 8:
            f = wire.encode(wire.Route("g", b"C", b"A2" if joined else b"A", _payload(rng)))
        elif k < 12:
            f = wire.encode(wire.Route("g", None, rng.choice((b"A", b"A2")), _payload(rng)))
        elif k < 13:
            f = wire.encode(wire.Ping(i))
        elif k < 14:
            f = wire.encode(wire.Route("h", None, b"A", _payload(rng)))  # not a member
        elif k < 16:
            f = _mutate_header(rng, wire.encode(wire.Route(
                "g", rng.choice((b"B", None)), b"A", _payload(rng))))
        elif k < 18:
            f = _rebin32(wire.encode(wire.Route("g", rng.choice((b"B", b"C", None)), b"A",
                                                _payload(rng))))
        else:  # A2 leaves, or joins again
            f = wire.encode(wire.Disconnect(10_000 + i, "g", b"A2") if joined
                            else wire.Connect(20_000 + i, "g", b"A2", None, ()))
            joined = not joined
        frames.append(f)
    learned = wire.encode(wire.Route("g", b"B", b"A", b"last"))
    if terminal == "oversized":
        frames.append(b"\x7f\xff\xff\xff" + learned[4:])
    elif terminal == "trailing_byte":  # a learned header, one byte after the payload
        frames.append(struct.pack(">I", len(learned) - 3) + learned[4:] + b"\x00")
    elif terminal == "short_length":  # the length ends inside the learned header
        frames.append(struct.pack(">I", 3) + learned[4:7])
    elif terminal == "garbage":
        frames.append(struct.pack(">I", 6) + b"\xc1\xc1\xc1\xc1\xc1\xc1")
    return frames


def _frames(data: bytes) -> list[object]:
    """``data`` decoded (for a failure's message)."""
    d = wire.Decoder(max_frame=1 << 30)
    d.feed(data)
    out: list[object] = []
    while (f := d.next_frame()) is not None:
        out.append(f)
    return out


def _writes(rng: random.Random, frames: list[bytes]) -> list[tuple[int, int]]:
    """Where the sender's writes start and end: mostly at frame boundaries (a client writes
    whole frames; the thread relays what follows a boundary), with a random cut in one frame
    out of five (a read that ends inside a frame, in its length, header or payload)."""
    cuts = [0]
    start = 0
    for f in frames:
        if len(f) > 1 and rng.random() < 0.2:
            cuts.append(start + rng.randrange(1, len(f)))
        start += len(f)
        if rng.random() < 0.6:  # otherwise written with the next frame
            cuts.append(start)
    if cuts[-1] != start:
        cuts.append(start)
    return list(itertools.pairwise(cuts))


async def _drain(stream: trio.abc.Stream, out: bytearray, done: trio.Event) -> None:
    """Everything ``stream`` receives, until EOF or a reset (concurrently with the sender, so
    that a receiver is never a slow consumer because the test did not read it)."""
    try:
        while data := await stream.receive_some(1 << 20):
            out += data
    except trio.BrokenResourceError:
        pass
    except trio.ClosedResourceError:
        return
    done.set()


async def _play(router: Server, rng: random.Random, frames: list[bytes],
                clients: dict[str, J2Client | J5Client | NativeClient],
                sync: Callable[[str, bytearray], Awaitable[bytes]],
                terminal: str) -> dict[str, bytes]:
    """Write ``frames`` from the first of ``clients`` (the sender), cut by :func:`_writes`,
    while every client's stream is drained; then ``sync`` each client that is still open
    (``sync(name, received)``: what came before its round trip's reply). What each client
    received; for a sender the router closed (``terminal`` is not "none"), everything."""
    sender = next(iter(clients))
    stream = b"".join(frames)
    got = {name: bytearray() for name in clients}
    ends = {name: trio.Event() for name in clients}
    out: dict[str, bytes] = {}
    async with trio.open_nursery() as nursery:
        for name, cl in clients.items():
            nursery.start_soon(_drain, cl.stream, got[name], ends[name])
        try:
            for lo, hi in _writes(rng, frames):
                await clients[sender].send_raw(stream[lo:hi])
                if rng.random() < 0.3:
                    await trio.sleep(0.001)  # a separate read, often
            if terminal == "none":
                out[sender] = await sync(sender, got[sender])
        except trio.BrokenResourceError:
            assert terminal != "none", bytes(got[sender][-200:])
        if terminal != "none":
            with trio.fail_after(10):
                await ends[sender].wait()  # the router closed the sender's connection
                # ... and forgot it (the leave notices the others may get are queued now).
                while len(router.connections) > len(clients) - 1:
                    await trio.sleep(0.001)
        for name in clients:
            if name != sender:
                out[name] = await sync(name, got[name])
        nursery.cancel_scope.cancel()
    for cl in clients.values():
        await cl.stream.aclose()
    out.setdefault(sender, bytes(got[sender]))  # closed by the router: everything it sent
    return out


async def _same_as_the_pure_python_path(
        start_router: Start, play: Callable[[Server], Awaitable[dict[str, bytes]]],
        **options: object) -> Server:
    """``play`` against a router with the fast path on and one with it off: every client
    received the same bytes from both, and the thread relayed some of them (Python the rest).
    The router with the fast path on."""
    fast = await start_router(fast_path="on", **options)
    slow = await start_router(fast_path="off", **options)
    assert fast.fast is not None and slow.fast is None
    want = await play(slow)
    got = await play(fast)
    fast.fast.collect()
    assert fast.hub.counters.fast_relayed > 0  # the thread relayed some of it, Python the rest
    for name in want:
        assert len(got[name]) == len(want[name]), name
        assert got[name] == want[name], name
    return fast


async def _jgroups_clients(router: Server, cls: type[J2Client] | type[J5Client]
                           ) -> dict[str, J2Client | J5Client | NativeClient]:
    """X (members x1 and x4, the sender), Y and Z in "cluster", registered."""
    assert router.address is not None
    x, y, z = [await cls.open(*router.address) for _ in range(3)]
    await x.join("cluster", uuid(1, cls.version), "x1")
    await x.join("cluster", uuid(4, cls.version), "x4")
    await y.join("cluster", uuid(2, cls.version), "y")
    await z.join("cluster", uuid(3, cls.version), "z")
    for cl in (x, y, z):
        await cl.settle()
    return {"X": x, "Y": y, "Z": z}


def _split(data: bytes) -> list[bytes]:
    """``data`` cut into whole native frames, as received (the bytes of each)."""
    out = []
    pos = 0
    while pos + 4 <= len(data):
        end = pos + 4 + struct.unpack_from(">I", data, pos)[0]
        if end > len(data):
            break
        out.append(data[pos:end])
        pos = end
    return out


def _timing_free(data: bytes, pong: bytes) -> bytes | None:
    """``data`` without the SUSPECT events (the router sends them when the sender's close is
    handled, which races with a PING from another client) and up to ``pong`` (excluded);
    None before ``pong`` arrived."""
    frames = _split(data)
    if pong not in frames:
        return None
    keep = []
    for f in frames[: frames.index(pong)]:
        ev = _frames(f)[0]
        if not (isinstance(ev, wire.Event) and ev.kind == "suspect"):
            keep.append(f)
    return b"".join(keep)


async def _sync(cl: NativeClient, got: bytearray, nonce: int) -> bytes:
    """PING the router from ``cl``; when its PONG came back (everything routed to ``cl``
    before is in ``got``), what came before it (:func:`_timing_free`)."""
    pong = wire.encode(wire.Pong(nonce))
    await cl.send(wire.Ping(nonce))
    with trio.move_on_after(10):
        while (before := _timing_free(bytes(got), pong)) is None:
            await trio.sleep(0.002)
    assert before is not None, _frames(bytes(got))[-5:]
    return before


async def play_native(router: Server, seed: int, terminal: str) -> dict[str, bytes]:
    """Play the seeded native stream against ``router``; what each client received."""
    rng = random.Random(seed)
    a, b, c = await NativeClient.joined(router, "g", (b"A", b"A2"), b"B", b"C")
    clients = {"A": a, "B": b, "C": c}

    async def sync(name: str, got: bytearray) -> bytes:
        return await _sync(clients[name], got, 999_999 if name == "A" else 1)

    return await _play(router, rng, _native_script(rng, terminal), dict(clients), sync, terminal)


@pytest.mark.parametrize(("seed", "terminal"), list(enumerate(TERMINALS * 2)))
async def test_native_streams_match_the_pure_python_path(start_router: Start, seed: int,
                                                          terminal: str) -> None:
    fast = await _same_as_the_pure_python_path(
        start_router, lambda router: play_native(router, seed, terminal))
    assert fast.fast is not None and fast.fast.upcalls > 0


# --------------------------------------------------------------------------- JGroups 5.x

J5_ECHO = j5.heartbeat()  # what the router echoes


def _j5_event(frame: bytes) -> object:
    d = j5.Decoder(max_frame=1 << 30)
    d.feed(frame)
    return d.next_event()


def _j5_script(rng: random.Random, terminal: str) -> list[bytes]:
    x1, x4, y, z = uuid(1, 5), uuid(4, 5), uuid(2, 5), uuid(3, 5)
    frames: list[bytes] = []
    joined = True
    for _ in range(300):
        k = rng.randrange(20)
        if k < 5:
            f = j5.message("cluster", y, x1, _payload(rng))
        elif k < 8:
            f = j5.message("cluster", z, x4 if joined else x1, _payload(rng))
        elif k < 12:
            f = j5.message("cluster", None, rng.choice((x1, x4)), _payload(rng))
        elif k < 13:
            f = j5.heartbeat()
        elif k < 14:
            f = j5.message("other", None, x1, _payload(rng))  # not a member
        elif k < 16:  # a header byte changed (not the type, not the payload's length)
            payload = _payload(rng)
            m = bytearray(j5.message("cluster", rng.choice((y, None)), x1, payload))
            i = rng.randrange(5, len(m) - len(payload) - 4)
            m[i] = (m[i] + 1 + rng.randrange(255)) % 256
            f = bytes(m)
        elif k < 17:  # a whole frame shorter than the learned header
            f = struct.pack(">I", 3) + j5.message("cluster", y, x1, b"")[4:7]
        elif k < 18:  # larger than jgroups_max_frame: skipped as it streams past
            f = j5.message("cluster", y, x1, rng.randbytes(J5_MAX + 1))
        else:  # x4 leaves, or registers again
            f = j5.unregister("cluster", x4) if joined else j5.register("cluster", x4, "x4", None)
            joined = not joined
        frames.append(f)
    if terminal == "negative":
        frames.append(b"\xff\xff\xff\xf0" + j5.message("cluster", y, x1, b"last")[4:])
    return frames


J5_MAX = 100_000


def _j5_timing_free(data: bytes, echoes: int) -> bytes | None:
    """Like :func:`_timing_free`, for 5.x: up to the ``echoes``-th HEARTBEAT echo (the
    client's last heartbeat), SUSPECTs left out; None before it arrived."""
    frames = _split(data)
    seen = 0
    for i, f in enumerate(frames):
        seen += f == J5_ECHO
        if seen == echoes:
            return b"".join(g for g in frames[:i]
                            if not isinstance(_j5_event(g), j5.Suspect))
    return None


async def _j5_sync(cl: J5Client, got: bytearray, echoes: int = 1) -> bytes:
    """HEARTBEAT from ``cl``, the ``echoes``-th it sent since ``got`` started; what came
    before its echo."""
    await cl.send_raw(j5.heartbeat())
    with trio.move_on_after(10):
        while (before := _j5_timing_free(bytes(got), echoes)) is None:
            await trio.sleep(0.002)
    assert before is not None, [_j5_event(f) for f in _split(bytes(got))][-5:]
    return before


async def play_j5(router: Server, seed: int, terminal: str) -> dict[str, bytes]:
    rng = random.Random(seed)
    clients = await _jgroups_clients(router, J5Client)
    frames = _j5_script(rng, terminal)
    echoes = 1 + frames.count(J5_ECHO)  # the sender's round trip echoes its last heartbeat

    async def sync(name: str, got: bytearray) -> bytes:
        cl = clients[name]
        assert isinstance(cl, J5Client)
        return await _j5_sync(cl, got, echoes if name == "X" else 1)

    return await _play(router, rng, frames, clients, sync, terminal)


@pytest.mark.parametrize(("seed", "terminal"), list(enumerate(("none", "negative") * 2)))
async def test_jgroups5_streams_match_the_pure_python_path(start_router: Start, seed: int,
                                                            terminal: str) -> None:
    await _same_as_the_pure_python_path(
        start_router, lambda router: play_j5(router, seed, terminal), jgroups_max_frame=J5_MAX)


# --------------------------------------------------------------------------- JGroups 2.12

J2_ECHO = j2.gossip_get_reply([])  # the reply to a round trip's GOSSIP_GET (nobody there)


def _j2_mutate(rng: random.Random, frame: bytes) -> bytes:
    """``frame`` (a MESSAGE to "cluster") with its group's last letter or its destination's
    last byte changed: a header the thread has not learned (not a member; nobody)."""
    m = bytearray(frame)
    low = struct.pack(">Q", 0x1112131415161700 + 2)  # uuid(2, 2)'s low bits, if it is there
    at = m.find(low)
    i = m.index(b"cluster") + 6 if at < 0 or rng.random() < 0.5 else at + 7
    m[i] = (m[i] + 1 + rng.randrange(20)) % 128 or 1  # still ASCII (a valid group name)
    return bytes(m)


def _j2_script(rng: random.Random) -> list[bytes]:
    x4, y, z = uuid(4, 2), uuid(2, 2), uuid(3, 2)
    frames: list[bytes] = []
    joined = True
    for _ in range(300):
        k = rng.randrange(20)
        if k < 5:
            f = j2.message("cluster", y, _payload(rng))
        elif k < 8:
            f = j2.message("cluster", z, _payload(rng))
        elif k < 12:
            f = j2.message("cluster", None, _payload(rng))
        elif k < 13:
            f = j2.ping()
        elif k < 14:
            f = j2.message("other", None, _payload(rng))  # not a member
        elif k < 16:
            f = _j2_mutate(rng, j2.message("cluster", rng.choice((y, None)), _payload(rng)))
        elif k < 17:  # larger than jgroups_max_frame: skipped as it streams past
            f = j2.message("cluster", y, rng.randbytes(J5_MAX + 1))
        elif k < 18:  # an empty buffer: Python's, not the thread's
            f = j2.message("cluster", y, b"")
        else:  # x4 leaves, or connects again
            f = j2.disconnect("cluster", x4) if joined else j2.connect("cluster", x4, "x4", None)
            joined = not joined
        frames.append(f)
    return frames


async def _j2_sync(cl: J2Client, got: bytearray) -> bytes:
    """A round trip from ``cl``; what it received before the reply."""
    await cl.send_raw(j2.gossip_get(ROUND_TRIP_GROUP))
    with trio.move_on_after(10):
        while not got.endswith(J2_ECHO):
            await trio.sleep(0.002)
    assert got.endswith(J2_ECHO), bytes(got[-200:])
    return bytes(got[: -len(J2_ECHO)])


async def play_j2(router: Server, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    clients = await _jgroups_clients(router, J2Client)

    async def sync(name: str, got: bytearray) -> bytes:
        cl = clients[name]
        assert isinstance(cl, J2Client)
        return await _j2_sync(cl, got)

    # Nothing the router refuses: every client is synced, the sender first.
    return await _play(router, rng, _j2_script(rng), clients, sync, "none")


@pytest.mark.parametrize("seed", [0, 1])
async def test_jgroups2_streams_match_the_pure_python_path(start_router: Start, seed: int
                                                           ) -> None:
    await _same_as_the_pure_python_path(
        start_router, lambda router: play_j2(router, seed), jgroups_max_frame=J5_MAX)
