"""Raw JGroups GossipRouter test clients (2.12 and 5.x) over real sockets, built on the codecs.

They do what a RouterStub does on the wire and nothing more (no reconnects, no keep-alive
tasks), so tests drive the protocol by hand and see every byte the router sends. Their encoders
are the codecs', which the codec tests check against the capture bytes; ``tests/
test_jgroups_router.py`` also replays the captures themselves through the router.

Also here: addresses for tests; :func:`replay`, which plays the client side of a capture log
(``tests/data/jgroups_captures``) against a router and returns what each connection received;
and clients of an in-process router, connected (:func:`j2_client`, :func:`j5_client`) or
members of a group (:func:`j2_member`, :func:`j5_member`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, Self, TypeVar

import trio
import trio.testing

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress

if TYPE_CHECKING:
    from gossiprouter.server.listener import Server

BIG = 64 * 1024 * 1024
# The group a round trip asks about: no test registers in it, so its reply is empty.
ROUND_TRIP_GROUP = "-round-trip-"
CAPTURES = Path(__file__).parent / "data" / "jgroups_captures"


def uuid(i: int, version: int) -> JAddress:
    """A plain UUID address, distinct for each ``i``."""
    return JAddress.from_uuid(0x0102030405060700 + i, 0x1112131415161700 + i, version=version)


def ip(port: int, version: int, host: str = "127.0.0.1") -> JAddress:
    return JAddress.from_ip(host, port, version=version)


# Three members' addresses of each protocol version, for tests.
A2, B2, C2 = uuid(1, V2), uuid(2, V2), uuid(3, V2)
A5, B5, C5 = uuid(1, V5), uuid(2, V5), uuid(3, V5)


E = TypeVar("E")
E_co = TypeVar("E_co", covariant=True)


class _Decoder(Protocol[E_co]):
    def feed(self, data: bytes) -> None: ...

    def next_event(self) -> E_co | None: ...


class _Client(Generic[E]):
    """What both clients do: read the router's events through their protocol's decoder; join
    a group and settle (a round trip), each in its protocol's words."""

    version: ClassVar[int]  # of the addresses the protocol carries (V2, V5)

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = self._decoder()
        self.eof = False

    @classmethod
    async def open(cls, host: str, port: int) -> Self:
        return cls(await trio.open_tcp_stream(host, port))

    def _decoder(self) -> _Decoder[E]:
        raise NotImplementedError

    async def join(self, group: str, addr: JAddress, name: str) -> None:
        """Register ``addr``, logically named ``name``, in ``group`` (2.12: CONNECT and its
        reply; 5.x: REGISTER)."""
        raise NotImplementedError

    async def settle(self) -> None:
        """A round trip: everything sent before it has been handled by the router."""
        raise NotImplementedError

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self, timeout: float) -> None:
        with trio.fail_after(timeout):
            data = await self.stream.receive_some(1 << 20)
        if not data:
            self.eof = True
            raise EOFError("router closed the connection")
        self.decoder.feed(data)

    async def recv(self, timeout: float = 5.0) -> E:
        """The next event the router sent. The receiver-side framing check: what the router
        sends is whole, valid frames, so one the decoder skips (5.x ``Malformed``) or a type it
        never sends (2.12 ``Unknown``) fails the test: a frame cut into another, say."""
        while True:
            ev = self.decoder.next_event()
            if ev is not None:
                if isinstance(ev, (j5.Malformed, j2.Unknown)):
                    raise AssertionError(f"framing violation in the router's stream: {ev}")
                return ev
            await self._fill(timeout)

    async def recv_until_closed(self, timeout: float = 5.0) -> list[E]:
        """Every event until the router closes the connection."""
        out: list[E] = []
        try:
            while True:
                out.append(await self.recv(timeout))
        except EOFError:
            return out

    async def send_eof(self) -> None:
        """Half-close (FIN), as a client process that exits does."""
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


class J2Client(_Client[j2.ClientEvent]):
    """A JGroups 2.12 RouterStub's wire behaviour."""

    decoder: j2.ClientDecoder
    version = V2

    def _decoder(self) -> j2.ClientDecoder:
        return j2.ClientDecoder(max_frame=BIG)

    async def connect(
        self,
        group: str | None,
        addr: JAddress | None,
        name: str | None = None,
        physical: list[JAddress] | None = None,
    ) -> j2.ConnectReply:
        self.decoder.expect_connect_reply()
        await self.send_raw(j2.connect(group, addr, name, physical))
        ev = await self.recv()
        assert isinstance(ev, j2.ConnectReply), ev
        return ev

    async def join(self, group: str, addr: JAddress, name: str) -> None:
        await self.connect(group, addr, name)

    async def gossip_get(self, group: str | None) -> tuple[j2.Member, ...]:
        self.decoder.expect_members_reply()
        await self.send_raw(j2.gossip_get(group))
        while True:
            ev = await self.recv()
            if isinstance(ev, j2.MembersReply):
                return ev.members

    async def round_trip(self) -> list[j2.ClientEvent]:
        """A GOSSIP_GET for a group nobody uses; the events that came before its reply."""
        self.decoder.expect_members_reply()
        await self.send_raw(j2.gossip_get(ROUND_TRIP_GROUP))
        before: list[j2.ClientEvent] = []
        while not isinstance(ev := await self.recv(), j2.MembersReply):
            before.append(ev)
        return before

    async def settle(self) -> None:
        await self.round_trip()

    async def disconnect(self, group: str, addr: JAddress) -> None:
        await self.send_raw(j2.disconnect(group, addr))
        while True:
            if isinstance(await self.recv(), j2.DisconnectOk):
                return

    async def message(self, group: str | None, dest: JAddress | None, payload: bytes) -> None:
        await self.send_raw(j2.message(group, dest, payload))


