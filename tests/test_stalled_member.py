"""A stalled JGroups 5.x member keeps what it is owed (issue 31, acceptance 3).

Three raw 5.x members over real sockets: A and B multicast numbered 1 KB messages and read
everything, S stops reading (a small receive buffer, its socket never read) for longer than
``write_timeout``, then reads again. S gets every frame that fitted in its queue's byte bound
(``outbound_queue_bytes``): all of them when they fit, else what came before its queue filled
and then the newest, the oldest queued ones dropped and counted (``drops`` and
``dropped_bytes``, reason ``slow_consumer``). Nothing is dropped because time passed
(``write_timeouts`` counts the stall, ``drops{reason="write_timeout"}`` stays 0), and A and B
get every frame. Everything waits on counts the router or the members report, never on time;
the suite's two passes run it with the compiled fast path and without.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable, Callable

import trio

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.jgroups_address import V2, V5
from gossiprouter.server.listener import Server
from gossiprouter.sessions.base import Session
from gossiprouter.sessions.jgroups5 import JGroups5Session
from gossiprouter.sessions.outbox import SHED_SLACK, Outbox, Reply
from tests.conftest import RouterFactory
from tests.jgroups_clients import J2Client, J5Client, ip, uuid

GROUP = "stall"
TABLE_GROUP = "jgroups5:" + GROUP
A5, B5, S5 = uuid(1, V5), uuid(2, V5), uuid(3, V5)
SENDERS = (A5, B5)
PAYLOAD = 1000
MAX_FRAME = 64 * 1024
# Pairs of messages (one from A, one from B) sent at most while waiting for the router to report
# something: far more than kernel buffers and the queues below take.
MAX_PAIRS = 20_000
# Pairs sent after the write timeout was seen: they queue behind the rest.
AFTER = 20
Tally = dict[int, list[int]]  # sender index -> sequence numbers received, in order


def _frame(who: int, seq: int) -> bytes:
    body = struct.pack(">BI", who, seq).ljust(PAYLOAD, b".")
    return j5.message(GROUP, None, SENDERS[who], body)


FRAME_LEN = len(_frame(0, 0))


def _record(tally: Tally, ev: j5.Event) -> None:
    assert isinstance(ev, j5.Message), ev
    who, seq = struct.unpack_from(">BI", ev.payload)
    tally.setdefault(who, []).append(seq)


async def _healthy(c: J5Client, tally: Tally) -> None:
    """Read every message, until cancelled."""
    while True:
        _record(tally, await c.recv(timeout=60))


class Stall:
    """The three members on ``router``; S's socket reads nothing until :meth:`resume`."""

    def __init__(self, router: Server, a: J5Client, b: J5Client, s: socket.socket) -> None:
        self.router = router
        self.members = (a, b)
        self.s = s
        self.sent = 0  # pairs
        self.got: tuple[Tally, Tally] = ({}, {})
        self.queued: list[bytes] = []
        self.drops_before = 0

    @classmethod
    async def open(cls, router: Server) -> Stall:
        assert router.address is not None
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(router.address)
        s.sendall(j5.register(GROUP, S5, "S", ip(7803, V5)))
        s.setblocking(False)
        members = []
        for i, addr in enumerate(SENDERS):
            c = await J5Client.open(*router.address)
            await c.register(GROUP, addr, "AB"[i], ip(7801 + i, V5))
            await c.sync()
            members.append(c)
        with trio.fail_after(10):
            while router.hub.table.entry(TABLE_GROUP, S5.key) is None:
                await trio.sleep(0.01)
        return cls(router, members[0], members[1], s)

    def session(self) -> Session:
        (found,) = [c.session for c in self.router.connections if c.session is not None
                    and self.router.hub.table.holds(c.session, TABLE_GROUP, S5.key)]
        return found

    async def send_pair(self) -> None:
        for who, c in enumerate(self.members):
            await c.send_raw(_frame(who, self.sent))
        self.sent += 1

    async def send_until(self, reached: Callable[[], bool], pace: float = 0.0) -> None:
        """Send pairs until ``reached()`` (at most MAX_PAIRS more)."""
        with trio.fail_after(60):
            for _ in range(MAX_PAIRS):
                if reached():
                    return
                await self.send_pair()
                await trio.sleep(pace)
        raise AssertionError(f"not reached after {self.sent} pairs")

    async def resume(self) -> Tally:
        """S reads again: everything the router has for it, up to the echo of its HEARTBEAT
        (queued behind the rest)."""
        ts = trio.socket.from_stdlib_socket(self.s)
        await ts.send(j5.heartbeat())
        dec = j5.Decoder(max_frame=MAX_FRAME)
        tally: Tally = {}
        with trio.fail_after(30):
            while True:
                ev = dec.next_event()
                if ev is None:
                    data = await ts.recv(1 << 20)
                    assert data, "the router closed the stalled member"
                    dec.feed(data)
                elif isinstance(ev, j5.Heartbeat):
                    return tally
                else:
                    _record(tally, ev)

    def healthy_done(self) -> bool:
        """A and B got as many messages as were sent (a multicast includes its sender)."""
        return all(len(got.get(who, ())) >= self.sent for got in self.got for who in (0, 1))


