"""RouterStub: the trio client library applications use to talk to gossiprouters.

One :class:`RouterStub` keeps **one** TCP connection per router (the shared
transport) and carries any number of :class:`Channel` objects over it: a
channel is one logical address registered in one group. The stub

* sends ``HELLO`` on every new connection and ``CONNECT`` for every channel,
  in the order the channels were created, before anything else goes out on
  that connection, so a router restart is invisible to the application;
* reconnects a broken connection with exponential backoff and full jitter
  (never a tight loop, JGRP-2266), and notices a hung router with
  application-level heartbeats (JGRP-2633): every received frame counts as
  life, and a connection silent for ``heartbeat_timeout`` is dropped;
* with several routers, registers with all of them, sends each message
  through one healthy router (``policy``), failing over to the next on a write
  error, receives from all, and merges member lists and membership events;
* matches every request (``req``) to its OK/ERROR and turns an ERROR into a
  typed :class:`RouterError` subclass.

Receive buffers are bounded and **drop the oldest** entry when full (counted
in :attr:`Channel.dropped`): the reader of a shared connection must never
wait for one slow application task, or heartbeats would stall and every other
channel would starve. ``docs/stub.md`` describes the behaviour in prose; the
wire protocol is ``docs/protocol.md``.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import random
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import trio

from gossiprouter.addresses import format_hostport, parse_hostport
from gossiprouter.ops.tls import wrap_client
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.topics import TopicId, matches, pattern, topic_id

log = logging.getLogger("gossiprouter.stub")

__all__ = [
    "AddressInUseError",
    "Channel",
    "ChannelClosedError",
    "ConnectionLostError",
    "ConnectionState",
    "EventStream",
    "ForbiddenError",
    "FrameTooLargeError",
    "GroupEvent",
    "LimitError",
    "Member",
    "Message",
    "ModeError",
    "NotConnectedError",
    "NotMemberError",
    "Publication",
    "RequestTimeoutError",
    "RouterError",
    "RouterStatus",
    "RouterStub",
    "StubError",
    "StubEvent",
    "StubStats",
    "UnknownDestinationError",
    "Watch",
    "describe_error",
    "parse_router",
]

RouterAddress = tuple[str, int]
Physical = tuple[tuple[str, int], ...]
Mode = Literal["relay", "discovery"]
Policy = Literal["random", "round-robin"]

CLIENT_NAME = "gossiprouter-stub/python"
RECV_SIZE = 256 * 1024
# Suspects for the same (group, addr) arriving within this window (one per
# router, typically milliseconds apart) are delivered once.
SUSPECT_DEDUPE_WINDOW = 5.0
# Error codes after which the router closes the connection (docs/protocol.md).
_CLOSING_CODES = frozenset({
    "protocol", "frame_too_large", "unsupported_version", "unauthorized", "idle_timeout",
    "slow_consumer", "shutting_down", "limit",
})

T = TypeVar("T")


# --------------------------------------------------------------------------- exceptions


class StubError(Exception):
    """Base class of every error the stub raises."""


class RouterError(StubError):
    """The router refused a request with ERROR ``code``; subclasses name the common codes."""

    def __init__(self, code: str, message: str, router: RouterAddress | None = None) -> None:
        where = f" (router {router[0]}:{router[1]})" if router else ""
        super().__init__(f"{code}: {message}{where}")
        self.code = code
        self.message = message
        self.router = router


class NotMemberError(RouterError):
    """``not_member``: the address is not registered in that group on this connection."""


class ForbiddenError(RouterError):
    """``forbidden``: e.g. CONNECT in a JGroups namespace, or touching a provisioned member."""


class AddressInUseError(RouterError):
    """``address_in_use``: the address is held by another identity or a provisioned member."""


class LimitError(RouterError):
    """``limit``: too many groups/addresses on this connection (or connections on the router)."""


class UnknownDestinationError(RouterError):
    """``unknown_destination``: a unicast went to an address the router does not know."""


_ERROR_TYPES: dict[str, type[RouterError]] = {
    "not_member": NotMemberError,
    "forbidden": ForbiddenError,
    "address_in_use": AddressInUseError,
    "limit": LimitError,
    "unknown_destination": UnknownDestinationError,
}


def router_error(code: str, message: str, router: RouterAddress | None = None) -> RouterError:
    """The typed exception for an ERROR ``code``."""
    return _ERROR_TYPES.get(code, RouterError)(code, message, router)


class NotConnectedError(StubError):
    """No router connection was usable in time. ``routers`` is each router's status then,
    ``last_error`` the most recent reason a connection failed (None if none failed)."""

    def __init__(self, message: str, routers: Sequence[RouterStatus] = (),
                 last_error: str | None = None) -> None:
        super().__init__(message)
        self.routers = tuple(routers)
        self.last_error = last_error


class ConnectionLostError(StubError):
    """The connection carrying a request broke before the router answered it."""


class RequestTimeoutError(StubError, TimeoutError):
    """The router did not answer a request within ``request_timeout``."""


class ChannelClosedError(StubError):
    """The channel (or its stub) is closed: nothing more can be sent or received."""


class FrameTooLargeError(StubError, ValueError):
    """The message does not fit in one frame of the router's ``max_frame``."""


class ModeError(StubError):
    """The operation is not available in this stub's mode (e.g. send in discovery mode)."""


class _LinkDown(Exception):
    """Internal: the connection a write or request needed is gone."""


# --------------------------------------------------------------------------- public data


@dataclass(frozen=True, slots=True)
class Member:
    """A member of a group: logical address, logical name, physical addresses."""

    addr: bytes
    name: str | None = None
    physical: Physical = ()


@dataclass(frozen=True, slots=True)
class Message:
    """A message received by a channel. ``dest`` is None for a group multicast."""

    group: str
    sender: bytes
    dest: bytes | None
    payload: bytes
    # Arrival order within the stub (for Channel.incoming); not part of equality.
    seq: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Publication(Message):
    """A topic publication received by a channel (one of its patterns matched ``topic``).

    ``topic`` is the multicast id ``(provider, broadcast, partition)``; ``scope``
    is ``"local"`` or ``"global"``; ``dest`` is always None. A Publication is a
    Message, so it arrives in the channel's iterator in order with the rest.
    """

    topic: TopicId = ("", "", ())
    scope: str = "local"


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A membership event of ``group``.

    ``kind`` is ``join`` / ``leave`` (for watched groups, merged over every
    router: ``join`` when an address first appears on any router, ``leave``
    when it is gone from all), ``suspect`` (a member vanished without
    DISCONNECT; merged over routers) or ``refused`` (a router refused to
    re-register this channel after a reconnect; ``error`` says why).
    """

    group: str
    kind: str
    member: Member
    router: RouterAddress
    error: RouterError | None = None
    seq: int = field(default=0, compare=False, repr=False)


class ConnectionState(enum.Enum):
    """The state of the stub's connection to one router."""

    CONNECTING = "connecting"  # a connection attempt is under way
    CONNECTED = "connected"  # handshake done and every channel (re-)registered
    RECONNECTING = "reconnecting"  # down: waiting ``delay`` before the next attempt
    CLOSED = "closed"  # the stub is closed


@dataclass(frozen=True, slots=True)
class StubEvent:
    """A connection state change of one router.

    ``attempt`` counts connection attempts to that router since the stub
    started; ``error`` says why the connection failed or broke; ``delay`` is
    the backoff before the next attempt (RECONNECTING only).
    """

    router: RouterAddress
    state: ConnectionState
    attempt: int
    error: str | None = None
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class RouterStatus:
    """A snapshot of one router connection (:meth:`RouterStub.status`)."""

    router: RouterAddress
    state: ConnectionState
    attempts: int
    connections: int
    last_error: str | None
    router_id: str | None


