"""Bounded streams the application reads: :class:`EventStream` and :class:`Watch`.

The stub never waits on a stream: a full stream drops its oldest item (counted).
"""

from __future__ import annotations

from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

import trio

from gossiprouter.client.errors import ChannelClosedError
from gossiprouter.client.model import GroupEvent

if TYPE_CHECKING:
    from gossiprouter.client.front import RouterStub


# --------------------------------------------------------------------------- bounded stream


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