async def _scenario(router: Server, fill: Callable[[Stall], Awaitable[None]]) -> tuple[
        Stall, Tally]:
    """Stall S; ``fill`` sends until the state under test, then the write timeout is waited
    for (counted by the router) and AFTER more pairs are sent. Once A and B got every message
    (so the router routed them all, S's copies included), S resumes: what it got, and in
    ``Stall.queued`` / ``Stall.drops_before``, what its queue held and the drops until then."""
    st = await Stall.open(router)
    counters = router.hub.counters
    async with trio.open_nursery() as n:
        for c, got in zip(st.members, st.got, strict=True):
            n.start_soon(_healthy, c, got)
        await fill(st)
        with trio.fail_after(15):
            while counters.write_timeouts == 0:
                await trio.sleep(0.02)
        for _ in range(AFTER):
            await st.send_pair()
        with trio.fail_after(30):
            while not st.healthy_done():
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    for got in st.got:  # every message, in order, none twice
        assert got == {0: list(range(st.sent)), 1: list(range(st.sent))}
    st.queued = list(st.session().outbox.chunks)
    st.drops_before = counters.drops.get("slow_consumer", 0)
    tally = await st.resume()
    st.s.close()
    return st, tally


async def test_a_stalled_member_gets_everything_that_fits(start_router: RouterFactory) -> None:
    """The queue stays under its byte bound: S, resuming after the write timeout, gets every
    message, in order; nothing is dropped (the write timeout used to discard the queue)."""
    router = await start_router(write_timeout=0.5, max_frame=MAX_FRAME,
                                outbound_queue_bytes=1 << 20)
    counters = router.hub.counters

    async def fill(st: Stall) -> None:
        # Until a quarter of the bound is queued for S (behind its full socket buffers).
        await st.send_until(lambda: st.session().outbox.nbytes >= 256 * 1024)

    st, got = await _scenario(router, fill)
    assert got == {0: list(range(st.sent)), 1: list(range(st.sent))}
    assert counters.write_timeouts >= 1
    assert counters.drops.get("write_timeout", 0) == 0
    assert counters.drops.get("slow_consumer", 0) == 0
    assert counters.slow_consumer_disconnects == 0
    assert router.hub.table.entry(TABLE_GROUP, S5.key) is not None