@dataclass
class StubStats:
    """Counters for things the stub handled without telling anyone in particular."""

    undeliverable: int = 0  # routed frames for no local channel (e.g. just disconnected)
    bad_frames: int = 0  # undecodable frames from a router, dropped (JGRP-2721)
    events_merged: int = 0  # duplicate join/leave/suspect from several routers
    async_errors: dict[str, int] = field(default_factory=dict)  # ERROR without req, by code
    # Global publications dropped because another router of the same federation delivers them.
    federated_duplicates: int = 0


# --------------------------------------------------------------------------- bounded stream


class EventStream(Generic[T]):
    """A bounded FIFO read by the application; the stub never waits on it.

    When full, :meth:`_put` drops the **oldest** item and counts it in
    :attr:`dropped`. Iterate with ``async for`` (ends when the stream is
    closed and drained) or call :meth:`receive`.
    """

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError("buffer size must be at least 1")
        self._items: deque[T] = deque()
        self._maxlen = maxlen
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False
        self.dropped = 0

    def _put(self, item: T) -> None:
        if self._closed:
            return
        if len(self._items) >= self._maxlen:
            self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self._lot.unpark()

    def _close(self) -> None:
        self._closed = True
        self._lot.unpark_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    def receive_nowait(self) -> T:
        """The next item; trio.WouldBlock if none is buffered, ChannelClosedError after close."""
        if self._items:
            return self._items.popleft()
        if self._closed:
            raise ChannelClosedError("closed")
        raise trio.WouldBlock

    async def receive(self) -> T:
        """Wait for the next item; ChannelClosedError once closed and drained."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._items:
            if self._closed:
                raise ChannelClosedError("closed")
            await self._lot.park()
        item = self._items.popleft()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return item

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except ChannelClosedError:
            raise StopAsyncIteration from None


# --------------------------------------------------------------------------- helpers


def parse_router(value: str | tuple[str, int]) -> RouterAddress:
    """``("host", port)`` or ``"host:port"`` (``[v6]:port``) -> ``(host, port)``."""
    if not isinstance(value, str):
        try:
            host, port = value
        except (TypeError, ValueError):
            raise ValueError(f"router {value!r}: expected (host, port) or 'host:port'") from None
        if not isinstance(host, str) or not host or not isinstance(port, int) \
                or not 0 < port <= 65535:
            raise ValueError(f"router {value!r}: expected (host, port) with a port 1..65535")
        return host, port
    try:
        return parse_hostport(value)
    except ValueError as e:
        raise ValueError(f"router {value!r}: {e}") from None


def _fmt(router: RouterAddress) -> str:
    return format_hostport(*router)


def describe_error(e: BaseException) -> str:
    """A short lower-case reason for a failed connection ("connection refused", ...)."""
    if isinstance(e, trio.TooSlowError):
        return "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host ({e.strerror})"
    if isinstance(e, OSError) and e.errno is None and isinstance(e.__cause__, BaseExceptionGroup):
        # trio.open_tcp_stream wraps the per-address errors; the first one says it all.
        leaves = [x for x in e.__cause__.exceptions if isinstance(x, OSError)]
        if leaves:
            return describe_error(leaves[0])
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, trio.BrokenResourceError) and isinstance(e.__cause__, ssl.SSLError):
        return f"TLS handshake failed ({e.__cause__.reason or e.__cause__})"
    if isinstance(e, OSError) and e.strerror:
        s = e.strerror
        return s[:1].lower() + s[1:]
    return str(e) or type(e).__name__


def _check_group(group: str) -> None:
    if not isinstance(group, str) or not group:
        raise ValueError("group must be a non-empty string")
    if len(group.encode()) > wire.MAX_GROUP:
        raise ValueError(f"group longer than {wire.MAX_GROUP} bytes of UTF-8")


def _check_addr(addr: bytes, what: str = "addr") -> bytes:
    if not isinstance(addr, bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be bytes, got {type(addr).__name__}")
    b = bytes(addr)
    if len(b) > wire.MAX_ADDR:
        raise ValueError(f"{what} longer than {wire.MAX_ADDR} bytes")
    return b


def _physical(physical: Iterable[tuple[str, int] | str]) -> Physical:
    return tuple(parse_router(p) for p in physical)


# --------------------------------------------------------------------------- channel


Key = tuple[str, bytes]


class Channel:
    """One logical address registered in one group, over the stub's shared connections.

    Created by :meth:`RouterStub.connect`. ``async for msg in chan`` yields
    :class:`Message` objects until the channel is disconnected; membership
    events come separately from :meth:`events`.
    """

    def __init__(self, stub: RouterStub, group: str, addr: bytes, name: str | None,
                 physical: Physical, receive_buffer: int, event_buffer: int) -> None:
        self._stub = stub
        self.group = group
        self.addr = addr
        self.name = name
        self.physical = physical
        self._messages: EventStream[Message] = EventStream(receive_buffer)
        self._events: EventStream[GroupEvent] = EventStream(event_buffer)
        self._arrivals = trio.lowlevel.ParkingLot()  # wakes receive_any
        self._closed = False
        self._waiting = False  # connect() is waiting for the routers' answers
        # link -> None (accepted) or the router's refusal, for the connections it was sent on
        self._results: dict[_Link, RouterError | None] = {}
        # Topic patterns this channel subscribes to (re-sent after every reconnect), and
        # the refusals of pending subscribe() calls.
        self._patterns: set[TopicId] = set()
        self._sub_errors: dict[TopicId, RouterError] = {}

    def __repr__(self) -> str:
        return f"<Channel {self.group!r} {self.addr.hex()} {self.name or '-'}>"

    @property
    def key(self) -> Key:
        return self.group, self.addr

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dropped(self) -> int:
        """Messages dropped because the receive buffer was full (oldest first)."""
        return self._messages.dropped

    def member(self) -> Member:
        return Member(self.addr, self.name, self.physical)

    async def send(self, payload: bytes, dest: bytes | None = None) -> None:
        """Send ``payload`` to the group (``dest`` None) or to the member ``dest``.

        Goes through one connected router chosen by the stub's policy, failing
        over to the next on a write error. With no usable router it waits up to
        ``send_timeout`` for one, then raises :class:`NotConnectedError`; a
        message is never dropped silently by the stub. Returning means the
        bytes were handed to the operating system for the router.
        """
        if self._closed:
            raise ChannelClosedError(f"{self!r} is closed")
        if self._stub.mode == "discovery":
            raise ModeError("this stub is in discovery mode (TCPGOSSIP-style): routers are used "
                            "for registration and member lists only, not for sending")
        d = None if dest is None else _check_addr(dest, "dest")
        data = wire.encode_route(self.group, d, self.addr, bytes(payload))
        await self._stub._send(self, data)

    async def subscribe(self, provider: str, broadcast: str,
                        partition: Sequence[str] = ()) -> None:
        """Subscribe to topic publications matching the pattern (``+`` one level, ``*`` as
        the last partition element any number of levels; see docs/topics.md).

        Returns once every connected router accepted it; the pattern is re-subscribed
        after every reconnect. A pattern breaking the rules raises
        :class:`gossiprouter.topics.TopicError` (a ValueError) before anything is sent;
        a refusal (``bad_topic``, ``limit``, ``forbidden``) raises the typed RouterError.
        Subscribing twice to one pattern is harmless.
        """
        await self._stub._subscribe(self, pattern(provider, broadcast, tuple(partition)))

    async def unsubscribe(self, provider: str, broadcast: str,
                          partition: Sequence[str] = ()) -> None:
        """Stop receiving publications through this pattern (other patterns still apply)."""
        self._patterns.discard(pattern(provider, broadcast, tuple(partition)))
        self._stub._kick()
        await trio.lowlevel.checkpoint()

    @property
    def subscriptions(self) -> frozenset[TopicId]:
        return frozenset(self._patterns)

    async def publish(self, topic: tuple[str, str, Sequence[str]] | tuple[str, str],
                      payload: bytes, *, scope: Literal["local", "global"] = "local",
                      echo: bool = False) -> None:
        """Publish ``payload`` to the multicast id ``topic`` = (provider, broadcast[,
        partition]). ``scope="global"`` also reaches the subscribers of every router
        federated with this one. The publishing channel gets its own publication only
        with ``echo=True`` and a matching subscription. Same delivery promise as
        :meth:`send`."""
        if self._closed:
            raise ChannelClosedError(f"{self!r} is closed")
        if scope not in ("local", "global"):
            raise ValueError(f"scope {scope!r}: expected 'local' or 'global'")
        tid = topic_id(*topic)
        flags = (wire.PUB_GLOBAL if scope == "global" else 0) | (wire.PUB_ECHO if echo else 0)
        data = wire.encode_publish(self.group, self.addr, tid[0], tid[1], tid[2], flags,
                                   bytes(payload))
        await self._stub._send(self, data)

    async def receive(self) -> Message:
        """The next message; ChannelClosedError once disconnected and drained."""
        return await self._messages.receive()

    def receive_nowait(self) -> Message:
        """The next buffered message, or trio.WouldBlock."""
        return self._messages.receive_nowait()

    def __aiter__(self) -> Channel:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._messages.receive()
        except ChannelClosedError:
            raise StopAsyncIteration from None

    def events(self) -> EventStream[GroupEvent]:
        """This channel's membership events (``suspect``; ``join``/``leave`` when the stub
        watches the group; ``refused``). The same bounded stream on every call."""
        return self._events

    async def receive_any(self) -> Message | GroupEvent:
        """The next message *or* event, in the order they arrived (both streams share one
        sequence); ChannelClosedError once disconnected and drained. Use either this or
        :meth:`receive` / :meth:`events`, not both."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            msgs, evs = self._messages._items, self._events._items
            if msgs or evs:
                item: Message | GroupEvent
                if msgs and (not evs or msgs[0].seq < evs[0].seq):
                    item = msgs.popleft()
                else:
                    item = evs.popleft()
                await trio.lowlevel.cancel_shielded_checkpoint()
                return item
            if self._closed:
                raise ChannelClosedError(f"{self!r} is closed")
            await self._arrivals.park()

    async def incoming(self) -> AsyncIterator[Message | GroupEvent]:
        """``async for item in chan.incoming()``: messages and events in arrival order."""
        while True:
            try:
                yield await self.receive_any()
            except ChannelClosedError:
                return

    async def members(self) -> list[Member]:
        """The group's members: the union over every connected router."""
        return await self._stub.members(self.group)

    async def disconnect(self) -> None:
        """Leave the group (DISCONNECT on every router) and end the receive streams."""
        await self._stub._disconnect(self)

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.disconnect()

    def _put_message(self, msg: Message) -> None:
        self._messages._put(msg)
        self._arrivals.unpark_all()

    def _put_event(self, ev: GroupEvent) -> None:
        self._events._put(ev)
        self._arrivals.unpark_all()

    def _close(self) -> None:
        self._closed = True
        self._messages._close()
        self._events._close()
        self._arrivals.unpark_all()


