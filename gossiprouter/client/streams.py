"""Bounded streams the application reads: :class:`EventStream` and :class:`Watch`.

The stub never waits on a stream: a full stream drops its oldest item (counted).
They run on whichever loop runs the stub (AnyIO: asyncio or trio).
"""

from __future__ import annotations

import sys
from collections import deque
from types import TracebackType
from typing import Generic, Protocol, TypeVar

import anyio
from anyio.lowlevel import checkpoint

from gossiprouter.client.errors import ChannelClosedError
from gossiprouter.client.model import GroupEvent

# --------------------------------------------------------------------------- bounded stream


class WouldBlock(anyio.WouldBlock):
    """Nothing is buffered (:meth:`EventStream.receive_nowait`). Where trio is loaded it is
    a ``trio.WouldBlock`` as well, as it was before the client ran on AnyIO."""


_trio_would_block: type[WouldBlock] | None = None


def would_block() -> WouldBlock:
    """The WouldBlock to raise: also a trio.WouldBlock if trio is loaded (never imported
    here: an asyncio application does not load trio)."""
    global _trio_would_block
    trio = sys.modules.get("trio")
    if trio is None:
        return WouldBlock()
    if _trio_would_block is None:
        _trio_would_block = type("WouldBlock", (WouldBlock, trio.WouldBlock),
                                 {"__module__": __name__, "__doc__": WouldBlock.__doc__})
    return _trio_would_block()


class Waiters:
    """Wakes the tasks waiting for "something changed"; costs nothing while nobody waits.

    The event is made only when a task waits (and needs a running loop then, not in
    ``__init__``), so a stream that is read faster than it is filled never allocates one.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def event(self) -> anyio.Event:
        """The event the next :meth:`wake` sets: take it *before* checking the condition."""
        ev = self._event
        if ev is None:
            ev = self._event = anyio.Event()
        return ev

    def wake(self) -> None:
        ev = self._event
        if ev is not None:
            self._event = None
            ev.set()


T = TypeVar("T")


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
        self._waiters = Waiters()
        self._closed = False
        self.dropped = 0

    def _put(self, item: T) -> None:
        if self._closed:
            return
        if len(self._items) >= self._maxlen:
            self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self._waiters.wake()

    def _close(self) -> None:
        self._closed = True
        self._waiters.wake()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    def receive_nowait(self) -> T:
        """The next item; :class:`WouldBlock` (an ``anyio.WouldBlock``, and a
        ``trio.WouldBlock`` under trio) if none is buffered, ChannelClosedError after close."""
        if self._items:
            return self._items.popleft()
        if self._closed:
            raise ChannelClosedError("closed")
        raise would_block()

    async def receive(self) -> T:
        """Wait for the next item; ChannelClosedError once closed and drained."""
        # One schedule point, before anything is taken: a cancelled receive loses no item,
        # and after a wake-up nothing can cancel between the wait and the pop.
        await checkpoint()
        while not self._items:
            if self._closed:
                raise ChannelClosedError("closed")
            await self._waiters.event().wait()
        return self._items.popleft()

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except ChannelClosedError:
            raise StopAsyncIteration from None



class WatchOwner(Protocol):
    """What a :class:`Watch` asks of the stub that made it (:class:`RouterStub` is one):
    declared here so that this module needs nothing above it."""

    def _unwatch(self, w: Watch) -> None: ...


class Watch(EventStream[GroupEvent]):
    """``join``/``leave`` events of a watched group, merged over every router.

    Created by :meth:`RouterStub.watch`; :meth:`aclose` (or leaving its
    ``async with``) stops watching once no other Watch of the group is open.
    """

    def __init__(self, stub: WatchOwner, group: str, maxlen: int) -> None:
        super().__init__(maxlen)
        self._stub = stub
        self.group = group

    async def aclose(self) -> None:
        self._stub._unwatch(self)
        await checkpoint()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


# --------------------------------------------------------------------------- connections