async def test_over_the_byte_bound_the_oldest_are_dropped(start_router: RouterFactory) -> None:
    """The queue overflows: S gets what came before its queue filled, then the newest (at least
    the bound's worth, less a frame); the gap between, per sender, is the oldest queued frames,
    each counted in drops and dropped_bytes. Nothing else is missing, nothing dropped by time."""
    bound = 128 * 1024
    router = await start_router(write_timeout=0.5, max_frame=MAX_FRAME, outbound_queue_bytes=bound)
    counters = router.hub.counters

    async def fill(st: Stall) -> None:
        await st.send_until(lambda: counters.drops.get("slow_consumer", 0) > 0)
        # Over the bound until the write timeout: paced, the queue stays full.
        await st.send_until(lambda: counters.write_timeouts > 0, pace=0.005)

    st, got = await _scenario(router, fill)
    gap = suffix = 0
    for who in (0, 1):
        seqs = got[who]
        # Per sender: a prefix 0..p-1 (what left before the queue filled), a gap (the oldest
        # queued, dropped: the queue interleaves both senders, so each has one), then every
        # message up to the last one sent.
        p = next(i for i, q in enumerate(seqs) if q != i)
        assert seqs[p:] == list(range(seqs[p], st.sent)), (who, p)
        gap += st.sent - len(seqs)
        suffix += len(seqs) - p
    assert gap == counters.drops["slow_consumer"] > 0
    assert counters.dropped_bytes["slow_consumer"] == gap * FRAME_LEN
    # The newest messages S got are what its queue held when it resumed: the bound's worth,
    # less what a chunk (a run of frames read together) leaves unused.
    displaced = counters.drops["slow_consumer"] - st.drops_before  # by S's HEARTBEAT's echo
    assert suffix == sum(map(JGroups5Session.frames_in, st.queued)) - displaced
    assert sum(map(len, st.queued)) > bound // 2
    assert counters.write_timeouts >= 1
    assert counters.drops.get("write_timeout", 0) == 0
    assert counters.slow_consumer_disconnects == 0
    assert router.hub.table.entry(TABLE_GROUP, S5.key) is not None