class Watch(EventStream[GroupEvent]):
    """``join``/``leave`` events of a watched group, merged over every router.

    Created by :meth:`RouterStub.watch`; :meth:`aclose` (or leaving its
    ``async with``) stops watching once no other Watch of the group is open.
    """

    def __init__(self, stub: RouterStub, group: str, maxlen: int) -> None:
        super().__init__(maxlen)
        self._stub = stub
        self.group = group

    async def aclose(self) -> None:
        self._stub._unwatch(self)
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


# --------------------------------------------------------------------------- connections


class _Pending:
    __slots__ = ("event", "parts", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: wire.Ok | StubError | None = None
        # The members of the OK parts received so far (a list longer than one frame).
        self.parts: list[wire.MemberInfo] = []

    def set(self, result: wire.Ok | StubError) -> None:
        if self.result is None:
            self.result = result
            self.event.set()

    def ok(self, f: wire.Ok) -> None:
        """One OK frame: a part of a member list (``more``), or the answer, whole or last."""
        if f.members is not None and (f.more or self.parts):
            self.parts += f.members
            if f.more:
                return
            f = wire.Ok(f.req, tuple(self.parts))
            self.parts = []
        self.set(f)


@dataclass
class _Op:
    """One request the registrar sends to bring a connection in line with the stub."""

    frame: wire.Connect | wire.Disconnect | wire.Watch | wire.Unwatch | wire.Subscribe \
        | wire.Unsubscribe
    on_written: Callable[[], None]
    on_result: Callable[[wire.Ok | StubError], None]


def _nothing() -> None:
    pass


def _ignore(result: wire.Ok | StubError) -> None:
    pass


def _left(link: _Link, ch: Channel, result: wire.Ok | StubError) -> None:
    link.leaving.discard(ch)


class _Link:
    """One live TCP connection to a router (a new object for every reconnect)."""

    def __init__(self, transport: _Transport, stream: trio.abc.Stream, welcome: wire.Welcome,
                 decoder: wire.Decoder, write_timeout: float, raw: trio.SocketStream) -> None:
        self.transport = transport
        self.router = transport.address
        self.stream = stream  # the TLS stream over ``raw``, or ``raw`` itself
        self.raw = raw
        self.welcome = welcome
        settings = welcome.settings
        mf = settings.get("max_frame")
        self.max_frame = mf if isinstance(mf, int) and mf > 0 else wire.DEFAULT_MAX_FRAME
        hb = settings.get("heartbeat_ms")
        self.router_heartbeat = hb / 1000 if isinstance(hb, int) and hb > 0 else 0.0
        idle = settings.get("idle_timeout_ms")
        self.router_idle = idle / 1000 if isinstance(idle, int) and idle > 0 else 0.0
        self.decoder = decoder
        decoder.max_frame = self.max_frame
        self.write_timeout = write_timeout
        self.lock = trio.Lock()
        self.scope = trio.CancelScope()
        self.dead = False
        self.ready = False
        self.error: str | None = None
        self.farewell: str | None = None  # a connection-closing ERROR the router sent
        self.last_recv = trio.current_time()
        self.pending: dict[int, _Pending] = {}
        # What this connection has registered, kept in step with the stub by the registrar.
        self.registered: dict[Key, Channel] = {}
        self.routable: set[Channel] = set()  # CONNECT written: ROUTE frames may follow
        self.refused: dict[Key, Channel] = {}
        self.leaving: set[Channel] = set()
        self.watching: set[str] = set()
        self.watch_acked: set[str] = set()
        # Topic patterns sent (SUBSCRIBE written) and accepted, per channel.
        self.subscribed: dict[Key, set[TopicId]] = {}
        self.sub_acked: dict[Key, set[TopicId]] = {}
        self.kick = trio.Event()
        self.wake = trio.Event()
        self.pongs: list[int] = []

    def __repr__(self) -> str:
        return f"<link {_fmt(self.router)}>"

    def kill(self, reason: str) -> None:
        """Declare the connection dead: abort its tasks and any blocked read or write."""
        if self.dead:
            return
        self.dead = True
        self.ready = False
        self.error = self.farewell or reason
        log.info("connection to %s lost: %s", _fmt(self.router), self.error)
        self.scope.cancel()
        # Closing the socket wakes a task blocked in send_all/receive_some at once.
        self.raw.socket.close()
        lost = ConnectionLostError(f"connection to {_fmt(self.router)} lost: {self.error}")
        for p in self.pending.values():
            p.set(lost)

    async def write(self, data: bytes) -> None:
        """Write whole frames. The write itself is shielded (a cancelled half-written frame
        would corrupt the stream) and bounded by ``write_timeout`` (a router that stopped
        reading is dead)."""
        if self.dead:
            raise _LinkDown(self.error)
        async with self.lock:
            if self.dead:
                raise _LinkDown(self.error)
            with trio.CancelScope(shield=True), trio.move_on_after(self.write_timeout) as cs:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    self.kill(f"write failed: {describe_error(e)}")
                    raise _LinkDown(self.error) from None
            if cs.cancelled_caught:
                self.kill(f"write blocked for {self.write_timeout:g}s")
                raise _LinkDown(self.error)


class _Transport:
    """Everything the stub keeps about one router across reconnects."""

    def __init__(self, address: RouterAddress) -> None:
        self.address = address
        self.state = ConnectionState.CONNECTING
        self.link: _Link | None = None
        self.attempts = 0
        self.failures = 0
        self.connections = 0
        self.last_error: str | None = None
        self.router_id: str | None = None
        # When the current attempt sent HELLO (None before that): a peer that accepts
        # TCP but never answers is named as such when the caller stops waiting.
        self.hello_sent_at: float | None = None

    def status(self) -> RouterStatus:
        return RouterStatus(self.address, self.state, self.attempts, self.connections,
                            self.last_error, self.router_id)


class _HandshakeError(Exception):
    pass


FOREIGN = "does not speak the gossiprouter protocol"


def _foreign(got: bytes | str) -> _HandshakeError:
    """The peer answered HELLO with something else than a gossiprouter would."""
    if isinstance(got, str):
        return _HandshakeError(f"{FOREIGN} ({got})")
    if got[:1] in (b"\x15", b"\x16") and got[1:2] == b"\x03":
        return _HandshakeError(f"{FOREIGN} (got a TLS record: the port expects TLS)")
    line = got[:48].split(b"\n", 1)[0].rstrip(b"\r")
    if line and all(32 <= c < 127 for c in line):
        more = "..." if len(line) < len(got) else ""
        return _HandshakeError(f"{FOREIGN} (got {line.decode()!r}{more})")
    return _HandshakeError(f"{FOREIGN} (got bytes {got[:16].hex(' ')}"
                           f"{' ...' if len(got) > 16 else ''})")


def _peer_error(address: RouterAddress, error: str) -> str:
    """``the peer at H:P does not speak ...`` or ``H:P: connection refused``."""
    if error.startswith(FOREIGN):
        return f"the peer at {_fmt(address)} {error}"
    return f"{_fmt(address)}: {error}"


# --------------------------------------------------------------------------- the stub


class RouterStub:
    """A client of one or more gossiprouters: shared transport, reconnect, failover.

    Use as ``async with RouterStub([("127.0.0.1", 12001)]) as stub:``; entering
    starts connecting to every router in the background (TCP + HELLO; no
    group is joined yet) and returns at once.

    Args:
        routers: ``(host, port)`` tuples or ``"host:port"`` strings.
        mode: ``"relay"`` (TUNNEL-style: messages are routed through the
            routers) or ``"discovery"`` (TCPGOSSIP-style: CONNECT only to be
            listed, GET_MEMBERS to list; :meth:`Channel.send` raises ModeError).
        policy: which connected router carries each message: ``"random"`` or
            ``"round-robin"``; on a write error the next one is tried.
        connect_timeout: bound on TCP connect + HELLO/WELCOME, per attempt.
        request_timeout: how long to wait for the OK/ERROR of a request.
        send_timeout: how long send / connect / members / watch wait for a
            connected router before raising :class:`NotConnectedError`.
        reconnect_initial, reconnect_max: the backoff between connection
            attempts to one router: attempt *n* (from 0) waits a uniformly random
            time in ``[0, min(reconnect_max, reconnect_initial * 2**n)]`` (full
            jitter, so restarted routers are not stormed).
        reconnect_reset: a connection that stayed up this long resets *n* to 0;
            one that breaks sooner keeps growing the backoff (a router that
            accepts and drops at once is not hammered).
        heartbeat_interval: PING every connection this often (never less often
            than the router's ``heartbeat_ms``); 0 disables.
        heartbeat_timeout: a connection from which nothing was received for this
            long is dropped and reconnected (half-open detection); 0 disables.
            Must exceed ``heartbeat_interval``.
        receive_buffer: messages buffered per channel; when full the oldest is
            dropped and counted in :attr:`Channel.dropped`.
        event_buffer: events buffered per channel, per watch and per
            :meth:`state_changes` stream (oldest dropped when full).
        client_name, token: sent in HELLO. A router that refuses the token
            (ERROR ``unauthorized``) is retried with the usual backoff (its
            tokens file may be reloaded); sends meanwhile raise
            :class:`NotConnectedError` naming the refusal.
        ssl_context: connect with TLS using this context (see
            :func:`gossiprouter.ops.tls.client_context`; give it a client
            certificate for mutual TLS). None: plain TCP.
        server_hostname: the name the router's certificate must be valid for
            (default: the host connected to).
        on_state: called (in the trio thread, must not block) with every
            :class:`StubEvent`.
    """

    def __init__(
        self,
        routers: Sequence[str | tuple[str, int]],
        *,
        mode: Mode = "relay",
        policy: Policy = "random",
        connect_timeout: float = 3.0,
        request_timeout: float = 5.0,
        send_timeout: float = 5.0,
        reconnect_initial: float = 0.5,
        reconnect_max: float = 30.0,
        reconnect_reset: float = 30.0,
        heartbeat_interval: float = 5.0,
        heartbeat_timeout: float = 15.0,
        receive_buffer: int = 1024,
        event_buffer: int = 256,
        client_name: str = CLIENT_NAME,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        on_state: Callable[[StubEvent], None] | None = None,
    ) -> None:
        if isinstance(routers, str):
            routers = [r.strip() for r in routers.split(",")]
        addrs = [parse_router(r) for r in routers]
        if not addrs:
            raise ValueError("at least one router is needed")
        if len(set(addrs)) != len(addrs):
            raise ValueError("a router is listed twice")
        if mode not in ("relay", "discovery"):
            raise ValueError(f"mode {mode!r}: expected 'relay' or 'discovery'")
        if policy not in ("random", "round-robin"):
            raise ValueError(f"policy {policy!r}: expected 'random' or 'round-robin'")
        for name, value in (("connect_timeout", connect_timeout),
                            ("request_timeout", request_timeout),
                            ("send_timeout", send_timeout),
                            ("reconnect_max", reconnect_max)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0")
        for name, value in (("reconnect_initial", reconnect_initial),
                            ("reconnect_reset", reconnect_reset),
                            ("heartbeat_interval", heartbeat_interval),
                            ("heartbeat_timeout", heartbeat_timeout)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0")
        if heartbeat_timeout and heartbeat_timeout <= heartbeat_interval:
            raise ValueError("heartbeat_timeout must be greater than heartbeat_interval")
        if heartbeat_timeout and not heartbeat_interval:
            # Without PINGs an idle but healthy connection would look dead.
            raise ValueError("heartbeat_timeout needs heartbeat_interval > 0")
        self.routers: tuple[RouterAddress, ...] = tuple(addrs)
        self.mode: Mode = mode
        self.policy: Policy = policy
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.send_timeout = send_timeout
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.reconnect_reset = reconnect_reset
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.receive_buffer = receive_buffer
        self.event_buffer = event_buffer
        self.client_name = client_name
        self.token = token
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.on_state = on_state
        self.stats = StubStats()

        self._transports = [_Transport(a) for a in addrs]
        # The desired state, in creation order; each connection's registrar follows it.
        self._channels: dict[Key, Channel] = {}
        self._by_group: dict[str, list[Channel]] = {}
        self._watchers: dict[str, list[Watch]] = {}
        self._presence: dict[str, dict[bytes, set[RouterAddress]]] = {}
        self._suspected: dict[Key, float] = {}
        self._state_streams: list[EventStream[StubEvent]] = []
        self._req = itertools.count(1)
        self._nonce = itertools.count(1)
        self._seq = itertools.count(1)
        self._rr = itertools.count()
        self._changed = trio.Event()
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None
        self._scope = trio.CancelScope()
        self._closed = False
        self._write_timeout = heartbeat_timeout if heartbeat_timeout > 0 else 30.0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> RouterStub:
        if self._nursery is not None or self._closed:
            raise RuntimeError("a RouterStub can be entered once")
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._supervise)
        return self

    async def _supervise(self) -> None:
        # The internal tasks live in their own cancel scope: closing the stub must not
        # cancel the application code running in the body of ``async with``.
        with self._scope:
            async with trio.open_nursery() as n:
                for t in self._transports:
                    n.start_soon(self._run_transport, t)

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        if et is None and not self._closed:
            try:
                await self._leave_all()
            except BaseException as e:
                self._stop()
                await self._exit_nursery(e)
                raise
        self._stop()
        await self._exit_nursery(ev)

    async def _exit_nursery(self, ev: BaseException | None) -> None:
        # The internal nursery would wrap the application's own exception (say a
        # ForbiddenError raised inside the ``async with``) in an ExceptionGroup;
        # hand it back unwrapped, as if there were no nursery.
        try:
            await self._nursery_cm.__aexit__(
                None if ev is None else type(ev), ev, None if ev is None else ev.__traceback__)
        except BaseExceptionGroup as eg:
            if ev is not None and len(eg.exceptions) == 1 and eg.exceptions[0] is ev:
                raise ev from ev.__cause__
            raise

    async def aclose(self) -> None:
        """Leave every group (DISCONNECT, bounded), close every connection, end all streams.
        Leaving the ``async with`` block does the same."""
        if self._closed:
            return
        await self._leave_all()
        self._stop()

    async def _leave_all(self) -> None:
        # A clean DISCONNECT lets the other members see ``leave`` instead of ``suspect``.
        for ch in list(self._channels.values()):
            self._remove_channel(ch)
        for ws in list(self._watchers.values()):
            for w in ws:
                w._close()
        self._watchers.clear()
        self._kick()
        with trio.move_on_after(min(self.request_timeout, 2.0)):
            while True:
                changed = self._changed
                busy = [lk for lk in self._links() if lk.registered or lk.leaving]
                if not busy:
                    break
                await changed.wait()

    def _stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._scope.cancel()
        for t in self._transports:
            if t.link is not None:
                t.link.kill("stub closed")
            self._emit(t, ConnectionState.CLOSED)
        for ch in list(self._channels.values()):
            self._remove_channel(ch)
        for ws in self._watchers.values():
            for w in ws:
                w._close()
        for s in self._state_streams:
            s._close()
        self._bump()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError("the RouterStub is closed")
        if self._nursery is None:
            raise RuntimeError("use the RouterStub in 'async with' first")

    # ------------------------------------------------------------------ observing

    def status(self) -> list[RouterStatus]:
        """One :class:`RouterStatus` per router, in the order given."""
        return [t.status() for t in self._transports]

    def state_changes(self) -> EventStream[StubEvent]:
        """A new stream of every :class:`StubEvent` from now on (bounded; oldest dropped)."""
        s: EventStream[StubEvent] = EventStream(self.event_buffer)
        if self._closed:
            s._close()
        else:
            self._state_streams.append(s)
        return s

    async def wait_connected(self, timeout: float | None = None, *, fail_fast: bool = False,
                             all_routers: bool = False) -> None:
        """Wait until a router (every router with ``all_routers``) is CONNECTED.

        Raises :class:`NotConnectedError` after ``timeout`` (default
        ``send_timeout``). With ``fail_fast`` (command-line tools) it does not
        wait for routers that have already failed an attempt: it raises as soon
        as every router has failed once and none is connected, and with
        ``all_routers`` it returns once every router is connected or has failed.
        """
        self._check_open()
        deadline = trio.current_time() + (self.send_timeout if timeout is None else timeout)
        while True:
            changed = self._changed
            up = [t for t in self._transports if t.state is ConnectionState.CONNECTED]
            if (all_routers and len(up) == len(self._transports)) or (not all_routers and up):
                return
            down = [t for t in self._transports if t not in up]
            if fail_fast and all(t.failures for t in down):
                if up:
                    return
                raise self._not_connected(None)
            if trio.current_time() >= deadline:
                raise self._not_connected(timeout if timeout is not None else self.send_timeout)
            with trio.move_on_at(deadline):
                await changed.wait()

    def _not_connected(self, waited: float | None) -> NotConnectedError:
        down = [t for t in self._transports if t.state is not ConnectionState.CONNECTED]
        why = [_peer_error(t.address, t.last_error or self._pending_error(t)) for t in down]
        if len(down) == 1:
            msg = why[0] if why[0].startswith("the peer at") else f"cannot reach router at {why[0]}"
        else:
            msg = "cannot reach any router (" + "; ".join(why) + ")"
        if waited is not None and not msg.startswith("the peer at"):
            msg = f"no router connection within {waited:g}s: {msg}"
        errors = [t.last_error for t in down if t.last_error]
        return NotConnectedError(msg, self.status(), errors[-1] if errors else None)

    def _pending_error(self, t: _Transport) -> str:
        """Why a router whose first attempt is still under way is not connected."""
        if t.hello_sent_at is None:
            return "not connected yet"
        waited = trio.current_time() - t.hello_sent_at
        return f"{FOREIGN} (got no reply to HELLO in {waited:.1f}s)"

    # ------------------------------------------------------------------ groups

    async def connect(
        self,
        group: str,
        addr: bytes,
        *,
        name: str | None = None,
        physical: Iterable[tuple[str, int] | str] = (),
        wait: bool = True,
    ) -> Channel:
        """Register ``addr`` in ``group`` on every router and return its :class:`Channel`.

        With ``wait`` (default) this returns once every connected router has
        answered and at least one accepted; a refusal raises the typed
        :class:`RouterError` (and the registration is withdrawn everywhere);
        with no router connected within ``send_timeout`` it raises
        :class:`NotConnectedError`. With ``wait=False`` it returns at once and
        the channel is registered whenever a router connects; refusals then
        arrive as ``refused`` events.
        """
        self._check_open()
        _check_group(group)
        a = _check_addr(addr)
        if name is not None and not isinstance(name, str):
            raise TypeError("name must be a string or None")
        key = (group, a)
        if key in self._channels:
            raise ValueError(f"this stub already has a channel for {a.hex()} in {group!r}")
        ch = Channel(self, group, a, name, _physical(physical), self.receive_buffer,
                     self.event_buffer)
        self._channels[key] = ch
        self._by_group.setdefault(group, []).append(ch)
        self._kick()
        if not wait:
            return ch
        ch._waiting = True
        deadline = trio.current_time() + self.send_timeout
        try:
            while True:
                changed = self._changed
                refusals = [r for r in ch._results.values() if r is not None]
                if refusals:
                    raise refusals[0]
                ok = [lk for lk, r in ch._results.items() if r is None and not lk.dead]
                ready = [lk for lk in self._links() if lk.ready]
                if ok and all(lk in ch._results for lk in ready):
                    return ch
                if trio.current_time() >= deadline:
                    if ok:
                        return ch
                    if ready:
                        raise RequestTimeoutError(
                            f"no answer to CONNECT {group!r} within {self.send_timeout:g}s")
                    raise self._not_connected(self.send_timeout)
                with trio.move_on_at(deadline):
                    await changed.wait()
        except BaseException:
            self._remove_channel(ch)
            self._kick()
            raise
        finally:
            ch._waiting = False
            ch._results.clear()

    async def _disconnect(self, ch: Channel) -> None:
        if ch._closed:
            await trio.lowlevel.checkpoint()
            return
        self._remove_channel(ch)
        self._kick()
        # Bounded wait for the DISCONNECTs: the member is gone locally either way.
        with trio.move_on_after(self.request_timeout):
            while True:
                changed = self._changed
                if not any(lk.registered.get(ch.key) is ch or ch in lk.leaving
                           for lk in self._links()):
                    return
                await changed.wait()

    def _remove_channel(self, ch: Channel) -> None:
        if self._channels.get(ch.key) is ch:
            del self._channels[ch.key]
        chans = self._by_group.get(ch.group)
        if chans is not None and ch in chans:
            chans.remove(ch)
            if not chans:
                del self._by_group[ch.group]
        ch._close()

    def channels(self) -> list[Channel]:
        """The open channels, in creation order."""
        return list(self._channels.values())

    async def members(self, group: str) -> list[Member]:
        """GET_MEMBERS on every connected router; the union, deduplicated by address.

        Works without joining the group (TCPGOSSIP-style discovery) and for
        the JGroups namespaces (``jgroups2:``/``jgroups5:``). Routers that fail
        are skipped as long as one answers.
        """
        self._check_open()
        _check_group(group)
        links = await self._wait_ready(trio.current_time() + self.send_timeout)
        answers: list[wire.Ok | StubError] = []

        async def ask(lk: _Link) -> None:
            answers.append(await self._request(lk, wire.GetMembers(next(self._req), group)))

        async with trio.open_nursery() as n:
            for lk in links:
                n.start_soon(ask, lk)
        seen: dict[bytes, Member] = {}
        errors: list[StubError] = []
        for a in answers:
            if isinstance(a, StubError):
                errors.append(a)
                continue
            for m in a.members or ():
                if m.addr not in seen:
                    seen[m.addr] = Member(m.addr, m.name, m.physical)
        if errors and len(errors) == len(answers):
            raise next((e for e in errors if isinstance(e, RouterError)), errors[0])
        return list(seen.values())

    async def watch(self, group: str) -> Watch:
        """WATCH ``group`` on every router: a :class:`Watch` stream of ``join``/``leave``.

        The stub need not be a member. Channels of the group also receive the
        events while a Watch is open. WATCH is re-sent after every reconnect.
        """
        self._check_open()
        _check_group(group)
        w = Watch(self, group, self.event_buffer)
        self._watchers.setdefault(group, []).append(w)
        self._kick()
        deadline = trio.current_time() + self.send_timeout
        try:
            while True:
                changed = self._changed
                ready = [lk for lk in self._links() if lk.ready]
                if ready and all(group in lk.watch_acked for lk in ready):
                    return w
                if trio.current_time() >= deadline:
                    if any(group in lk.watch_acked for lk in ready):
                        return w
                    if ready:
                        raise RequestTimeoutError(
                            f"no answer to WATCH {group!r} within {self.send_timeout:g}s")
                    raise self._not_connected(self.send_timeout)
                with trio.move_on_at(deadline):
                    await changed.wait()
        except BaseException:
            self._unwatch(w)
            raise

    def _unwatch(self, w: Watch) -> None:
        w._close()
        ws = self._watchers.get(w.group)
        if ws is not None and w in ws:
            ws.remove(w)
            if not ws:
                del self._watchers[w.group]
                self._presence.pop(w.group, None)
                self._kick()

    # ------------------------------------------------------------------ sending

    def _links(self) -> list[_Link]:
        return [t.link for t in self._transports if t.link is not None and not t.link.dead]

    async def _wait_ready(self, deadline: float) -> list[_Link]:
        while True:
            changed = self._changed
            ready = [lk for lk in self._links() if lk.ready]
            if ready:
                return ready
            if trio.current_time() >= deadline:
                raise self._not_connected(self.send_timeout)
            with trio.move_on_at(deadline):
                await changed.wait()

    def _order(self, links: list[_Link]) -> list[_Link]:
        if len(links) < 2:
            return links
        if self.policy == "round-robin":
            i = next(self._rr) % len(links)
            return links[i:] + links[:i]
        links = links[:]
        random.shuffle(links)
        return links

    async def _send(self, ch: Channel, data: bytes) -> None:
        self._check_open()
        deadline = trio.current_time() + self.send_timeout
        last_error: str | None = None
        while True:
            changed = self._changed
            if ch._closed:
                raise ChannelClosedError(f"{ch!r} is closed")
            candidates = [lk for lk in self._links() if lk.ready and ch in lk.routable]
            for lk in self._order(candidates):
                if len(data) - 4 > lk.max_frame:
                    raise FrameTooLargeError(
                        f"message of {len(data) - 4} bytes exceeds the router's max_frame "
                        f"{lk.max_frame}")
                try:
                    await lk.write(data)
                    return
                except _LinkDown as e:
                    # Fail over: try the next connected router at once.
                    last_error = f"{_fmt(lk.router)}: {e}"
            if trio.current_time() >= deadline:
                err = self._not_connected(self.send_timeout)
                if last_error and err.last_error is None:
                    err.last_error = last_error
                raise err
            with trio.move_on_at(deadline):
                await changed.wait()

    # ------------------------------------------------------------------ internals: signals

    def _bump(self) -> None:
        """Wake everything waiting for a change of connection or registration state."""
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def _kick(self) -> None:
        """Ask every connection's registrar to compare itself with the desired state."""
        for lk in self._links():
            lk.kick.set()

    def _emit(self, t: _Transport, state: ConnectionState, error: str | None = None,
              delay: float | None = None) -> None:
        if self._closed and state is not ConnectionState.CLOSED:
            return  # a transport task still unwinding after close()
        t.state = state
        ev = StubEvent(t.address, state, t.attempts, error, delay)
        if self.on_state is not None:
            try:
                self.on_state(ev)
            except Exception:
                log.exception("on_state callback failed")
        for s in self._state_streams:
            s._put(ev)
        self._bump()

    # ------------------------------------------------------------------ internals: connections

    def _backoff(self, n: int) -> float:
        cap = min(self.reconnect_max, self.reconnect_initial * 2.0 ** min(n, 62))
        return random.uniform(0.0, cap)

    async def _run_transport(self, t: _Transport) -> None:
        n = 0  # consecutive failures, for the backoff
        while True:
            t.attempts += 1
            self._emit(t, ConnectionState.CONNECTING)
            try:
                link = await self._open_link(t)
            except (OSError, trio.TooSlowError, _HandshakeError, trio.BrokenResourceError) as e:
                t.failures += 1
                t.last_error = describe_error(e) if not isinstance(e, _HandshakeError) else str(e)
                log.debug("cannot connect to %s: %s", _fmt(t.address), t.last_error)
            else:
                started = trio.current_time()
                await self._run_link(t, link)
                t.last_error = link.error
                if trio.current_time() - started >= self.reconnect_reset:
                    n = 0
            delay = self._backoff(n)
            n += 1
            self._emit(t, ConnectionState.RECONNECTING, t.last_error, delay)
            await trio.sleep(delay)

    async def _open_link(self, t: _Transport) -> _Link:
        host, port = t.address
        t.hello_sent_at = None
        with trio.fail_after(self.connect_timeout):
            raw = await trio.open_tcp_stream(host, port)
            stream: trio.abc.Stream = raw
            try:
                if self.ssl_context is not None:
                    stream = await wrap_client(raw, self.ssl_context,
                                               self.server_hostname or host)
                hello = wire.encode(wire.Hello(wire.SUPPORTED_VERSIONS, self.client_name,
                                               self.token))
                await stream.send_all(wire.PREAMBLE + hello)
                t.hello_sent_at = trio.current_time()
                decoder = wire.Decoder(max_frame=64 * 1024)
                got = b""  # the start of the reply, to show a peer that is no router
                while True:
                    try:
                        f = decoder.next_frame()
                    except Exception:
                        raise _foreign(got) from None
                    if f is None:
                        data = await stream.receive_some(RECV_SIZE)
                        if not data:
                            if got:
                                raise _foreign(got)
                            # A gossiprouter may close at once too: its allow-list, or TLS.
                            raise _HandshakeError("closed the connection without answering "
                                                  "HELLO (not a gossiprouter, or one that "
                                                  "refuses this client or expects TLS)")
                        got += data[: 64 - len(got)]
                        decoder.feed(data)
                        continue
                    if isinstance(f, wire.Welcome):
                        break
                    if isinstance(f, wire.Error):
                        raise _HandshakeError(f"router refused HELLO: {f.code}: {f.message}")
                    raise _foreign(f"got {type(f).__name__} instead of WELCOME")
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
        t.router_id = f.router_id
        t.hello_sent_at = None
        return _Link(t, stream, f, decoder, self._write_timeout, raw)

    async def _run_link(self, t: _Transport, link: _Link) -> None:
        t.link = link
        try:
            with link.scope:
                async with trio.open_nursery() as n:
                    n.start_soon(self._reader, link)
                    n.start_soon(self._heartbeat, link)
                    n.start_soon(self._registrar, link)
        finally:
            link.kill(link.error or "closed")
            t.link = None
            self._forget_presence(t.address)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(link.stream)
            self._bump()

    async def _reader(self, link: _Link) -> None:
        dec = link.decoder
        stream = link.stream
        while True:
            while True:
                try:
                    f = dec.next_frame()
                except ProtocolError as e:
                    if e.code == "frame_too_large":
                        link.kill(f"router sent an unframed stream: {e}")
                        return
                    self.stats.bad_frames += 1
                    log.warning("dropping a bad frame from %s: %s", _fmt(link.router), e)
                    continue
                if f is None:
                    break
                self._dispatch(link, f)
            try:
                data = await stream.receive_some(RECV_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                link.kill(f"connection broken: {describe_error(e)}")
                return
            if not data:
                link.kill("router closed the connection")
                return
            link.last_recv = trio.current_time()
            dec.feed(data)

    async def _heartbeat(self, link: _Link) -> None:
        interval = self.heartbeat_interval
        if interval > 0 and link.router_heartbeat > 0:
            # Never ping less often than the router asks, or its idle timeout would close us.
            interval = min(interval, link.router_heartbeat)
        if interval > 0 and link.router_idle > 0:
            # Nor less than twice per idle timeout, whatever heartbeat_ms says.
            interval = min(interval, link.router_idle / 2)
        timeout = self.heartbeat_timeout
        next_ping = trio.current_time() + interval if interval > 0 else math.inf
        try:
            while True:
                link.wake = trio.Event()
                now = trio.current_time()
                if timeout > 0 and now - link.last_recv >= timeout:
                    link.kill(f"nothing received for {timeout:g}s (heartbeat timeout)")
                    return
                if link.pongs:
                    pongs, link.pongs = link.pongs, []
                    await link.write(b"".join(wire.encode(wire.Pong(x)) for x in pongs))
                if now >= next_ping:
                    await link.write(wire.encode(wire.Ping(next(self._nonce))))
                    next_ping = now + interval
                wake_at = min(next_ping, link.last_recv + timeout if timeout > 0 else math.inf)
                with trio.move_on_at(wake_at):
                    await link.wake.wait()
        except _LinkDown:
            return

    async def _registrar(self, link: _Link) -> None:
        """Keep this connection's registrations equal to the stub's channels and watches.

        On a new connection the first pass re-sends CONNECT for every channel
        (creation order) and WATCH for every watched group; only when it is
        done does the connection become CONNECTED and carry ROUTE frames.
        """
        t = link.transport
        try:
            while True:
                link.kick = trio.Event()
                ops = self._plan(link)
                if ops:
                    await self._run_ops(link, ops)
                    self._bump()
                    continue
                if not link.ready:
                    link.ready = True
                    t.connections += 1
                    t.last_error = None
                    log.info("connected to %s (%s)", _fmt(t.address), link.welcome.router_id)
                    self._emit(t, ConnectionState.CONNECTED)
                await link.kick.wait()
        except _LinkDown:
            return

    def _plan(self, link: _Link) -> list[_Op]:
        ops: list[_Op] = []
        for key, ch in list(link.registered.items()):
            if key not in self._channels:
                del link.registered[key]
                link.routable.discard(ch)
                link.leaving.add(ch)
                ops.append(_Op(wire.Disconnect(next(self._req), ch.group, ch.addr), _nothing,
                               partial(_left, link, ch)))
        for key, ch in list(link.refused.items()):
            if self._channels.get(key) is not ch:
                del link.refused[key]
        for g in sorted(link.watching - self._watchers.keys()):
            link.watching.discard(g)
            link.watch_acked.discard(g)
            ops.append(_Op(wire.Unwatch(next(self._req), g), _nothing, _ignore))
        for key, ch in self._channels.items():
            if link.registered.get(key) is not ch and link.refused.get(key) is not ch:
                link.registered[key] = ch
                ops.append(_Op(
                    wire.Connect(next(self._req), ch.group, ch.addr, ch.name, ch.physical),
                    partial(link.routable.add, ch),
                    partial(self._connect_result, link, key, ch),
                ))
        for g in self._watchers:
            if g not in link.watching:
                link.watching.add(g)
                ops.append(_Op(wire.Watch(next(self._req), g), _nothing,
                               partial(self._watch_result, link, g)))
        ops += self._plan_topics(link)
        return ops

    def _plan_topics(self, link: _Link) -> list[_Op]:
        """SUBSCRIBE / UNSUBSCRIBE so this connection holds each channel's patterns. After
        the CONNECTs in the same batch, so a new connection re-subscribes every channel."""
        ops: list[_Op] = []
        for key in [k for k in link.subscribed if link.registered.get(k) is None]:
            del link.subscribed[key]  # DISCONNECT (or refusal) dropped them on the router
            link.sub_acked.pop(key, None)
        for key, ch in link.registered.items():
            sent = link.subscribed.setdefault(key, set())
            for pat in sorted(sent - ch._patterns):
                sent.discard(pat)
                link.sub_acked.get(key, set()).discard(pat)
                ops.append(_Op(wire.Unsubscribe(next(self._req), ch.group, ch.addr, *pat),
                               _nothing, _ignore))
            for pat in sorted(ch._patterns - sent):
                sent.add(pat)
                ops.append(_Op(wire.Subscribe(next(self._req), ch.group, ch.addr, *pat),
                               _nothing, partial(self._subscribe_result, link, ch, pat)))
        return ops

    def _subscribe_result(self, link: _Link, ch: Channel, pat: TopicId,
                          r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok):
            link.sub_acked.setdefault(ch.key, set()).add(pat)
            return
        if not isinstance(r, RouterError):
            return  # lost connection or timeout: the next connection re-subscribes
        link.subscribed.get(ch.key, set()).discard(pat)
        ch._patterns.discard(pat)
        ch._sub_errors[pat] = r
        log.warning("%s refused a subscription of %r: %s", _fmt(link.router), ch, r)

    async def _subscribe(self, ch: Channel, pat: TopicId) -> None:
        if ch._closed:
            raise ChannelClosedError(f"{ch!r} is closed")
        if self.mode == "discovery":
            raise ModeError("topics need a relay-mode stub")
        ch._sub_errors.pop(pat, None)
        ch._patterns.add(pat)
        self._kick()
        deadline = trio.current_time() + self.send_timeout
        while True:
            changed = self._changed
            err = ch._sub_errors.pop(pat, None)
            if err is not None:
                # Withdrawn everywhere, like a refused CONNECT.
                self._kick()
                raise err
            ready = [lk for lk in self._links() if lk.ready and ch.key in lk.registered]
            acked = [lk for lk in ready if pat in lk.sub_acked.get(ch.key, ())]
            if ready and len(acked) == len(ready):
                return
            if trio.current_time() >= deadline:
                if acked:
                    return
                ch._patterns.discard(pat)
                self._kick()
                if ready:
                    raise RequestTimeoutError(
                        f"no answer to SUBSCRIBE within {self.send_timeout:g}s")
                raise self._not_connected(self.send_timeout)
            with trio.move_on_at(deadline):
                await changed.wait()

    def _connect_result(self, link: _Link, key: Key, ch: Channel,
                        r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok):
            if ch._waiting:
                ch._results[link] = None
            return
        if not isinstance(r, RouterError):
            return  # timeout or lost connection: the heartbeat / reconnect deals with it
        if link.registered.get(key) is ch:
            del link.registered[key]
        link.routable.discard(ch)
        link.refused[key] = ch
        if ch._waiting:
            ch._results[link] = r
        elif not ch._closed:
            log.warning("%s refused %r: %s", _fmt(link.router), ch, r)
            ch._put_event(GroupEvent(ch.group, "refused", ch.member(), link.router, r,
                                     next(self._seq)))

    def _watch_result(self, link: _Link, group: str, r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok) and group in link.watching:
            link.watch_acked.add(group)

    async def _run_ops(self, link: _Link, ops: list[_Op]) -> None:
        """Write the requests in one go (order kept), then wait for every answer."""
        pendings: list[tuple[_Op, _Pending]] = []
        for op in ops:
            p = _Pending()
            link.pending[op.frame.req] = p
            pendings.append((op, p))
        try:
            await link.write(b"".join(wire.encode(op.frame) for op in ops))
            for op in ops:
                op.on_written()
            with trio.move_on_after(self.request_timeout):
                for _, p in pendings:
                    await p.event.wait()
        finally:
            for op in ops:
                link.pending.pop(op.frame.req, None)
        for op, p in pendings:
            op.on_result(p.result if p.result is not None else RequestTimeoutError(
                f"no answer from {_fmt(link.router)} within {self.request_timeout:g}s"))

    async def _request(self, link: _Link, frame: wire.GetMembers) -> wire.Ok | StubError:
        p = _Pending()
        link.pending[frame.req] = p
        try:
            try:
                await link.write(wire.encode(frame))
            except _LinkDown as e:
                return ConnectionLostError(f"connection to {_fmt(link.router)} lost: {e}")
            with trio.move_on_after(self.request_timeout):
                await p.event.wait()
        finally:
            link.pending.pop(frame.req, None)
        if p.result is None:
            return RequestTimeoutError(
                f"no answer from {_fmt(link.router)} within {self.request_timeout:g}s")
        return p.result

    # ------------------------------------------------------------------ internals: receiving

    def _dispatch(self, link: _Link, f: wire.Frame) -> None:
        """Hand one received frame on. Never waits: the reader serves every channel."""
        match f:
            case wire.Route(group, dest, sender, payload):
                msg = Message(group, sender, dest, payload, next(self._seq))
                if dest is None:
                    # One copy per connection: every local channel of the group but the sender.
                    delivered = False
                    for ch in self._by_group.get(group, ()):
                        if ch.addr != sender:
                            ch._put_message(msg)
                            delivered = True
                    if not delivered:
                        self.stats.undeliverable += 1
                else:
                    target = self._channels.get((group, dest))
                    if target is None:
                        self.stats.undeliverable += 1
                    else:
                        target._put_message(msg)
            case wire.Publish(group, sender, provider, broadcast, partition, flags, payload):
                if flags & wire.PUB_GLOBAL and not self._global_source(link):
                    self.stats.federated_duplicates += 1
                    return
                tid = (provider, broadcast, partition)
                echo = bool(flags & wire.PUB_ECHO)
                pub = Publication(group, sender, None, payload, next(self._seq), tid,
                                  "global" if flags & wire.PUB_GLOBAL else "local")
                # One copy per connection: every local channel whose patterns match.
                got = False
                for ch in self._by_group.get(group, ()):
                    if (ch.addr != sender or echo) and any(matches(p, tid)
                                                           for p in ch._patterns):
                        ch._put_message(pub)
                        got = True
                if not got:
                    self.stats.undeliverable += 1
            case wire.Ok(req):
                p = link.pending.get(req)
                if p is not None:
                    p.ok(f)
            case wire.Error(req, code, message):
                p = None if req is None else link.pending.get(req)
                if p is not None:
                    p.set(router_error(code, message, link.router))
                elif code in _CLOSING_CODES:
                    # The router closes the connection next; remember why.
                    link.farewell = f"router closed the connection: {code}: {message}"
                else:
                    counts = self.stats.async_errors
                    counts[code] = counts.get(code, 0) + 1
                    log.warning("router %s: %s: %s", _fmt(link.router), code, message)
            case wire.Ping(nonce):
                link.pongs.append(nonce)
                link.wake.set()
            case wire.Pong():
                pass  # last_recv is already updated: every frame counts as life
            case wire.Event():
                self._on_event(link, f)
            case _:
                self.stats.bad_frames += 1
                log.warning("unexpected %s from %s", type(f).__name__, _fmt(link.router))

    def _global_source(self, link: _Link) -> bool:
        """Whether global publications are taken from ``link``.

        Routers of one federation (same ``federation`` in WELCOME) each deliver every
        global publication, so a stub on several of them takes those from one only: the
        first connected one in the order the routers were given. Local publications, and
        routers outside any federation, are always taken.
        """
        fed = link.welcome.settings.get("federation")
        if not fed:
            return True
        for t in self._transports:
            lk = t.link
            if lk is not None and lk.ready and not lk.dead \
                    and lk.welcome.settings.get("federation") == fed:
                return lk is link
        return True

    def _on_event(self, link: _Link, f: wire.Event) -> None:
        member = Member(f.addr, f.name, f.physical)
        router = link.router
        if f.kind == "suspect":
            now = trio.current_time()
            key = (f.group, f.addr)
            last = self._suspected.get(key)
            if last is not None and now - last < SUSPECT_DEDUPE_WINDOW:
                self.stats.events_merged += 1
                return
            if len(self._suspected) > 1000:
                self._suspected = {k: v for k, v in self._suspected.items()
                                   if now - v < SUSPECT_DEDUPE_WINDOW}
            self._suspected[key] = now
            ev = GroupEvent(f.group, "suspect", member, router, seq=next(self._seq))
            for ch in self._by_group.get(f.group, ()):
                if ch.addr != f.addr:
                    ch._put_event(ev)
            return
        # join / leave go to watchers only; merge them over the routers.
        if f.group not in self._watchers:
            return
        presence = self._presence.setdefault(f.group, {})
        where = presence.setdefault(f.addr, set())
        if f.kind == "join":
            first = not where
            where.add(router)
            if not first:
                self.stats.events_merged += 1
                return
        else:
            where.discard(router)
            if where:
                self.stats.events_merged += 1
                return
            del presence[f.addr]
        ev = GroupEvent(f.group, f.kind, member, router, seq=next(self._seq))
        for w in self._watchers.get(f.group, ()):
            w._put(ev)
        for ch in self._by_group.get(f.group, ()):
            if ch.addr != f.addr:
                ch._put_event(ev)

    def _forget_presence(self, router: RouterAddress) -> None:
        # What a lost connection told us is no longer known; drop it silently.
        for presence in self._presence.values():
            for addr in [a for a, where in presence.items() if router in where]:
                presence[addr].discard(router)
                if not presence[addr]:
                    del presence[addr]
