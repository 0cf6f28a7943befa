"""A blocking facade over :class:`~gossiprouter.stub.RouterStub` for code that does not use trio.

The stub runs in its own trio event loop on a background thread; every
method here hands one operation to that loop with ``trio.from_thread.run``
and blocks the calling thread until it is done. The behaviour (reconnect,
heartbeats, failover, bounded buffers that drop the oldest entry) is the
trio stub's; only the calling convention changes::

    with BlockingRouterStub([("127.0.0.1", 12001)]) as stub:
        ch = stub.connect("demo", b"A", name="A")
        ch.send(b"hello")
        msg = ch.receive(timeout=5.0)        # TimeoutError if nothing arrives
        print(stub.members("demo"))

Methods may be called from any thread (not from inside a trio run), the
same object from several threads too; ``receive`` in one thread while
another thread sends is fine.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import trio

from gossiprouter.client.channel import Channel
from gossiprouter.client.errors import ChannelClosedError
from gossiprouter.client.front import RouterStub
from gossiprouter.client.model import GroupEvent, Member, Message
from gossiprouter.client.status import RouterStatus, StubEvent
from gossiprouter.client.streams import EventStream, Watch

__all__ = ["BlockingChannel", "BlockingRouterStub", "BlockingStream"]

T = TypeVar("T")
R = TypeVar("R")


async def _within(timeout: float | None, receive: Callable[[], Awaitable[T]]) -> T:
    """``await receive()``; TimeoutError after ``timeout`` seconds (None: no limit)."""
    if timeout is None:
        return await receive()
    with trio.move_on_after(timeout):
        return await receive()
    raise TimeoutError(f"nothing received within {timeout:g}s")


def _until_closed(receive: Callable[[], T]) -> Iterator[T]:
    """Iterate over ``receive()`` until the stream or channel is closed."""
    while True:
        try:
            yield receive()
        except ChannelClosedError:
            return


class _Portal:
    """Runs calls in the stub's trio thread."""

    def __init__(self) -> None:
        self.token: trio.lowlevel.TrioToken | None = None

    def run(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
        result: R = self._call(trio.from_thread.run, fn, *args)
        return result

    def run_sync(self, fn: Callable[..., R], *args: Any) -> R:
        result: R = self._call(trio.from_thread.run_sync, fn, *args)
        return result

    def _call(self, via: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> Any:
        if self.token is None:
            raise ChannelClosedError("the BlockingRouterStub is not open")
        try:
            return via(fn, *args, trio_token=self.token)
        except trio.RunFinishedError:
            raise ChannelClosedError("the BlockingRouterStub is closed") from None


class BlockingStream(Generic[T]):
    """A blocking view of an :class:`~gossiprouter.stub.EventStream` (events, state changes)."""

    def __init__(self, portal: _Portal, stream: EventStream[T]) -> None:
        self._portal = portal
        self._stream = stream

    @property
    def dropped(self) -> int:
        return self._stream.dropped

    def receive(self, timeout: float | None = None) -> T:
        """The next item; TimeoutError after ``timeout`` seconds, ChannelClosedError once closed."""
        item: T = self._portal.run(_within, timeout, self._stream.receive)
        return item

    def __iter__(self) -> Iterator[T]:
        return _until_closed(self.receive)

    def close(self) -> None:
        """Stop a :class:`~gossiprouter.stub.Watch` (UNWATCH); other streams just end."""
        stream = self._stream
        if isinstance(stream, Watch):
            self._portal.run(stream.aclose)
        else:
            self._portal.run_sync(stream._close)

    def __enter__(self) -> BlockingStream[T]:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class BlockingChannel:
    """A blocking :class:`~gossiprouter.stub.Channel`."""

    def __init__(self, portal: _Portal, channel: Channel) -> None:
        self._portal = portal
        self.channel = channel
        self._events = BlockingStream(portal, channel.events())

    def __repr__(self) -> str:
        return f"<Blocking{self.channel!r}>"

    @property
    def group(self) -> str:
        return self.channel.group

    @property
    def addr(self) -> bytes:
        return self.channel.addr

    @property
    def name(self) -> str | None:
        return self.channel.name

    @property
    def dropped(self) -> int:
        return self.channel.dropped

    def send(self, payload: bytes, dest: bytes | None = None) -> None:
        """See :meth:`Channel.send`: to the group, or to ``dest``."""
        self._portal.run(self.channel.send, payload, dest)

    def subscribe(self, provider: str, broadcast: str, partition: Sequence[str] = ()) -> None:
        """See :meth:`Channel.subscribe`; publications then arrive through :meth:`receive`
        as :class:`~gossiprouter.stub.Publication`."""
        self._portal.run(self.channel.subscribe, provider, broadcast, partition)

    def unsubscribe(self, provider: str, broadcast: str, partition: Sequence[str] = ()) -> None:
        self._portal.run(self.channel.unsubscribe, provider, broadcast, partition)

    def publish(self, topic: tuple[str, str, Sequence[str]] | tuple[str, str], payload: bytes,
                *, scope: Literal["local", "global"] = "local", echo: bool = False) -> None:
        """See :meth:`Channel.publish`."""
        self._portal.run(partial(self.channel.publish, topic, payload, scope=scope, echo=echo))

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; TimeoutError after ``timeout`` seconds (None: wait forever),
        ChannelClosedError once the channel is disconnected."""
        msg: Message = self._portal.run(_within, timeout, self.channel.receive)
        return msg

    def receive_any(self, timeout: float | None = None) -> Message | GroupEvent:
        """The next message or event, in arrival order (see :meth:`Channel.receive_any`)."""
        item: Message | GroupEvent = self._portal.run(_within, timeout, self.channel.receive_any)
        return item

    def __iter__(self) -> Iterator[Message]:
        return _until_closed(self.receive)

    def events(self) -> BlockingStream[GroupEvent]:
        return self._events

    def members(self) -> list[Member]:
        return self._portal.run(self.channel.members)

    def disconnect(self) -> None:
        self._portal.run(self.channel.disconnect)

    def __enter__(self) -> BlockingChannel:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.disconnect()


class BlockingRouterStub:
    """:class:`~gossiprouter.stub.RouterStub` for threads: same options, blocking methods.

    ``with BlockingRouterStub(routers, **options) as stub`` (or :meth:`open`
    and :meth:`close`) starts the trio thread; the options are
    :class:`RouterStub`'s. Closing leaves every group and joins the thread.
    """

    def __init__(self, routers: Sequence[str | tuple[str, int]], **options: Any) -> None:
        # Built here so a bad option raises in the caller's thread.
        self.stub = RouterStub(routers, **options)
        self._portal = _Portal()
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None

    def open(self) -> BlockingRouterStub:
        if self._thread is not None:
            raise RuntimeError("a BlockingRouterStub can be opened once")
        self._thread = threading.Thread(target=self._thread_main, name="gossiprouter-stub",
                                        daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # reported to open(); the thread must not die noisily
            self._error = e
        finally:
            self._portal.token = None
            self._started.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with self.stub:
            self._portal.token = trio.lowlevel.current_trio_token()
            self._started.set()
            await self._stop.wait()

    def close(self, timeout: float = 10.0) -> None:
        """Leave every group, close the connections, stop the thread (bounded by ``timeout``)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        stop = self._stop
        if stop is not None:
            with contextlib.suppress(ChannelClosedError):
                self._portal.run_sync(stop.set)
        thread.join(timeout)

    def __enter__(self) -> BlockingRouterStub:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def connect(self, group: str, addr: bytes, *, name: str | None = None,
                physical: Iterable[tuple[str, int] | str] = (),
                wait: bool = True) -> BlockingChannel:
        """See :meth:`RouterStub.connect`."""
        phys = list(physical)

        async def connect() -> Channel:
            return await self.stub.connect(group, addr, name=name, physical=phys, wait=wait)

        return BlockingChannel(self._portal, self._portal.run(connect))

    def members(self, group: str) -> list[Member]:
        """See :meth:`RouterStub.members`."""
        return self._portal.run(self.stub.members, group)

    def watch(self, group: str) -> BlockingStream[GroupEvent]:
        """See :meth:`RouterStub.watch`; ``close()`` the stream to stop watching."""
        w: Watch = self._portal.run(self.stub.watch, group)
        return BlockingStream(self._portal, w)

    def wait_connected(self, timeout: float | None = None, *, fail_fast: bool = False,
                       all_routers: bool = False) -> None:
        """See :meth:`RouterStub.wait_connected`."""

        async def wait() -> None:
            await self.stub.wait_connected(timeout, fail_fast=fail_fast, all_routers=all_routers)

        self._portal.run(wait)

    def status(self) -> list[RouterStatus]:
        return self._portal.run_sync(self.stub.status)

    def state_changes(self) -> BlockingStream[StubEvent]:
        return BlockingStream(self._portal, self._portal.run_sync(self.stub.state_changes))