class J5Client(_Client[j5.Event]):
    """A JGroups 5.x RouterStub's wire behaviour."""

    version = V5

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.close_marker = False

    def _decoder(self) -> j5.Decoder:
        return j5.Decoder(max_frame=BIG)

    async def recv(self, timeout: float = 5.0) -> j5.Event:
        ev = await super().recv(timeout)
        if isinstance(ev, j5.CloseMarker):
            self.close_marker = True
        return ev

    async def register(
        self, group: str | None, addr: JAddress | None, name: str | None = None,
        physical: JAddress | None = None,
    ) -> None:
        await self.send_raw(j5.register(group, addr, name, physical))

    async def join(self, group: str, addr: JAddress, name: str) -> None:
        await self.register(group, addr, name)

    async def unregister(self, group: str, addr: JAddress) -> None:
        await self.send_raw(j5.unregister(group, addr))

    async def get_members(self, group: str | None) -> list[j5.MembersReply]:
        """GET_MBRS; the replies up to the first GET_MBRS_RSP (per group) or the LAST one."""
        await self.send_raw(j5.get_members(group))
        out: list[j5.MembersReply] = []
        while True:
            ev = await self.recv()
            if isinstance(ev, j5.MembersReply):
                out.append(ev)
                if ev.last or group is not None:
                    return out

    async def message(
        self, group: str | None, dest: JAddress | None, sender: JAddress | None, payload: bytes
    ) -> bytes:
        frame = j5.message(group, dest, sender, payload)
        await self.send_raw(frame)
        return frame

    async def round_trip(self) -> list[j5.Event]:
        """A HEARTBEAT and its echo; the events that came before the echo."""
        await self.send_raw(j5.heartbeat())
        before: list[j5.Event] = []
        while not isinstance(ev := await self.recv(), j5.Heartbeat):
            before.append(ev)
        return before

    async def sync(self) -> None:
        """A HEARTBEAT and its echo: everything sent before it has been processed."""
        await self.send_raw(j5.heartbeat())
        while True:
            if isinstance(await self.recv(), j5.Heartbeat):
                return

    async def settle(self) -> None:
        await self.sync()


# --------------------------------------------------------------------------- capture replay


@dataclass(frozen=True)
class Step:
    """One line of a capture log: ``data`` on ``conn`` in ``direction``; ``b""`` is a FIN."""

    conn: str
    direction: str
    data: bytes


def load_steps(name: str) -> list[Step]:
    """The lines of a capture log, FINs included (``tests/jgroups_captures`` leaves them out)."""
    steps = []
    for line in (CAPTURES / name).read_text().splitlines():
        parts = line.split()
        if len(parts) < 4 or "ERR" in parts[1:3]:
            continue
        data = bytes.fromhex(parts[4]) if len(parts) > 4 else b""
        steps.append(Step(parts[1], parts[2], data))
    return steps