async def test_a_stalled_2_12_member_never_loses_a_reply(start_router: RouterFactory) -> None:
    """A 2.12 client tells a reply (here GOSSIP_GET's) from other objects only by its place in
    the stream: when the oldest frames make room, a reply queued among them stays, and the
    member that reads again decodes a whole stream (the reply where it asked for it)."""
    bound = 128 * 1024
    router = await start_router(max_frame=MAX_FRAME, outbound_queue_bytes=bound)
    counters = router.hub.counters
    assert router.address is not None
    s2, a2 = uuid(3, V2), uuid(1, V2)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(router.address)
    s.sendall(j2.connect(GROUP, s2, "S", None))
    s.setblocking(False)
    a = await J2Client.open(*router.address)
    assert (await a.connect(GROUP, a2, "A")).ok
    table = router.hub.table
    with trio.fail_after(10):
        while table.entry("jgroups2:" + GROUP, s2.key) is None:
            await trio.sleep(0.01)
    (session,) = [c.session for c in router.connections if c.session is not None
                  and table.holds(c.session, "jgroups2:" + GROUP, s2.key)]
    ob = session.outbox

    async def send_until(reached: Callable[[], bool]) -> None:
        with trio.fail_after(60):
            for i in range(MAX_PAIRS):
                if reached():
                    return
                await a.message(GROUP, s2, struct.pack(">I", i).ljust(PAYLOAD, b"."))
                await trio.sleep(0)
        raise AssertionError("not reached")

    def reply_at() -> int | None:  # the only queued object that is not a MESSAGE
        first = 1 if ob.unfinished else 0
        return next((i for i, c in enumerate(ob.chunks) if i >= first and c[0] != j2.MESSAGE),
                    None)

    # Queued behind S's full socket (more than a dispatcher round holds for a batched send).
    await send_until(lambda: ob.nbytes > bound // 2)
    s.send(j2.gossip_get(GROUP))
    with trio.fail_after(10):
        while (before := reply_at()) is None:
            await trio.sleep(0.01)
    # Until more chunks (2.12: counted as frames) were dropped than were queued before the
    # reply once it was (what S's socket had not taken is still being routed meanwhile).
    dropped = counters.drops.get("slow_consumer", 0)
    await send_until(lambda: counters.drops.get("slow_consumer", 0) > dropped + before + 20)
    at = reply_at()
    assert at is not None and at <= 1  # only the rest of a started frame may precede it
    end = j2.message_to_client(s2, b"END")
    await a.message(GROUP, s2, b"END")
    with trio.fail_after(10):
        while not (ob.chunks and ob.chunks[-1].endswith(end)):
            await trio.sleep(0.01)
    queued = list(ob.chunks)
    ts = trio.socket.from_stdlib_socket(s)
    stream = bytearray()
    with trio.fail_after(30):
        while not stream.endswith(end):
            data = await ts.recv(1 << 20)
            assert data, "the router closed the stalled member"
            stream += data
    s.close()
    # The reply starts where the queue's chunks before it end, counted from the stream's end.
    start = len(stream) - sum(map(len, queued)) + sum(map(len, queued[:at]))
    dec = j2.ClientDecoder(max_frame=MAX_FRAME)
    dec.expect_connect_reply()
    dec.feed(bytes(stream[:start]))
    dec.expect_members_reply()
    dec.feed(bytes(stream[start:]))
    events = list(iter(dec.next_event, None))
    assert events[0] == j2.ConnectReply(j2.CONNECT_OK)
    replies = [ev for ev in events if isinstance(ev, j2.MembersReply)]
    assert len(replies) == 1 and {m.name for m in replies[0].members} == {"A", "S"}
    assert all(isinstance(ev, j2.Message) for ev in events[1:] if ev not in replies)
    assert isinstance(events[-1], j2.Message) and events[-1].payload == b"END"
    assert counters.slow_consumer_disconnects == 0


# ---------------------------------------------------------------- the queue's rule, sans I/O


def test_shed_drops_the_oldest_whole_chunks_and_keeps_replies() -> None:
    """Outbox.shed drops the oldest chunks, only as many as make room, never the rest of a
    frame started on the wire (an unfinished first chunk) nor a 2.12 Reply; it drops nothing
    when the new chunk cannot fit at all."""
    ob = Outbox(100, 5, "drop")
    for chunk in (b"t" * 10, Reply(b"r" * 20), b"a" * 30, b"b" * 30):
        assert ob.push(chunk)
    ob.unfinished = True  # the first chunk's start is on the wire
    assert not ob.push(b"c" * 30)  # 120 bytes > 100
    assert ob.shed(30) == [b"a" * 30]
    assert ob.chunks == [b"t" * 10, b"r" * 20, b"b" * 30] and ob.nbytes == 60
    assert ob.push(b"c" * 30)
    assert ob.shed(71) is None  # 10 + 20 kept: 71 more can never fit
    assert ob.nbytes == 90 and len(ob.chunks) == 4
    # The frame bound: five chunks at most, the oldest droppable one goes.
    assert ob.push(b"d")
    assert not ob.push(b"e")
    assert ob.shed(1) == [b"b" * 30]
    assert ob.push(b"e")
    assert ob.chunks == [b"t" * 10, b"r" * 20, b"c" * 30, b"d", b"e"]
    # A 1/SHED_SLACK of the bound more at once, so a full queue is not moved per push.
    big = Outbox(100 * SHED_SLACK, 1000, "drop")
    for i in range(SHED_SLACK):
        assert big.push(bytes([i]) * 100)
    assert not big.push(b"n" * 100)
    assert big.shed(100) == [bytes([0]) * 100, bytes([1]) * 100]


def test_5x_drops_are_counted_in_frames() -> None:
    """A queued 5.x chunk may be a run of frames: each counts as one dropped frame."""
    run = _frame(0, 1) + _frame(0, 2) + _frame(0, 3)
    assert JGroups5Session.frames_in(run) == 3
    assert JGroups5Session.frames_in(_frame(1, 7)) == 1
