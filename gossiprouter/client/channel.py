"""One logical address registered in one group: :class:`Channel`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Literal, Protocol

from anyio.lowlevel import checkpoint

from gossiprouter.client.errors import ChannelClosedError, ModeError, RouterError
from gossiprouter.client.model import (
    GroupEvent,
    Key,
    Member,
    Message,
    Mode,
    Physical,
    _check_addr,
)
from gossiprouter.client.streams import EventStream, Waiters
from gossiprouter.core.topics import TopicId, pattern, topic_id
from gossiprouter.protocol import native as wire

# A Channel is made by the stub and registered by its connections, which sit above this
# module; what it needs of them is declared here, so that it imports nothing above it.


class ChannelOwner(Protocol):
    """What a :class:`Channel` asks of the stub that made it (:class:`RouterStub` is one):
    its mode, and the calls a channel hands on to it."""

    @property
    def mode(self) -> Mode: ...

    async def members(self, group: str) -> list[Member]: ...

    async def _send(self, ch: Channel, data: bytes) -> None: ...

    async def _subscribe(self, ch: Channel, pat: TopicId) -> None: ...

    async def _disconnect(self, ch: Channel) -> None: ...

    def _wake_registrars(self) -> None: ...


class Carrier(Protocol):
    """A connection that answered this channel's CONNECT (a
    :class:`~gossiprouter.client.connection.Connection`): what the stub reads of it."""

    @property
    def dead(self) -> bool: ...


class Channel:
    """One logical address registered in one group, over the stub's shared connections.

    Created by :meth:`RouterStub.connect`. ``async for msg in chan`` yields
    :class:`Message` objects until the channel is disconnected; membership
    events come separately from :meth:`events`.
    """

    def __init__(self, stub: ChannelOwner, group: str, addr: bytes, name: str | None,
                 physical: Physical, receive_buffer: int, event_buffer: int) -> None:
        self._stub = stub
        self.group = group
        self.addr = addr
        self.name = name
        self.physical = physical
        self._messages: EventStream[Message] = EventStream(receive_buffer)
        self._events: EventStream[GroupEvent] = EventStream(event_buffer)
        self._arrivals = Waiters()  # wakes receive_any
        self._closed = False
        self._waiting = False  # connect() is waiting for the routers' answers
        # link -> None (accepted) or the router's refusal, for the connections it was sent on
        self._results: dict[Carrier, RouterError | None] = {}
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
        :class:`gossiprouter.core.topics.TopicError` (a ValueError) before anything is sent;
        a refusal (``bad_topic``, ``limit``, ``forbidden``) raises the typed RouterError.
        Subscribing twice to one pattern is harmless.
        """
        await self._stub._subscribe(self, pattern(provider, broadcast, tuple(partition)))

    async def unsubscribe(self, provider: str, broadcast: str,
                          partition: Sequence[str] = ()) -> None:
        """Stop receiving publications through this pattern (other patterns still apply)."""
        self._patterns.discard(pattern(provider, broadcast, tuple(partition)))
        self._stub._wake_registrars()
        await checkpoint()

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
        """The next buffered message, or :class:`~gossiprouter.client.streams.WouldBlock`
        (an ``anyio.WouldBlock``; a ``trio.WouldBlock`` too under trio)."""
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
        await checkpoint()  # before anything is taken: see EventStream.receive
        while True:
            msgs, evs = self._messages._items, self._events._items
            if msgs or evs:
                if msgs and (not evs or msgs[0].seq < evs[0].seq):
                    return msgs.popleft()
                return evs.popleft()
            if self._closed:
                raise ChannelClosedError(f"{self!r} is closed")
            await self._arrivals.event().wait()

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
        self._arrivals.wake()

    def _put_event(self, ev: GroupEvent) -> None:
        self._events._put(ev)
        self._arrivals.wake()

    def _close(self) -> None:
        self._closed = True
        self._messages._close()
        self._events._close()
        self._arrivals.wake()