async def replay(
    host: str,
    port: int,
    steps: list[Step],
    *,
    wait_on: Collection[str] | None = None,
    settled: Callable[[int], bool] | None = None,
    timeout: float = 20.0,
) -> dict[str, bytes]:
    """Play the client side of ``steps`` against the router at ``host:port``, in log order and
    with the log's segmentation, keeping the capture's causality by work done, not by time.

    After each client segment, the replay waits until every connection in ``wait_on`` (default:
    all of them) has received at least as many bytes as the real router had sent it by that
    point of the log (the server segments up to the next client segment), or has been closed;
    a connection the real router closed by then must be closed too (whatever ``wait_on``).
    So a later segment, possibly on another connection, never overtakes a reply the capture
    shows came first. Connections where our router deliberately sends other bytes than the
    capture are left out of ``wait_on`` by the test. Where the log shows no reply to wait for
    (a JGroups 5.x registration has none), ``settled(i)``, if given, is polled after client
    step ``i`` (its index in ``steps``) until it holds: the test checks the router's state.
    ``timeout`` bounds only a failure, never a pass.

    Returns what each connection received, until the router closed it or the replay ended.
    """
    streams: dict[str, trio.SocketStream] = {}
    got: dict[str, bytearray] = {}
    closed: set[str] = set()
    owed: dict[str, int] = {}  # bytes the real router had sent each connection so far
    shut: set[str] = set()  # connections the real router had closed so far
    changed = trio.Event()

    def notify() -> None:
        nonlocal changed
        changed.set()
        changed = trio.Event()

    async def reader(conn: str, s: trio.SocketStream) -> None:
        try:
            while True:
                data = await s.receive_some(1 << 16)
                if not data:
                    return
                got[conn] += data
                notify()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            closed.add(conn)
            notify()

    def caught_up() -> bool:
        return shut <= closed and all(
            conn in closed or len(got.get(conn, b"")) >= n
            for conn, n in owed.items()
            if wait_on is None or conn in wait_on
        )

    async with trio.open_nursery() as nursery:
        for i, step in enumerate(steps):
            if step.direction != "C>S":
                continue
            s = streams.get(step.conn)
            if s is None:
                s = streams[step.conn] = await trio.open_tcp_stream(host, port)
                got[step.conn] = bytearray()
                nursery.start_soon(reader, step.conn, s)
            if step.data:
                await s.send_all(step.data)
            else:
                await s.send_eof()
            for later in steps[i + 1 :]:
                if later.direction == "C>S":
                    break
                owed[later.conn] = owed.get(later.conn, 0) + len(later.data)
                if not later.data:
                    shut.add(later.conn)
            with trio.fail_after(timeout):
                while not caught_up():
                    await changed.wait()
                if settled is not None:
                    while not settled(i):
                        await trio.sleep(0.001)
        # The capture's last replies have arrived (waited for above): nothing more is owed.
        for s in streams.values():
            await s.aclose()
    return {conn: bytes(b) for conn, b in got.items()}


class _Table(Protocol):
    def entry(self, group: str, addr: bytes) -> object | None: ...


def j5_registrations_settled(table: _Table, steps: list[Step]) -> Callable[[int], bool]:
    """For :func:`replay` of a 5.x capture: ``settled(i)`` holds once the router's table shows
    the REGISTERs and UNREGISTERs of client step ``i`` (they have no reply to wait for), so a
    later segment on another connection cannot overtake them. What to look for comes from
    decoding the capture's own client segments."""
    decoders: dict[str, j5.Decoder] = {}
    due: dict[int, dict[tuple[str, bytes], bool]] = {}
    for i, st in enumerate(steps):
        if st.direction != "C>S" or not st.data:
            continue
        dec = decoders.setdefault(st.conn, j5.Decoder())
        dec.feed(st.data)
        while (ev := dec.next_event()) is not None:
            if isinstance(ev, j5.Register | j5.Unregister) and ev.group and ev.addr:
                due.setdefault(i, {})[ev.group, ev.addr.key] = isinstance(ev, j5.Register)

    def settled(i: int) -> bool:
        return all(
            (table.entry(f"jgroups5:{g}", key) is not None) == present
            for (g, key), present in due.get(i, {}).items()
        )

    return settled


def capture_streams(steps: list[Step]) -> dict[str, bytes]:
    """What the real router sent to each connection in the capture."""
    out: dict[str, bytearray] = {}
    for st in steps:
        if st.direction == "S>C":
            out.setdefault(st.conn, bytearray()).extend(st.data)
    return {conn: bytes(b) for conn, b in out.items()}


__all__ = [
    "V2",
    "V5",
    "J2Client",
    "J5Client",
    "JAddress",
    "Step",
    "capture_streams",
    "ip",
    "j5_registrations_settled",
    "load_steps",
    "replay",
    "uuid",
]


# --------------------------------------------------------------------------- against a router


async def j2_client(router: Server) -> J2Client:
    """A 2.12 client connected to the in-process ``router`` (not registered)."""
    assert router.address is not None
    return await J2Client.open(*router.address)


async def j5_client(router: Server) -> J5Client:
    """A 5.x client connected to the in-process ``router`` (not registered)."""
    assert router.address is not None
    return await J5Client.open(*router.address)


async def settle() -> None:
    """Let the in-process router handle everything already sent."""
    await trio.testing.wait_all_tasks_blocked(0.01)


async def j5_member(router: Server, group: str, addr: JAddress, name: str) -> J5Client:
    """A 5.x client registered as ``addr`` (logical name ``name``) in ``group``."""
    c = await j5_client(router)
    await c.register(group, addr, name, ip(7800, V5))
    await c.sync()
    return c


async def j2_member(router: Server, group: str, addr: JAddress, name: str) -> J2Client:
    """A 2.12 client connected as ``addr`` (logical name ``name``) to ``group``."""
    c = await j2_client(router)
    assert (await c.connect(group, addr, name, [ip(7800, V2)])).ok
    return c
